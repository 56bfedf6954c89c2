"""Broken or unusual environments: the shim keeps the program running and says what it did.

GPU-only faults (a read-only JIT cache, eight processes racing one cold build) are in tests/gpu.
"""

from __future__ import annotations

import json
import multiprocessing
import time

import flashinfer
import pytest
import torch
import torch._dynamo.testing

import fp4_dynamo_shim
import stand_in_gpu
from fp4_dynamo_shim.errors import ApplyError
from helpers import run_python

STATUS = "import json, fp4_dynamo_shim; print(json.dumps(fp4_dynamo_shim.status()))"


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_without_nvcc_and_without_torch_cuda_apply_still_succeeds_and_says_so(tmp_path):
    # FlashInfer looks for nvcc only under $CUDA_HOME when it is set: point it at an empty directory.
    result = run_python(STATUS, env={"CUDA_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout.strip().splitlines()[-1])
    assert status["applied"]
    if torch.version.cuda is None:
        assert status["cuda_version"] == {"value": None, "source": "none", "nvcc": None, "nvcc_path": None,
                                          "problem": None}
        assert any("CUDA version" in line for line in status["skipped"])
    else:
        assert status["cuda_version"]["source"] == "torch"


def _apply_in_child(queue):
    import flashinfer as child_flashinfer

    import fp4_dynamo_shim

    x = torch.randn(4, 64, dtype=torch.bfloat16)
    packed, _ = child_flashinfer.fp4_quantize(x, torch.tensor([1.0]))
    queue.put((fp4_dynamo_shim.status()["applied"], tuple(packed.shape)))


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


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_disable_variable_makes_the_import_a_no_op():
    result = run_python(STATUS + "; import flashinfer; print(getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False))",
                        env={"FP4_DYNAMO_SHIM_DISABLE": "1"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert json.loads(lines[-2])["applied"] is False and lines[-1] == "False"


# --- FlashInfer's JIT build failing in each way it can (stand-in SM100: tests/support/stand_in_gpu.py) -----------

class _Spec:
    """What FlashInfer's module generator returns, with a build that does what the test asks."""

    def __init__(self, build):
        self.build_and_load = build


def _build_with(stand_in_sm100, monkeypatch, build):
    module, _, apply = stand_in_sm100
    monkeypatch.setattr(module, "gen_fp4_quantization_sm100_module", lambda: _Spec(build))
    module.get_fp4_quantization_module.cache_clear()
    return module, apply


def _untouched():
    from flashinfer.jit import cpp_ext

    return flashinfer.fp4_quantize, cpp_ext.get_cuda_version, cpp_ext.is_cuda_version_at_least


def test_a_failing_jit_build_refuses_with_its_error_and_leaves_flashinfer_untouched(stand_in_sm100, applied_with,
                                                                                   monkeypatch):
    def fail():
        raise RuntimeError("ninja: build stopped: subcommand failed")

    _build_with(stand_in_sm100, monkeypatch, fail)
    before = _untouched()
    status = applied_with()
    assert not status["applied"] and "ninja: build stopped" in status["problem"]
    assert "FlashInfer was left untouched" in status["problem"] and _untouched() == before
    with pytest.raises(ApplyError, match="ninja: build stopped"):
        applied_with(STRICT="1")
    assert _untouched() == before


def test_a_jit_module_without_fp4_quantize_refuses_naming_what_it_has(stand_in_sm100, applied_with, monkeypatch):
    class Mismatched:  # a JIT cache built from other sources: the module loads, the entry is not there
        def fp4_quantize_renamed(self, *arguments):
            pass

    _build_with(stand_in_sm100, monkeypatch, Mismatched)
    before = _untouched()
    status = applied_with()
    assert not status["applied"] and "has no fp4_quantize entry" in status["problem"]
    assert "fp4_quantize_renamed" in status["problem"] and _untouched() == before


def test_a_slow_jit_build_is_waited_for_once_and_its_time_reported(stand_in_sm100, applied_with, monkeypatch):
    """No timeout is imposed on FlashInfer's build (a cold build legitimately takes minutes, and FlashInfer's own
    first call would wait as long): apply() waits, once, and status says how long. A build that never ends
    blocks apply() as it would block FlashInfer's first call; that case is not run here."""
    builds = []

    def slow():
        builds.append(time.perf_counter())
        time.sleep(1.0)
        return stand_in_gpu.RecordingModule()

    _build_with(stand_in_sm100, monkeypatch, slow)
    status = applied_with()
    assert status["applied"] and status["devices"][0]["load_seconds"] >= 1.0
    assert len(builds) == 1
