"""The custom op: opcheck, and fake outputs identical (shape, dtype, strides) to real ones."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.library import opcheck

from _fp4_dynamo_shim.fp4 import quantize_op
from _fp4_dynamo_shim.fp4 import fp4_releases

from release_facts import FACTS

RECIPES = [(16, False), (32, True)]  # NVFP4, MXFP4
LAYOUTS = [(True, False), (True, True), (False, False)]  # swizzled 128x4, swizzled 8x4, linear
DTYPES = [torch.float16, torch.bfloat16, torch.float8_e4m3fn]


def make_input(shape, dtype, column_major=False):
    torch.manual_seed(sum(shape))
    if column_major:
        return torch.randn(*shape[:-2], shape[-1], shape[-2]).to(dtype).transpose(-2, -1)
    return torch.randn(shape).to(dtype)


SHAPES = [((5, 64), False), ((3, 7, 128), False), ((64, 32), True), ((2, 64, 96), True), ((1, 32), False)]


def op_arguments(x, recipe, sf_layout):
    sf_vec_size, ue8m0 = recipe
    swizzled, is_8x4 = sf_layout
    return (x, torch.tensor([3.0]), sf_vec_size, ue8m0, swizzled, is_8x4, False, None, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recipe", RECIPES, ids=["nvfp4", "mxfp4"])
@pytest.mark.parametrize("sf_layout", LAYOUTS, ids=["128x4", "8x4", "linear"])
def test_opcheck(dtype, recipe, sf_layout):
    # SchemaCheckMode cannot compare float8 tensors ("mul_cpu_reduced_float" not implemented for
    # Float8_e4m3fn), so test_schema is left out for fp8 input only.
    utils = ("test_faketensor", "test_aot_dispatch_dynamic") + (() if dtype == torch.float8_e4m3fn else ("test_schema",))
    for shape, column_major in SHAPES:
        x = make_input(shape, dtype, column_major)
        opcheck(quantize_op.fp4_quantize_op, op_arguments(x, recipe, sf_layout), test_utils=utils)


def _meta(tensors):
    return [(tuple(t.shape), t.stride(), t.dtype, t.is_contiguous()) for t in tensors]


@pytest.mark.parametrize("target", fp4_releases.TARGETS, ids=lambda t: str(t.versions))
def test_fake_matches_real_shapes_dtypes_and_strides_for_every_release_row(target, target_row):
    target_row(target)
    mode = FakeTensorMode()
    for (shape, column_major), recipe, sf_layout in itertools.product(SHAPES, RECIPES, LAYOUTS):
        arguments = op_arguments(make_input(shape, torch.bfloat16, column_major), recipe, sf_layout)
        real = quantize_op.fp4_quantize_op(*arguments)
        with mode:
            fake_arguments = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in arguments]
            fake = quantize_op.fp4_quantize_op(*fake_arguments)
        assert _meta(fake) == _meta(real), (shape, column_major, recipe, sf_layout)


def test_column_major_input_returns_transposed_views():
    x = make_input((256, 64), torch.bfloat16, column_major=True)  # quantized along the 256 side
    packed, sf = quantize_op.fp4_quantize_op(x, torch.tensor([1.0]), 16, False, True, False, False, None, 0)
    assert packed.shape == (128, 64) and packed.stride() == (1, 128) and not packed.is_contiguous()
    assert sf.shape == (16, 128) and sf.stride() == (1, 16)


@pytest.mark.parametrize("version", sorted(FACTS))
def test_each_release_gets_the_row_its_wheel_calls_for(version):
    facts, target = FACTS[version], fp4_releases.target_for(version)
    assert target is not None, f"flashinfer {version} is not covered by the targets table"
    assert (target.module, target.kernel_args, target.swizzled_sf_padded_columns, target.linear_sf_row_alignment,
            target.converts_global_scale, target.row_wise_global_scale) == (
        facts.module, facts.kernel_args, facts.swizzled_sf_padded_columns, facts.linear_sf_row_alignment,
        facts.converts_global_scale, facts.row_wise_global_scale)
    arithmetic = target.arithmetic
    assert (set(arithmetic.fast_math_switches), arithmetic.four_over_six, arithmetic.zero_scale,
            arithmetic.mxfp4_keeps_subnormals, target.flashinfer_op) == (
        set(facts.fast_math_switches), facts.four_over_six, facts.zero_scale, facts.mxfp4_keeps_subnormals,
        facts.flashinfer_op)


@pytest.mark.parametrize("version", sorted(FACTS))
def test_swizzled_scale_factor_columns_follow_the_release(version, target_row):
    """K/sf_vec_size = 6, not a multiple of 4: viewed as (-1, 6) before 0.6.8, as (-1, 8) from 0.6.8 on."""
    target_row(fp4_releases.target_for(version))
    arguments = (torch.tensor([1.0]), 16, False, True, False, False, None, 0)
    _, sf = quantize_op.fp4_quantize_op(make_input((384, 96), torch.float16), *arguments)
    padded = FACTS[version].swizzled_sf_padded_columns
    assert sf.shape == ((384, 8) if padded else (512, 6))
    if not padded:
        # 256 * 8 bytes do not divide into rows of 6: those releases fail in their reshape, and so do we.
        with pytest.raises(RuntimeError, match=r"shape '\[-1, 6\]' is invalid"):
            quantize_op.fp4_quantize_op(make_input((256, 96), torch.float16), *arguments)


@pytest.mark.parametrize("version", sorted(FACTS))
def test_linear_scale_factor_buffer_is_padded_where_the_release_pads_it(version, target_row):
    """0.6.7-0.7.2 allocate round_up(M, 16) rows (the kernel may write them) and slice to M."""
    target_row(fp4_releases.target_for(version))
    _, sf = quantize_op.fp4_quantize_op(make_input((5, 64), torch.float16), torch.tensor([1.0]), 16, False, False, False,
                                False, None, 0)
    assert sf.shape == (5, 4)
    assert sf.untyped_storage().nbytes() == (16 if FACTS[version].linear_sf_row_alignment == 16 else 5) * 4


def test_fake_handles_symbolic_rows():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = make_input((37, 128), torch.bfloat16)
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    scale = mode.from_tensor(torch.tensor([1.0]))
    with mode:
        fake_x = mode.from_tensor(x, source=ConstantSource("x"), symbolic_context=context)
        packed, sf = quantize_op.fp4_quantize_op(fake_x, scale, 16, False, True, False, False, None, 0)
    assert isinstance(packed.shape[0], torch.SymInt) and packed.shape[1] == 64
    assert isinstance(sf.shape[0], torch.SymInt) and sf.shape[1] == 8
