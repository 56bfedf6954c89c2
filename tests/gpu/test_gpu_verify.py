"""``python -m fp4_dynamo_shim.verify --device cuda`` as users run it, in both device modes, every line pinned.

Verify's checks take their GPU branches only on a GPU (the CUDA graph, FlashInfer's failure without the shim,
layernorm compiled and compared, the op captured and replayed): the CPU tests reach only their CPU side. Here
each check's result and the words it prints are held against what that branch must say, so a check that
stops capturing, stops comparing values, or compares the wrong thing fails here. One fresh interpreter per
mode, as a user's, because the baseline check needs FlashInfer's JIT loader not yet traced in this process.
Below SM100 a third mode is the default one, ``FP4_DYNAMO_SHIM_FALLBACK=error``: the shim refuses to run the
empty kernel, so the checks that would launch it skip, each with its reason pinned, and tracing runs on fake
tensors. The in-process tests at the end hand two checks what only a fault shows: an "unpatched" function
that compiles (the baseline must say the shim is not needed) and a graph break (the CUDA-graph check must
refuse it under fullgraph).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from gpu_support import KERNEL_FALLBACK, has_fp4_kernel

import fp4_dynamo_shim
from _fp4_dynamo_shim.fp4 import flashinfer_op
from _fp4_dynamo_shim.verify import checks

#: What the checks that would launch the FP4 kernel say where the shim refuses it (SM<100, fallback error).
REFUSED = "this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error"
#: The first line of the Unsupported that Dynamo raises in FlashInfer's JIT loader (a skipped function:
#: _thread.allocate_lock, subprocess): the baseline must show that failure, not another one.
BASELINE = "unpatched: Unsupported: Attempted to call function marked as skipped (expected; the shim fixes this)"


def _expected(values: bool, has_op: bool, where: str, launches: bool = True) -> dict:
    """check name -> (result, detail) for a GPU whose fp4_quantize computes values or not, and launches its
    kernel or not (``launches`` False: SM<100 under FP4_DYNAMO_SHIM_FALLBACK=error, the shim refuses)."""
    traced = "" if launches else " (traced on fake tensors: no FP4 kernel runs on this GPU)"
    op = ("compiled with fullgraph (row-major, column-major, 3-D): outputs equal the function's "
          + ("bitwise; captured and replayed (replay equals eager)" if values
             else "in shape, stride and dtype (no FP4 values on this GPU); captured and replayed"))
    return {
        "trace-static": ("pass", "fullgraph trace of flashinfer.fp4_quantize: 1 graph, 0 graph breaks (M=37)" + traced),
        "trace-dynamic": ("pass", "dim 0 marked dynamic, M in (2, 17, 300): 1 graph, 0 graph breaks, no recompilation"
                          + traced),
        "opcheck": (("pass", "torch.library.opcheck on fp4_dynamo_shim::fp4_quantize (cuda): all tests") if values
                    else ("skip", f"{REFUSED}: nothing to run") if not launches
                    else ("pass", "opcheck schema + fake-tensor tests (the kernel computes no values on this GPU)")),
        "compiled-vs-eager": (("pass", f"inductor output equals eager bitwise for M in (1, 33, 256) ({where})")
                              if values else
                              ("skip", "no FP4 values on this GPU (SM<100); FP4_DYNAMO_SHIM_FALLBACK=reference makes them")),
        "cuda-graph": (("skip", REFUSED) if not launches else
                       ("pass", "captured and replayed; replay outputs equal eager bitwise on fresh inputs" if values
                        else "captured and replayed (values not compared: the kernel writes nothing on this GPU)")),
        "flashinfer-op": (("skip", "this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
                          if not has_op else ("skip", REFUSED) if not launches else ("pass", op)),
    }


@pytest.mark.parametrize("fallback", sorted({KERNEL_FALLBACK, "reference", "error"}))
def test_verify_on_the_gpu_says_what_each_branch_did(fallback, tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FP4_DYNAMO_SHIM")}
    environment["FP4_DYNAMO_SHIM_FALLBACK"] = fallback
    # As verify itself advises where SGLang needs the shim in workers that load no plugin (0.5.9 here).
    environment["FP4_DYNAMO_SHIM"] = "1"
    completed = subprocess.run([sys.executable, "-m", "fp4_dynamo_shim.verify", "--json", "--device", "cuda",
                                "--baseline"], capture_output=True, text=True, env=environment, timeout=540)
    (tmp_path / "stderr.txt").write_text(completed.stderr)
    document = json.loads(completed.stdout)
    got = {check["name"]: (check["result"], check["detail"]) for check in document["checks"]}
    values = has_fp4_kernel() or fallback == "reference"
    launches = has_fp4_kernel() or fallback != "error"  # below SM100, error (the default) refuses the empty kernel
    where = "FlashInfer kernel" if has_fp4_kernel() else "reference quantizer"
    for name, want in _expected(values, flashinfer_op.flashinfer_has_op(), where, launches).items():
        assert got[name] == want, (name, got[name], completed.stderr[-3000:])
    # the baseline took FlashInfer's own function under fullgraph, saw it fail in FlashInfer's JIT loader (its
    # first line, whole: not another failure, not an empty or a later line), and applied the shim again
    assert got["baseline"] == ("info", BASELINE), got["baseline"]
    assert document["status"]["applied"], document["status"]
    # every declared-ops and family line that ran on the GPU passed, with its GPU wording
    assert got["flashinfer-ops"][0] in ("pass", "skip"), got["flashinfer-ops"]
    if got["flashinfer-ops"][0] == "pass":
        assert got["flashinfer-ops"][1].endswith("; layernorm: 1 graph, 0 breaks, inductor equals eager bitwise")
    assert got["family"][0] == "pass" and " called once on cuda: " in got["family"][1], got["family"]
    # SGLang's own compile path, where the staged site has a release verify drives it on (0.5.3.post2-0.5.9)
    sglang = document["status"]["sglang"]
    if sglang["compile_path_check"] and not launches:
        assert got["sglang-compile"] == ("skip", REFUSED), got["sglang-compile"]
    elif sglang["compile_path_check"]:
        compared = "equal eager" if values else "not compared (no FP4 values on this GPU)"
        result, detail = got["sglang-compile"]
        found = re.fullmatch(rf"sglang {re.escape(sglang['installed'])} install_torch_compiled \+ SGLangBackend, "
                             rf"capture sizes \[2, 4, 8\]: traced, (\d+) CUDA graphs captured, replayed; "
                             rf"outputs {re.escape(compared)}", detail)
        assert result == "pass" and found and int(found.group(1)) >= 3, (result, detail)
    # A spawned worker applies the shim only through an installed hook. Run from PYTHONPATH (as this suite is on the
    # GPU machine), verify's worker check must fail, and say why; every other check must pass or skip.
    routes = document["status"]["routes"]
    hooked = any(routes[route] for route in ("pth", "hook_pth", "sitecustomize"))
    failed = [name for name, (result, _) in got.items() if result == "fail"]
    assert failed == ([] if hooked else ["worker-activation"]), (failed, got.get("worker-activation"))
    if not hooked:
        assert "a .pth runs only from an installed package, not from PYTHONPATH" in got["worker-activation"][1]
    assert document["exit_code"] == (0 if hooked else 1), document["summary"]


def test_baseline_says_the_shim_is_not_needed_when_the_unpatched_function_compiles(device_mode, monkeypatch):
    # Stand-in: revert() left undone, so the "unpatched" function is the shim's and compiles under fullgraph,
    # as FlashInfer's own would on a release Dynamo can trace: the baseline must fail, saying so.
    monkeypatch.setattr(checks.lifecycle, "revert", lambda: True)
    with pytest.raises(AssertionError) as raised:
        checks.check_baseline("cuda")
    assert str(raised.value) == "the unpatched function compiled under fullgraph; the shim is not needed here"


def test_cuda_graph_check_compiles_with_fullgraph_so_a_graph_break_fails_it(device_mode, monkeypatch):
    # Fault: flashinfer.fp4_quantize, which the check compiles, breaks the graph. Under fullgraph=True the check
    # raises Dynamo's Unsupported; without it the break would be compiled around and the check would pass.
    import flashinfer

    quantize = flashinfer.fp4_quantize

    def after_a_graph_break(x, global_scale):
        torch._dynamo.graph_break()
        return quantize(x, global_scale)

    monkeypatch.setattr(flashinfer, "fp4_quantize", after_a_graph_break)
    torch._dynamo.reset()
    try:
        with pytest.raises(torch._dynamo.exc.Unsupported, match="graph_break"):
            checks.check_cuda_graph("cuda")
    finally:
        torch._dynamo.reset()


# --- the declared-ops and FlashInfer-op checks in process: their GPU branches, and the faults they exist to see --

def _declared_summary() -> str:
    layer = fp4_dynamo_shim.status()["flashinfer_ops"]
    if layer is None or "flashinfer.norm.layernorm" not in layer["registered"]:
        pytest.skip("flashinfer.norm.layernorm is not a registered declared op here")
    counts = layer["counts"]
    return f"{counts['registered']} of {counts['declared']} declared ops registered (gate {layer['gate']})"


class _Explanation:
    graph_count, graph_break_count = 2, 1


@pytest.mark.parametrize("fault", [None, "differs", "breaks"])
def test_declared_ops_check_runs_layernorm_on_the_gpu_and_names_what_differs(fault, monkeypatch):
    summary = _declared_summary()
    if fault == "differs":  # stand-in: compiled and eager layernorm disagree
        monkeypatch.setattr(torch, "equal", lambda a, b: False)
    if fault == "breaks":  # stand-in: Dynamo explains two graphs and a break
        monkeypatch.setattr(torch._dynamo, "explain", lambda function: lambda *arguments: _Explanation())
    torch._dynamo.reset()
    if fault is None:
        assert checks.check_flashinfer_ops("cuda") == \
            f"{summary}; layernorm: 1 graph, 0 breaks, inductor equals eager bitwise"
        return
    with pytest.raises(AssertionError) as failed:
        checks.check_flashinfer_ops("cuda")
    assert str(failed.value) == {"differs": "layernorm: 1 graphs, 0 breaks, compiled differs from eager",
                                 "breaks": "layernorm: 2 graphs, 1 breaks, compiled equals eager"}[fault]


needs_flashinfer_op = pytest.mark.skipif(not flashinfer_op.flashinfer_has_op(),
                                         reason="this FlashInfer registers no torch.ops.flashinfer.fp4_quantize")


@needs_flashinfer_op
def test_flashinfer_op_check_compiles_captures_and_replays_on_the_gpu(device_mode):
    torch._dynamo.reset()
    values = checks._computes_values("cuda")
    assert checks.check_flashinfer_op("cuda") == _expected(values, True, "")["flashinfer-op"][1]


def _faulty_quantize(monkeypatch, fault_at_call: int, fault):
    """``flashinfer.fp4_quantize`` (the function the check compares the op with) whose ``fault_at_call``-th
    call (from 1) gives ``fault(outputs)``."""
    import flashinfer

    original, calls = flashinfer.fp4_quantize, []

    def quantize(x, scale):
        calls.append(1)
        outputs = original(x, scale)
        return fault(outputs) if len(calls) == fault_at_call else outputs

    monkeypatch.setattr(flashinfer, "fp4_quantize", quantize)


@needs_flashinfer_op
def test_flashinfer_op_check_names_a_layout_whose_strides_differ(device_mode, monkeypatch):
    # stand-in fault: the function's values come back column-major on the first (row-major) comparison
    _faulty_quantize(monkeypatch, 1, lambda outputs: (outputs[0].t().contiguous().t(), outputs[1]))
    torch._dynamo.reset()
    with pytest.raises(AssertionError) as failed:
        checks.check_flashinfer_op("cuda")
    assert re.fullmatch(r"row-major: compiled op gives \(64, 128\)/\(128, 1\), the function \(64, 128\)/\(1, 64\)",
                        str(failed.value)), str(failed.value)


@pytest.mark.parametrize("fault_at_call, message", [
    (2, "column-major: the compiled op's values differ from flashinfer.fp4_quantize's"),
    (4, "the op's replayed CUDA graph differs from eager on the same inputs"),
])
@needs_flashinfer_op
def test_flashinfer_op_check_names_values_that_differ_in_a_layout_or_a_replay(reference_mode, monkeypatch,
                                                                             fault_at_call, message):
    _faulty_quantize(monkeypatch, fault_at_call, lambda outputs: (outputs[0] ^ 1, outputs[1]))
    torch._dynamo.reset()
    with pytest.raises(AssertionError) as failed:
        checks.check_flashinfer_op("cuda")
    assert str(failed.value) == message


def test_cuda_graph_check_names_a_replay_that_differs_from_eager(reference_mode, monkeypatch):
    # stand-in fault: eager's answer (flashinfer.fp4_quantize run outside the compiled graph, after the replay)
    # differs from what the captured graph wrote
    import flashinfer

    original = flashinfer.fp4_quantize

    def quantize(x, scale):
        values, scales = original(x, scale)
        return (values, scales) if torch.compiler.is_compiling() else (values ^ 1, scales)

    monkeypatch.setattr(flashinfer, "fp4_quantize", quantize)
    torch._dynamo.reset()
    try:
        with pytest.raises(AssertionError) as failed:
            checks.check_cuda_graph("cuda")
        assert str(failed.value) == "replayed outputs differ from eager on the same inputs"
    finally:
        torch._dynamo.reset()
