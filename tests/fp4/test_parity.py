"""The shim calls FlashInfer's JIT-module entry with exactly the arguments FlashInfer's own path passes.

Both sides are called the way users call them: FlashInfer's ``fp4_quantize`` with the shim reverted, and
the public (shimmed) ``flashinfer.fp4_quantize`` with the launcher that ``apply()`` built. Stand-ins, because
there is no GPU here: the JIT module itself (a recorder, since building it needs nvcc and a GPU); the device
queries both sides make (one visible GPU, compute capability 10.0, PDL supported), which are what an SM100
machine answers; and CPU tensors take that GPU's launcher (they cannot be CUDA tensors here). Everything
between is the real code of both sides.
"""

from __future__ import annotations

import inspect

import flashinfer
import pytest
import torch

from _fp4_dynamo_shim.fp4 import devices
from helpers import describe


@pytest.fixture(params=["direct", "general"])
def recording_flashinfer(request, stand_in_sm100, device_state):
    """``direct``: CPU tensors also take the replacement's direct path (the stand-in GPU's kernel entry,
    counted); ``general``: only the general path through ``ops.quantize`` and the launcher. Applied per case,
    though that is most of the file's time: the launcher and the direct path are generated at apply time, and
    mutmut maps code to the tests during which it ran (applied once per module, 22 of the direct path's mutants
    ran against the first case alone and survived)."""
    original = flashinfer.fp4_quantize
    _, recorder, apply = stand_in_sm100
    apply()
    recorder.direct_calls = 0
    if request.param == "direct":
        kernel, enable_pdl_default = devices.STATE.direct_kernels[0]

        def counted(*arguments):
            recorder.direct_calls += 1
            kernel(*arguments)

        device_state(direct_kernels={**devices.STATE.direct_kernels, -1: (counted, enable_pdl_default)})
    else:
        device_state(direct_kernels={index: kernel for index, kernel in devices.STATE.direct_kernels.items()
                                     if index != -1})
    recorder.mode = request.param
    return original, recorder


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
    dict(is_global_scale_inversed=True),
    # 0.7.1+: an explicit nvfp4_4over6=None takes the replacement's fast path (the default sentinel does not).
    dict(nvfp4_4over6=None),
    dict(nvfp4_4over6=None, enable_pdl=False),
    dict(nvfp4_4over6=None, is_sf_swizzled_layout=False, is_global_scale_inversed=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_kernel_entry_receives_identical_arguments(case, recording_flashinfer):
    original, recorder = recording_flashinfer
    missing = set(case) - set(inspect.signature(original).parameters) - {"rows", "dtype", "column_major", "three_d"}
    if missing:
        pytest.skip(f"this FlashInfer's fp4_quantize has no {', '.join(sorted(missing))}")
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
    shim_outputs = flashinfer.fp4_quantize(x, global_scale, **case)
    (expected, actual) = recorder.calls
    bound = inspect.signature(original).bind(x, global_scale, **case)
    bound.apply_defaults()
    arguments = bound.arguments
    # The direct path is for the call SGLang makes: NVFP4, swizzled 128x4, row-major (and, on 0.7.1+, an
    # explicit nvfp4_4over6=None: the default sentinel reads the environment through FlashInfer first).
    takes_direct_path = recorder.mode == "direct" and not column_major and arguments["sf_vec_size"] == 16 and (
        not arguments["sf_use_ue8m0"] and arguments["is_sf_swizzled_layout"] and not arguments["is_sf_8x4_layout"]
        and arguments.get("nvfp4_4over6") is None)
    assert recorder.direct_calls == int(takes_direct_path)
    # Inputs and scalars: identical. Output buffers (positions 2 and 3): same bytes, dtype and contiguity.
    # The shim allocates them in the shape it returns (saving a view per eager call); every release's
    # kernel entry reads only their data pointers, so their shape is not part of the call.
    assert [describe(a) for i, a in enumerate(actual) if i not in (2, 3)] == [
        describe(e) for i, e in enumerate(expected) if i not in (2, 3)]
    for position in (2, 3):
        got, want = actual[position], expected[position]
        assert (got.numel(), got.dtype, got.is_contiguous(), got.untyped_storage().nbytes()) == (
            want.numel(), want.dtype, want.is_contiguous(), want.untyped_storage().nbytes())
    assert [describe(o)[:4] for o in shim_outputs] == [describe(e)[:4] for e in expected_outputs]
