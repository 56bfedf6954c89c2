"""The shim calls FlashInfer's JIT-module entry with exactly the arguments FlashInfer's own path passes.

Stand-ins (no GPU here): the JIT module itself (a recorder, since building it needs nvcc and a GPU),
and the two device queries the original path makes (compute capability 10.0, PDL supported), which
are what an SM100 machine would answer. Everything between them is the real code of both sides.
"""

from __future__ import annotations

import sys

import flashinfer
import pytest
import torch

from fp4_dynamo_shim import ops, preload
from helpers import installed_target


class RecordingModule:
    """Stands in for the built JIT module: records every ``fp4_quantize`` call."""

    def __init__(self):
        self.calls = []

    def fp4_quantize(self, *arguments):
        self.calls.append(arguments)


class RecordingSpec:
    def __init__(self, module):
        self.module = module

    def build_and_load(self):
        return self.module


@pytest.fixture
def recording_flashinfer(unpatched, monkeypatch):
    original = flashinfer.fp4_quantize
    module = sys.modules[original.__module__]
    recorder = RecordingModule()
    monkeypatch.setattr(module, "gen_fp4_quantization_sm100_module", lambda: RecordingSpec(recorder))
    monkeypatch.setattr(module, "get_compute_capability", lambda device: (10, 0))
    monkeypatch.setattr(module, "device_support_pdl", lambda device: True)
    module.get_fp4_quantization_module.cache_clear()
    yield original, module, recorder
    module.get_fp4_quantization_module.cache_clear()


def describe(argument):
    if isinstance(argument, torch.Tensor):
        data = argument.tolist() if argument.dtype != torch.uint8 or argument.numel() < 4096 else None
        return ("tensor", tuple(argument.shape), argument.stride(), argument.dtype,
                argument.untyped_storage().nbytes(), data if argument.dtype != torch.uint8 else None)
    return (type(argument).__name__, argument)


CASES = [
    dict(),
    dict(enable_pdl=False),
    dict(enable_pdl=True),
    dict(is_sf_swizzled_layout=False),
    dict(is_sf_8x4_layout=True),
    dict(sf_vec_size=32, sf_use_ue8m0=True),
    dict(column_major=True),
    dict(three_d=True, is_sf_swizzled_layout=False),
    dict(dtype=torch.float8_e4m3fn),
    dict(rows=300),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_kernel_entry_receives_identical_arguments(case, recording_flashinfer):
    original, module, recorder = recording_flashinfer
    case = dict(case)
    rows, dtype = case.pop("rows", 5), case.pop("dtype", torch.bfloat16)
    column_major, three_d = case.pop("column_major", False), case.pop("three_d", False)
    torch.manual_seed(0)
    x = torch.randn(rows, 128).to(dtype)
    if column_major:  # quantized along its first dimension, so that one holds the 128
        x = torch.randn(rows, 128).to(dtype).t()
    if three_d:
        x = torch.randn(3, rows, 64).to(dtype)
    global_scale = torch.tensor([2.0])

    expected_outputs = original(x, global_scale, **case)
    (expected,) = recorder.calls
    recorder.calls.clear()

    raw = preload.jit_module_of(module.get_fp4_quantization_module("100"))
    assert raw is recorder
    launcher = preload.make_kernel_launcher(raw.fp4_quantize, installed_target(), enable_pdl_default=True)
    options = dict(sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True, is_sf_8x4_layout=False,
                   enable_pdl=None)
    options.update(case)
    outputs = ops.quantize(
        x, global_scale, options["sf_vec_size"], options["sf_use_ue8m0"], options["is_sf_swizzled_layout"],
        options["is_sf_8x4_layout"], False, options["enable_pdl"], 0, launch=launcher,
    )
    (actual,) = recorder.calls
    # Inputs and scalars: identical. Output buffers (positions 2 and 3): same bytes, dtype and contiguity.
    # The shim allocates them in the shape it returns (saving a view per eager call); every release's
    # kernel entry reads only their data pointers, so their shape is not part of the call.
    assert [describe(a) for i, a in enumerate(actual) if i not in (2, 3)] == [
        describe(e) for i, e in enumerate(expected) if i not in (2, 3)]
    for position in (2, 3):
        got, want = actual[position], expected[position]
        assert (got.numel(), got.dtype, got.is_contiguous(), got.untyped_storage().nbytes()) == (
            want.numel(), want.dtype, want.is_contiguous(), want.untyped_storage().nbytes())
    assert [describe(o)[:4] for o in outputs] == [describe(e)[:4] for e in expected_outputs]
