"""Broken or unusual environments: the shim keeps the program running and says what it did.

GPU-only faults (a read-only JIT cache, eight processes racing one cold build) are in tests/gpu.
"""

from __future__ import annotations

import json
import multiprocessing

import flashinfer
import pytest
import torch
import torch._dynamo.testing

import fp4_dynamo_shim
from helpers import run_python

STATUS = "import json, fp4_dynamo_shim; print(json.dumps(fp4_dynamo_shim.status()))"


def test_without_nvcc_and_without_torch_cuda_apply_still_succeeds_and_says_so(tmp_path):
    # FlashInfer looks for nvcc only under $CUDA_HOME when it is set: point it at an empty directory.
    result = run_python(STATUS, env={"CUDA_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout.strip().splitlines()[-1])
    assert status["applied"]
    if torch.version.cuda is None:
        assert status["cuda_version"] == {"value": None, "source": "none", "nvcc": None, "nvcc_path": None}
        assert any("CUDA version" in line for line in status["skipped"])
    else:
        assert status["cuda_version"]["source"] == "torch"


def _apply_in_child(queue):
    import flashinfer as child_flashinfer

    import fp4_dynamo_shim as shim

    x = torch.randn(4, 64, dtype=torch.bfloat16)
    packed, _ = child_flashinfer.fp4_quantize(x, torch.tensor([1.0]))
    queue.put((shim.status()["applied"], tuple(packed.shape)))


@pytest.mark.slow
def test_eight_processes_applying_at_once_all_succeed():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_apply_in_child, args=(queue,)) for _ in range(8)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=600) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert results == [(True, (4, 32))] * 8
    assert all(process.exitcode == 0 for process in processes)


def test_revert_after_compiling_keeps_the_op_and_recompiles_through_the_original():
    x, scale = torch.randn(16, 64, dtype=torch.bfloat16), torch.tensor([1.0])

    def forward(t, s):
        return flashinfer.fp4_quantize(t, s)

    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(forward, fullgraph=True, backend=counter)
    before = compiled(x, scale)
    graph_module = torch._dynamo.export(forward)(x, scale).graph_module  # a graph made with the op
    assert fp4_dynamo_shim.revert()
    # Graphs already made keep calling the op, which stays registered and configured.
    assert all(torch.equal(a, b) for a, b in zip(graph_module(x, scale), before))
    # The compiled function guarded on the global it traced through: it recompiles, now through
    # FlashInfer's original, which fails under fullgraph (here already at its CUDA device check).
    with pytest.raises(torch._dynamo.exc.Unsupported, match="device must be a cuda device"):
        compiled(x, scale)
    assert counter.frame_count == 1  # the recompilation was attempted, and failed before counting


def test_flashinfer_own_custom_op_reaches_the_shim_without_recursion():
    try:
        op = torch.ops.flashinfer.fp4_quantize
    except (AttributeError, RuntimeError):
        pytest.skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (added in 0.6.12)")
    x, scale = torch.randn(8, 64, dtype=torch.bfloat16), torch.tensor([1.0])
    packed, sf = op(x, scale)
    expected = flashinfer.fp4_quantize(x, scale)
    assert torch.equal(packed, expected[0]) and torch.equal(sf.flatten()[: expected[1].numel()], expected[1].flatten())


def test_disable_variable_makes_the_import_a_no_op():
    result = run_python(STATUS + "; import flashinfer; print(getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False))",
                        env={"FP4_DYNAMO_SHIM_DISABLE": "1"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert json.loads(lines[-2])["applied"] is False and lines[-1] == "False"
