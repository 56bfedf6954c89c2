"""FlashInfer's declared ops on the GPU (issue 20): the kernels run on SM90, so every measure is real.

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
import torch

import declared_checks
import declared_examples
import declared_report

_rows = []


@pytest.fixture(scope="module")
def every_op():
    """Every declared op on; at the end, with $OUT set, the per-module table of declared_report.py from the
    rows this module measured."""
    started = time.perf_counter()
    with declared_checks.every_op_on() as layer:
        yield layer
    if os.environ.get("OUT") and torch.cuda.is_available():
        document = declared_report.document(layer, _rows, time.perf_counter() - started)
        Path(os.environ["OUT"], f"declared_report_{document['flashinfer']}.json").write_text(
            json.dumps(document, indent=1) + "\n")


@pytest.mark.parametrize("example", declared_examples.EXAMPLES, ids=lambda e: e.name)
def test_public_function_traces_compiles_bit_exact_captures_and_passes_opcheck(every_op, example):
    report = declared_checks.check(example)
    _rows.append(report)
    if not report["present"]:
        pytest.skip(f"this release has no {example.module}.{example.function}")
    assert report["traced"], report
    assert report["bit_exact"] is True, report
    assert report["graph"] is True or str(report["graph"]).startswith("not capturable, FlashInfer's own"), report
    assert report["opcheck"] != "no shim op ran" and all(v is True for v in report["opcheck"].values()), report
