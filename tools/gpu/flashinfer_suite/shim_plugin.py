"""pytest plugin for FlashInfer's own GPU tests with the shim applied first (``-p shim_plugin``).

Loaded before FlashInfer's ``tests/conftest.py``, it applies the shim with ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``
(unless the variable is set), so FlashInfer's tests run against FlashInfer with every declared op registered;
with ``FLASHINFER_TEST_TORCH_COMPILE=1`` FlashInfer's conftest replaces its public functions by
``torch.compile(fn, fullgraph=True, backend="inductor")``, which is what the layer makes work.

``FI_SUITE_CASES=N`` keeps N evenly spaced parametrizations of each test function (the full files take hours;
0 keeps all). After every test and at the end it writes ``$OUT/flashinfer_suite_<label>.json`` (``FI_SUITE_LABEL``): the shim's
counts and passed/failed/skipped per test file, with the first line of each failure.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("FP4_DYNAMO_SHIM_FLASHINFER_OPS", "all")

import fp4_dynamo_shim  # noqa: E402  (applies the shim before FlashInfer's conftest imports anything)

_results = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0})
_failures = []


def pytest_collection_modifyitems(config, items):
    keep = int(os.environ.get("FI_SUITE_CASES", "3"))
    if keep <= 0:
        return
    groups = defaultdict(list)
    for item in items:
        groups[(str(item.fspath), getattr(item, "originalname", item.name))].append(item)
    chosen = set()
    for members in groups.values():
        step = max(1, len(members) // keep)
        chosen.update(id(m) for m in members[::step][:keep])
    deselected = [item for item in items if id(item) not in chosen]
    items[:] = [item for item in items if id(item) in chosen]
    config.hook.pytest_deselected(items=deselected)


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        path = report.nodeid.split("::")[0]
        outcome = "skipped" if report.skipped else report.outcome
        _results[path][outcome] += 1
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            said = [line[1:].strip() for line in text if line.startswith("E ")][:8]  # the assertion's own words
            _failures.append({"test": report.nodeid, "error": (text[-1] if text else "")[:300],
                              "said": "\n".join(said)[:1200]})
        _write(None)  # after every test: a run the step's timeout kills still leaves its counts


def pytest_sessionfinish(session, exitstatus):
    _write(int(exitstatus))


def _write(exit_status):
    out = os.environ.get("OUT")
    if not out:
        return
    status = fp4_dynamo_shim.status()
    layer = status["flashinfer_ops"] or {}
    document = {"flashinfer": status["flashinfer"], "applied": status["applied"], "gate": layer.get("gate"),
                "state": layer.get("state"),  # "waiting" in an eager run: nothing imported torch._dynamo
                "counts": layer.get("counts"), "compile_mode": os.environ.get("FLASHINFER_TEST_TORCH_COMPILE") == "1",
                "cases_per_test": os.environ.get("FI_SUITE_CASES", "3"), "files": dict(_results),
                "failures": _failures[:100], "exit_status": exit_status, "finished": exit_status is not None}
    label = os.environ.get("FI_SUITE_LABEL", "run")
    Path(out, f"flashinfer_suite_{label}.json").write_text(json.dumps(document, indent=1) + "\n")
