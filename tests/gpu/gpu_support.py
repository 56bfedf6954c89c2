"""Helpers for the GPU tests (imported by name; tests/gpu is on sys.path when they run)."""

from __future__ import annotations

import contextlib
import os

import torch

import fp4_dynamo_shim

GPU = torch.cuda.is_available()
SM = torch.cuda.get_device_capability(0) if GPU else None


@contextlib.contextmanager
def using_fallback(mode: str):
    """Re-apply the shim with FP4_DYNAMO_SHIM_FALLBACK=mode for the duration of the block."""
    previous = os.environ.get("FP4_DYNAMO_SHIM_FALLBACK")
    os.environ["FP4_DYNAMO_SHIM_FALLBACK"] = mode
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    try:
        assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
        yield
    finally:
        if previous is None:
            os.environ.pop("FP4_DYNAMO_SHIM_FALLBACK", None)
        else:
            os.environ["FP4_DYNAMO_SHIM_FALLBACK"] = previous
        fp4_dynamo_shim.revert()
        torch._dynamo.reset()
        fp4_dynamo_shim.apply()


def has_fp4_kernel() -> bool:
    return bool(SM) and SM[0] >= 10
