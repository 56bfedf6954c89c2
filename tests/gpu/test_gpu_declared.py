"""FlashInfer's declared ops on the GPU: the kernels run on SM90, so every measure is real.

For each public function of ``declared_examples`` that the installed release has: fullgraph with 0 graph
breaks, inductor bit-identical to eager, CUDA-graph capture and replay equal to eager on fresh inputs,
``opcheck`` on each shim op it reaches (see ``declared_checks``). FlashInfer builds each JIT module on first
use (``declared_warmup.py`` builds them all at once first, in parallel). SGLang's NSA indexer call is in
``test_gpu_declared_sglang.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import declared_checks
import declared_examples
import declared_report

_rows = []
_started = time.perf_counter()


@pytest.fixture(scope="module")
def every_op():
    with declared_checks.every_op_on() as layer:
        yield layer


def _save(layer):
    """With $OUT set, declared_report.py's per-module table from the rows measured so far (rewritten after each
    test, so a run cut short by its time limit still reports what it measured). Under pytest-xdist each worker
    measures its share of the functions and writes its own file (one shared name kept only the last writer's)."""
    if os.environ.get("OUT"):
        document = declared_report.document(layer, _rows, time.perf_counter() - _started)
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        Path(os.environ["OUT"], f"declared_report_{document['flashinfer']}{'_' + worker if worker else ''}.json").write_text(
            json.dumps(document, indent=1) + "\n")


@pytest.mark.parametrize("example", declared_examples.EXAMPLES, ids=lambda e: e.name)
def test_public_function_traces_compiles_bit_exact_captures_and_passes_opcheck(every_op, example):
    try:
        report = declared_checks.check(example)
    except Exception as error:  # the row says what crashed; the test fails below
        report = {"name": example.name, "present": True, "error": f"{type(error).__name__}: {error}"}
    _rows.append(report)
    _save(every_op)
    assert "error" not in report, report
    if not report["present"]:
        pytest.skip(f"this release has no {example.module}.{example.function}")
    assert report["traced"], report
    assert report["bit_exact"] is True, report
    assert report["graph"] is True or str(report["graph"]).startswith("not capturable, FlashInfer's own"), report
    assert report["opcheck"] != "no shim op ran" and all(v is True for v in report["opcheck"].values()), report
