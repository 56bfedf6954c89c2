"""Bad-input cases for fp4_quantize, shared by the CPU tests and the GPU tests.

Each case builds its arguments on a given device and names the problem the error message must
mention. ``valid`` cases are odd but legal: eager and compiled must return the same result.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[str], tuple]  # device -> (args, kwargs)
    #: Words the error message must contain (case-insensitive), or None for a valid input.
    problem: Optional[str]
    #: FlashInfer itself fails here only by accident (an AttributeError on a non-tensor); the shim raises
    #: its InvalidArgumentError instead, naming the argument.
    not_a_tensor: bool = False


def _x(rows=8, columns=64, dtype=torch.bfloat16):
    def build(device):
        generator = torch.Generator().manual_seed(rows * 1000 + columns)
        return torch.randn(rows, columns, generator=generator).to(device=device, dtype=dtype)
    return build


def _scale(device, value=1.0, dtype=torch.float32, shape=(1,)):
    return torch.full(shape, value, dtype=dtype, device=device)


def case(name, problem, make_input, scale=lambda d: _scale(d), not_a_tensor=False, **kwargs):
    return Case(name, lambda d: ((make_input(d), scale(d)), dict(kwargs)), problem, not_a_tensor)


def _numpy(values):
    import numpy

    return numpy.array(values, dtype=numpy.float32)


CASES = [
    case("float32_input", "dtype", _x(dtype=torch.float32)),
    case("int8_input", "dtype", lambda d: torch.ones(8, 64, dtype=torch.int8, device=d)),
    case("bool_input", "dtype", lambda d: torch.ones(8, 64, dtype=torch.bool, device=d)),
    case("float8_e5m2_input", "dtype", _x(dtype=torch.float8_e5m2)),
    case("k_not_multiple_of_sf_vec_size", "multiple of sf_vec_size", _x(columns=40)),
    case("odd_k", "multiple of sf_vec_size", _x(columns=33)),
    case("sf_vec_size_8", "sf_vec_size", _x(), sf_vec_size=8),
    case("sf_vec_size_64", "sf_vec_size", _x(columns=128), sf_vec_size=64),
    case("ue8m0_with_sf_vec_size_16", "sf_vec_size", _x(), sf_use_ue8m0=True),
    case("nvfp4_with_sf_vec_size_32", "sf_vec_size", _x(), sf_vec_size=32),
    case("zero_dim_input", "dimensions", lambda d: torch.tensor(1.0, dtype=torch.bfloat16, device=d)),
    case("one_dim_input", "dimensions", lambda d: torch.ones(64, dtype=torch.bfloat16, device=d)),
    case("non_contiguous_input", "contiguous", lambda d: _x(columns=128)(d)[:, ::2]),
    case("non_contiguous_3d_input", "contiguous", lambda d: _x(rows=8, columns=128)(d).view(2, 4, 128)[:, :, :64]),
    case("global_scale_two_elements", "global_scale", _x(), scale=lambda d: _scale(d, shape=(2,))),
    case("global_scale_int32", "global_scale", _x(), scale=lambda d: _scale(d, dtype=torch.int32)),
    case("nvfp4_without_global_scale", "global_scale", _x(), scale=lambda d: None),
    case("global_scale_python_float", "global_scale must be a torch.Tensor", _x(), scale=lambda d: 1.0,
         not_a_tensor=True),
    case("global_scale_python_int", "global_scale must be a torch.Tensor", _x(), scale=lambda d: 1, not_a_tensor=True),
    case("global_scale_list", "global_scale must be a torch.Tensor", _x(), scale=lambda d: [1.0], not_a_tensor=True),
    case("global_scale_numpy_array", "global_scale must be a torch.Tensor", _x(), scale=lambda d: _numpy([1.0]),
         not_a_tensor=True),
    case("input_list", "input must be a torch.Tensor", lambda d: [[1.0] * 64] * 8, not_a_tensor=True),
    case("input_numpy_array", "input must be a torch.Tensor", lambda d: _numpy([[1.0] * 64] * 8),
         not_a_tensor=True),
    # Odd but legal: eager and compiled must agree (and match FlashInfer where it computes).
    case("huge_k", None, _x(rows=2, columns=1 << 20)),
    case("zero_rows", None, lambda d: torch.empty(0, 64, dtype=torch.bfloat16, device=d)),
    case("nan_and_inf_values", None, lambda d: _x()(d).index_fill(1, torch.tensor([0, 17], device=d), float("nan"))
         .index_fill(1, torch.tensor([5, 40], device=d), float("inf"))),
    case("column_major_input", None, lambda d: _x(rows=64)(d).t().contiguous().t()),
    case("sf_8x4_flag_without_swizzle", None, _x(), is_sf_swizzled_layout=False, is_sf_8x4_layout=True),
    case("zero_global_scale", None, _x(), scale=lambda d: _scale(d, value=0.0)),
]

#: Cases that need a GPU: an input and a scale on different devices.
GPU_CASES = [
    case("global_scale_on_cpu", "global_scale", _x(), scale=lambda d: _scale("cpu")),
]

#: A meta tensor next to a real one (issue 19): the dispatcher sends such a call to the op's fake, whose
#: outputs are uninitialized memory, so every path must refuse it by device type (``get_device()`` is -1 for
#: CPU and meta alike), naming the argument. Built with the real tensor on the given device.
META_CASES = [
    case("global_scale_on_meta", "global_scale is on meta", _x(), scale=lambda d: _scale("meta")),
    case("input_on_meta", "input is on meta", lambda d: _x()("meta")),
    case("column_major_input_on_meta", "input is on meta", lambda d: _x(rows=64)("meta").t().contiguous().t()),
]
#: Only meta tensors: legal, meta outputs of the real call's shapes, strides and dtypes, as from any PyTorch op.
ALL_META_CASES = [
    case("input_and_global_scale_on_meta", None, lambda d: _x()("meta"), scale=lambda d: _scale("meta")),
    case("column_major_on_meta", None, lambda d: _x(rows=64)("meta").t().contiguous().t(),
         scale=lambda d: _scale("meta")),
    case("mxfp4_on_meta", None, lambda d: _x()("meta"), scale=lambda d: None, sf_vec_size=32, sf_use_ue8m0=True),
]


def _shim_op(input, global_scale, sf_vec_size=16, sf_use_ue8m0=False):
    from _fp4_dynamo_shim.fp4 import quantize_op

    return quantize_op.fp4_quantize_op(input, global_scale, sf_vec_size, sf_use_ue8m0, True, False, False, None, 0)


def _flashinfer_op(input, global_scale, sf_vec_size=16, sf_use_ue8m0=False):
    return torch.ops.flashinfer.fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0)


def _function(*args, **kwargs):
    import flashinfer

    return flashinfer.fp4_quantize(*args, **kwargs)


def _compiled(function):
    return lambda: torch.compile(function, fullgraph=True, backend="eager")


#: Every way a caller reaches the quantizer: FlashInfer's function (eager, and compiled), the shim's op and
#: FlashInfer's own op (directly, and compiled). Each entry makes the callable.
CALLERS = {
    "eager": lambda: _function,
    "compiled": _compiled(_function),
    "shim_op": lambda: _shim_op,
    "compiled_shim_op": _compiled(_shim_op),
    "flashinfer_op": lambda: _flashinfer_op,
    "compiled_flashinfer_op": _compiled(_flashinfer_op),
}


def caller_for(name: str):
    """The callable for ``CALLERS[name]``; skips the test where FlashInfer has no op of its own (< 0.6.12)."""
    import pytest

    from _fp4_dynamo_shim.fp4 import flashinfer_op

    if "flashinfer_op" in name and not flashinfer_op.flashinfer_has_op():
        pytest.skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
    return CALLERS[name]()


def assert_carries(error: BaseException, expected: type, problem: str):
    """The error is ``expected`` with the problem in its message, or Dynamo's wrapper carrying both."""
    text = str(error)
    if not isinstance(error, expected):
        assert isinstance(error, torch._dynamo.exc.TorchDynamoException), repr(error)[:600]
        assert expected.__name__ in text, text[:600]
    assert problem.lower() in text.lower(), text[:600]
