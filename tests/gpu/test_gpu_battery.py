"""Bad input on a real GPU, against FlashInfer's own function: the shim is never less strict.

FlashInfer's host-side checks run on SM90 too (only the kernel body is missing), so every case can be
compared with what FlashInfer itself does. Where FlashInfer returns (uninitialized, on SM90) results for
input the kernel would misread, the shim refuses: those cases are listed in STRICTER.
"""

from __future__ import annotations

import flashinfer
import pytest
import torch

from battery import ALL_META_CASES, CALLERS, CASES, GPU_CASES, META_CASES, Case, assert_carries, caller_for
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import fp4_releases
from fp4_dynamo_shim.errors import InvalidArgumentError

#: Errors FlashInfer raises only by accident (an ``assert`` in its Python code, a stride lookup).
ACCIDENTAL = (AssertionError, IndexError, AttributeError)
#: Inputs FlashInfer accepts but would misread; the shim refuses them (documented in how-it-works.md).
STRICTER = {"global_scale_two_elements", "global_scale_int32", "global_scale_on_cpu"}


def stale_cuda_error():
    """A launch error left behind (FlashInfer does not check its launches): surface it, and so clear it."""
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception as error:  # the error itself is the finding
        return error
    return None


@pytest.mark.parametrize("case", CASES + GPU_CASES, ids=lambda c: c.name)
def test_never_less_strict_than_flashinfer(case: Case, device_mode):
    original = lifecycle.original_function()
    target = fp4_releases.target_for(lifecycle.flashinfer_version())
    args, kwargs = case.build("cuda")
    try:
        expected = original(*args, **kwargs)
        torch.cuda.synchronize()
        flashinfer_error = None
    except Exception as error:  # what FlashInfer does is the point of the comparison
        flashinfer_error = error
    flashinfer_left_an_error = stale_cuda_error()  # zero rows: FlashInfer launches an empty grid
    try:
        got = flashinfer.fp4_quantize(*args, **kwargs)
        torch.cuda.synchronize()
        shim_error = None
    except Exception as error:
        shim_error = error
    assert stale_cuda_error() is None, "the shim must never leave a CUDA error behind"
    if flashinfer_left_an_error is not None:
        assert case.name == "zero_rows" and shim_error is None  # a clean empty result instead
        return
    if case.not_a_tensor:  # FlashInfer fails by accident (AttributeError); the shim names the argument
        assert isinstance(shim_error, InvalidArgumentError) and case.problem in str(shim_error), shim_error
        return
    if flashinfer_error is not None:
        assert shim_error is not None, f"FlashInfer raised {flashinfer_error!r}; the shim returned"
        # The same class as FlashInfer's (or a subclass): an `except` written for FlashInfer still catches it.
        # Where FlashInfer fails only by accident (a Python assert, an index or attribute error), the shim
        # raises its InvalidArgumentError instead, naming the problem.
        if type(flashinfer_error) in ACCIDENTAL:
            assert isinstance(shim_error, InvalidArgumentError) and case.problem.lower() in str(shim_error).lower(), \
                (shim_error, flashinfer_error)
        else:
            assert isinstance(shim_error, type(flashinfer_error)), (shim_error, flashinfer_error)
        return
    if shim_error is not None:
        converting = target.converts_global_scale and case.name in ("global_scale_int32", "global_scale_on_cpu")
        assert case.name in STRICTER and not converting, f"FlashInfer accepted {case.name}; the shim raised {shim_error!r}"
        return
    assert [(t.shape, t.stride(), t.dtype) for t in got] == [(t.shape, t.stride(), t.dtype) for t in expected]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("case", META_CASES, ids=lambda c: c.name)
def test_a_meta_tensor_next_to_a_cuda_one_is_refused_on_every_path(case, caller, kernel_mode):
    """Issue 19 on the branch Blackwell takes (the replacement's direct path included): CUDA input, meta scale
    or the reverse. FlashInfer fails here only by accident (torch's copy out of a meta tensor) or not at all."""
    args, kwargs = case.build("cuda")
    with pytest.raises(Exception) as error:
        caller_for(caller)(*args, **kwargs)
    torch.cuda.synchronize()
    assert stale_cuda_error() is None
    assert_carries(error.value, InvalidArgumentError, case.problem)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("case", ALL_META_CASES, ids=lambda c: c.name)
def test_meta_tensors_alone_give_meta_outputs_on_a_gpu_machine(case, caller, kernel_mode):
    args, kwargs = case.build("cuda")
    got = caller_for(caller)(*args, **kwargs)
    assert all(t.device.type == "meta" for t in got)
