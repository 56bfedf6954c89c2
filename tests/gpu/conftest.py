"""GPU tests: run on a machine with a CUDA device (`python -m pytest -q tests/gpu`); skipped cleanly elsewhere.

The H200 these were written on is SM90: FlashInfer's FP4 quantize kernel launches there but writes
nothing. Tests therefore use the `launch_mode` fixture (FP4_DYNAMO_SHIM_FALLBACK=launch) to launch the
real kernel where only tracing, shapes, capture and overhead are checked, and `reference_mode` where
values are compared.
"""

from __future__ import annotations

import pytest

from gpu_support import GPU, using_fallback


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device: the GPU tests run on the GPU machine")
    for item in items:
        if "/gpu/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture
def launch_mode():
    with using_fallback("launch"):
        yield


@pytest.fixture
def reference_mode():
    with using_fallback("reference"):
        yield
