"""``tools/gpu/proven_record.py``, the parts that read a stateful wrapper's GPU run and add it to a release's record.

The wrappers' tests (tests/gpu/test_gpu_attention.py) name their public function and the op they reached as JUnit
properties; the tool reads those, and ``--add`` joins such a run to the record an earlier run made. Tracing the
examples on fake tensors (the rest of the tool) applies the shim with every op on, which this process must not do:
these are the tool's functions called on JUnit files written here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.release_independent
RUN = "decode.BatchDecodeWithPagedKVCacheWrapper.run"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("proven_record_tool", ROOT / "tools" / "gpu" / "proven_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _junit(path, *cases) -> Path:
    """A JUnit file of (name, outcome, {property: value}) cases; outcome 'passed', 'failure' or 'skipped'."""
    body = ""
    for name, outcome, properties in cases:
        inner = "".join(f'<property name="{k}" value="{v}" />' for k, v in properties.items())
        inner = f"<properties>{inner}</properties>" if inner else ""
        inner += "" if outcome == "passed" else f'<{outcome} message="x" />'
        body += f'<testcase classname="tests.gpu.test_gpu_attention" name="{name}">{inner}</testcase>'
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_a_wrapper_passes_only_when_every_one_of_its_tests_does(tool, tmp_path):
    junit = _junit(tmp_path / "a.xml",
                   ("steps[decode-fa2]", "failure", {"function": RUN}),
                   ("run[decode-fa2]", "passed", {"function": RUN, "declared_ops": "batch_decode_run_batch_decode"}),
                   ("run[decode_tensor_cores]", "passed", {"function": RUN, "declared_ops": "batch_prefill_paged_run"}),
                   ("run[ragged]", "passed", {"function": "prefill.Ragged.run", "declared_ops": "ragged_run"}),
                   ("run[trtllm-gen]", "skipped", {"function": "decode.Other.run"}),
                   ("single[decode]", "passed", {}))
    outcomes, ops = tool.recorded_outcomes(junit)
    assert outcomes == {RUN: False, "prefill.Ragged.run": True}
    assert ops == {RUN: {"batch_decode_run_batch_decode", "batch_prefill_paged_run"}, "prefill.Ragged.run": {"ragged_run"}}


def _release(date, shim, declarations, passed=1, run=1, machine="NVIDIA H200"):
    return {"date": date, "machine": machine, "torch": "2.11.0+cu130", "shim": shim, "functions_passed": passed,
            "functions_run": run, "declarations": declarations}


def test_add_keeps_the_earlier_run_and_takes_out_what_a_failing_function_reaches(tool):
    norm = {"module": "flashinfer.norm", "op": "rmsnorm", "functions": ["norm.rmsnorm"]}
    paged = {"module": "flashinfer.prefill", "op": "batch_prefill_paged_run", "functions": ["decode.single"]}
    ragged = {"module": "flashinfer.prefill", "op": "ragged_run", "functions": ["prefill.Ragged.run"]}
    earlier = _release("2026-12-04", "0f1c2b4", {"norm": norm, "paged": paged}, passed=32, run=32)
    added = tool._added(earlier, _release("2026-12-05", "5c1e2a0", {"ragged": ragged}, passed=1, run=2), {"paged"})
    assert added["declarations"] == {"norm": norm, "ragged": ragged}
    assert (added["date"], added["shim"]) == ("2026-12-04, 2026-12-05", "0f1c2b4, 5c1e2a0")
    assert (added["functions_passed"], added["functions_run"]) == (33, 34)
    again = tool._added(added, _release("2026-12-05", "5c1e2a0", {"ragged": ragged}), set())
    assert (again["date"], again["shim"]) == ("2026-12-04, 2026-12-05", "0f1c2b4, 5c1e2a0")  # each named once


def test_add_names_each_machine_and_refuses_a_run_with_another_torch(tool):
    h100 = _release("2026-12-05", "b", {}, machine="NVIDIA H100 80GB HBM3")
    assert tool._added(_release("2026-12-04", "a", {}), h100, set())["machine"] == "NVIDIA H200, NVIDIA H100 80GB HBM3"
    with pytest.raises(SystemExit, match="measure both with one torch"):
        tool._added(_release("2026-12-04", "a", {}), dict(h100, torch="2.12.0+cu130"), set())
