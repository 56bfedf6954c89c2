"""``python -m fp4_dynamo_shim.verify --device cuda`` as users run it, in both device modes, every line pinned.

Verify's checks take their GPU branches only on a GPU (the CUDA graph, FlashInfer's failure without the shim,
layernorm compiled and compared, the op captured and replayed): the CPU tests reach only their CPU side. Here
each check's result and the words it prints are held against what that branch must say, so a check that
stops capturing, stops comparing values, or compares the wrong thing fails here. One fresh interpreter per
mode, as a user's, because the baseline check needs FlashInfer's JIT loader not yet traced in this process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gpu_support import KERNEL_FALLBACK, has_fp4_kernel

from _fp4_dynamo_shim.fp4 import flashinfer_op

def _expected(values: bool, has_op: bool, where: str) -> dict:
    """check name -> (result, detail) for a GPU whose fp4_quantize computes values or not."""
    op = ("compiled with fullgraph (row-major, column-major, 3-D): outputs equal the function's "
          + ("bitwise; captured and replayed (replay equals eager)" if values
             else "in shape, stride and dtype (no FP4 values on this GPU); captured and replayed"))
    return {
        "trace-static": ("pass", "fullgraph trace of flashinfer.fp4_quantize: 1 graph, 0 graph breaks (M=37)"),
        "trace-dynamic": ("pass", "dim 0 marked dynamic, M in (2, 17, 300): 1 graph, 0 graph breaks, no recompilation"),
        "opcheck": ("pass", "torch.library.opcheck on fp4_dynamo_shim::fp4_quantize (cuda): all tests" if values
                    else "opcheck schema + fake-tensor tests (the kernel computes no values on this GPU)"),
        "compiled-vs-eager": (("pass", f"inductor output equals eager bitwise for M in (1, 33, 256) ({where})")
                              if values else
                              ("skip", "no FP4 values on this GPU (SM<100); FP4_DYNAMO_SHIM_FALLBACK=reference makes them")),
        "cuda-graph": ("pass", "captured and replayed; replay outputs equal eager bitwise on fresh inputs" if values
                       else "captured and replayed (values not compared: the kernel writes nothing on this GPU)"),
        "flashinfer-op": ("pass", op) if has_op else
                         ("skip", "this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)"),
    }


@pytest.mark.parametrize("fallback", sorted({KERNEL_FALLBACK, "reference"}))
def test_verify_on_the_gpu_says_what_each_branch_did(fallback, tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FP4_DYNAMO_SHIM")}
    environment["FP4_DYNAMO_SHIM_FALLBACK"] = fallback
    # As verify itself advises where SGLang needs the shim in workers that load no plugin (0.5.9 here): the
    # launch exports FP4_DYNAMO_SHIM=1, so the worker check sees the shim applied in a plain child.
    environment["FP4_DYNAMO_SHIM"] = "1"
    completed = subprocess.run([sys.executable, "-m", "fp4_dynamo_shim.verify", "--json", "--device", "cuda",
                                "--baseline"], capture_output=True, text=True, env=environment, timeout=540)
    (tmp_path / "stderr.txt").write_text(completed.stderr)
    document = json.loads(completed.stdout)
    got = {check["name"]: (check["result"], check["detail"]) for check in document["checks"]}
    values = has_fp4_kernel() or fallback == "reference"
    where = "FlashInfer kernel" if has_fp4_kernel() else "reference quantizer"
    for name, want in _expected(values, flashinfer_op.flashinfer_has_op(), where).items():
        assert got[name] == want, (name, got[name], completed.stderr[-3000:])
    # the baseline took FlashInfer's own function under fullgraph, saw it fail, and applied the shim again
    result, detail = got["baseline"]
    assert result == "info" and detail.startswith("unpatched: Unsupported: ") and detail.endswith(
        "(expected; the shim fixes this)"), detail
    assert document["status"]["applied"], document["status"]
    # every declared-ops and family line that ran on the GPU passed, with its GPU wording
    assert got["flashinfer-ops"][0] in ("pass", "skip"), got["flashinfer-ops"]
    if got["flashinfer-ops"][0] == "pass":
        assert got["flashinfer-ops"][1].endswith("; layernorm: 1 graph, 0 breaks, inductor equals eager bitwise")
    assert got["family"][0] == "pass" and " called once on cuda: " in got["family"][1], got["family"]
    # SGLang's own compile path, where the staged site has a release verify drives it on (0.5.3.post2-0.5.9)
    sglang = document["status"]["sglang"]
    if sglang["compile_path_check"]:
        compared = "equal eager" if values else "not compared (no FP4 values on this GPU)"
        result, detail = got["sglang-compile"]
        found = re.fullmatch(rf"sglang {re.escape(sglang['installed'])} install_torch_compiled \+ SGLangBackend, "
                             rf"capture sizes \[2, 4, 8\]: traced, (\d+) CUDA graphs captured, replayed; "
                             rf"outputs {re.escape(compared)}", detail)
        assert result == "pass" and found and int(found.group(1)) >= 3, (result, detail)
    assert document["exit_code"] == 0, document["summary"]
