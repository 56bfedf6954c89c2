"""GPU tests: run on a machine with a CUDA device (`bash tests/gpu/run.sh`); skipped cleanly elsewhere.

The H200 these were written on is SM90: FlashInfer's FP4 quantize kernel launches there but writes
nothing. Every test that computes FP4 therefore runs in two device modes (``device_mode``, ids
``kernel`` and ``reference``; see gpu_support): the branch Blackwell takes (asserting what it can show
there: tracing, shapes, capture, replay, and that the JIT entry and not the reference was reached), and
the reference fallback (asserting values). ``kernel_mode`` / ``reference_mode`` are for tests that only
one mode can answer; each says why.
"""

from __future__ import annotations

import pytest

from gpu_support import GPU, MODES, using_mode


#: node id -> (the device mode its test ran in: "kernel", "reference" or "-" for mode-independent tests; outcome).
_OUTCOMES = {}


def _mode_of(item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "device_mode" in callspec.params:
        return callspec.params["device_mode"]
    for mode in MODES:
        if f"{mode}_mode" in getattr(item, "fixturenames", ()):
            return mode
    return "-"


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device: the GPU tests run on the GPU machine")
    for item in (item for item in items if "/gpu/" in str(item.fspath)):
        # In the report: under xdist the workers collect the items, and the summary is printed elsewhere.
        item.user_properties.append(("device_mode", _mode_of(item)))
        if not GPU:
            item.add_marker(skip)


@pytest.fixture(params=MODES)
def device_mode(request):
    with using_mode(request.param) as mode:
        yield mode


@pytest.fixture
def kernel_mode():
    with using_mode("kernel") as mode:
        yield mode


@pytest.fixture
def reference_mode():
    with using_mode("reference") as mode:
        yield mode


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":  # a setup skip or error counts once
        _OUTCOMES.setdefault(report.nodeid, (dict(report.user_properties).get("device_mode", "-"), report.outcome))


def pytest_terminal_summary(terminalreporter):
    """One line per device mode: what ran on the kernel branch and what on the reference branch."""
    if not GPU or not _OUTCOMES:
        return
    for mode in (*MODES, "-"):
        outcomes = [outcome for ran_in, outcome in _OUTCOMES.values() if ran_in == mode]
        if outcomes:
            counts = ", ".join(f"{outcomes.count(kind)} {kind}" for kind in ("passed", "failed", "skipped")
                               if outcomes.count(kind))
            label = {"-": "mode-independent"}.get(mode, f"{mode} branch")
            terminalreporter.write_line(f"device modes: {label}: {counts}")
