"""The kernel's arithmetic where a common value would hide a wrong one: NaN and infinite blocks, fast math off,
4over6, MXFP4 scales, FP8 input.

Expected bytes come from the kernel's arithmetic worked out by hand (next to each case) or, where a search found
the input, from ``fp4_oracle`` (written from the kernel sources, independent of the reference).
"""

from __future__ import annotations

import math

import flashinfer
import pytest
import torch

import fp4_oracle
import fp4_oracle_modes
from nvfp4_inputs import row_of
from _fp4_dynamo_shim.fp4 import reference
from _fp4_dynamo_shim.fp4 import fp4_releases
from _fp4_dynamo_shim.fp4.arithmetic import FourOverSix, Recipe


ROW_0_6_12 = fp4_releases.target_for("0.6.12").arithmetic


def test_fast_math_off_caps_a_nan_output_scale_at_flt_max():
    # Every odd element NaN, x0 = 1: the amax is NaN, so the scale byte is 0x7F. Fast math off computes
    # fminf(1 / (NaN * (1/g)), FLT_MAX) = FLT_MAX: zeros stay code 0, 1 * FLT_MAX saturates to 6 (code 7),
    # NaN -> 7. A NaN output scale would make every code 7 (0 * NaN).
    x = row_of({0: 1.0, **{i: float("nan") for i in range(1, 16, 2)}})
    fast_off = Recipe(ROW_0_6_12, fast_math=False)
    packed, sf = reference.quantize(x, torch.tensor([3.0]), 16, False, recipe=fast_off)
    assert sf.tolist() == [[0x7F]] and packed.tolist() == [[0x77] + [0x70] * 7]
    assert (packed.tolist(), sf.tolist()) == fp4_oracle.quantize(x.float().tolist(), [3.0], 16, False,
                                                                mode=fp4_oracle_modes.Mode(fast_math=False), release="0.6.12")


@pytest.mark.parametrize("fast_math", [True, False])
@pytest.mark.parametrize("mse", [False, True])
def test_four_over_six_leaves_a_zero_block_zero(fast_math, mse):
    # Block 0 is all zero: both candidates' scales are 0, their output scale rcp(0) = inf and 0 * inf = NaN
    # would encode as 0x77; the kernel returns 0 codes and scale byte 0 for it. Block 1 is ordinary.
    from flashinfer.quantization.nvfp4_quantization_utils import NVFP44Over6Config

    x = row_of({16: 4.0, 17: -1.0}, width=32)
    config = NVFP44Over6Config(err_mode="MSE" if mse else "MAE")
    environment = {"FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH": "1"} if not fast_math else {}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1.0]), is_sf_swizzled_layout=False, nvfp4_4over6=config)
    assert packed[0, :8].tolist() == [0] * 8 and sf[0, 0].item() == 0
    assert packed[0, 8:].any() and sf[0, 1].item() != 0


def test_0_6_12_fast_math_off_four_over_six_multiplies_amax_by_g_over_six():
    # 0.6.12: __fmul_rn(amax, __fdiv_rn(g, 6)); 0.6.13 on: __fmul_rn(__fdiv_rn(amax, 6), g). Found by search
    # next to an e4m3 midpoint: amax 6.40625, g = 14.517072677612305 gives byte 87 (0.6.12), 88 (0.6.13).
    x = row_of({0: 6.40625})
    g = torch.tensor([14.517072677612305])
    mode = fp4_oracle_modes.Mode(fast_math=False, four_over_six=True)
    for release, byte in (("0.6.12", 87), ("0.6.13", 88)):
        arithmetic = fp4_releases.target_for(release).arithmetic  # the row's formula column decides
        _, sf = reference.quantize(x, g, 16, False, recipe=Recipe(arithmetic, False, FourOverSix()))
        assert sf.tolist() == [[byte]], release
        assert fp4_oracle.quantize(x.float().tolist(), g.tolist(), 16, False, mode=mode, release=release)[1] == [[byte]]


def test_0_6_12_fast_mse_accumulates_with_fused_multiply_adds():
    # 0.6.12's fast error: error += diff * diff, which nvcc contracts into fma(diff, diff, error). Found by
    # search with g = 1.7: the fused sum keeps byte 73; rounding each square first would pick 68.
    values = [4.53125, -1.8828125, 2.125, -0.049560546875, -1.421875, -3.0625, 2.34375, -1.265625, -2.046875,
              -4.3125, -3.4375, 2.6875, -1.40625, -6.0625, 0.9453125, -10.75]
    x = torch.tensor([values]).to(torch.bfloat16)
    _, sf = reference.quantize(x, torch.tensor([1.7]), 16, False, recipe=Recipe(ROW_0_6_12, True, FourOverSix(True, True)))
    assert sf.tolist() == [[73]]
    mode = fp4_oracle_modes.Mode(True, True, mse=True, fast_error=True)
    assert fp4_oracle.quantize([values], [1.7], 16, False, mode=mode, release="0.6.12")[1] == [[73]]


def test_mxfp4_maps_an_infinite_block_scale_to_byte_254():
    # amax inf: inf / 6 rounds up (satfinite) to the largest finite e8m0, byte 254; its inverse scale is 0
    # (0.7.4's ue8m0_inverse_scale; before, ex2.approx.ftz(-127) flushes to 0): inf * 0 = NaN -> code 7,
    # 3 * 0 = 0 -> 0, -3 * 0 = -0 -> 8.
    x = row_of({0: float("inf"), 1: 3.0, 2: -3.0}, width=32)
    packed, sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    assert sf.tolist() == [[254]] and packed[0, :2].tolist() == [0x07, 0x08]
    assert fp4_oracle.quantize(x.float().tolist(), None, 32, True)[1] == [[254]]


def test_fp8_input_dequantizes_with_six_times_the_reciprocal_of_the_global_scale():
    # e4m3 6.0, g = 2: 6 * rcp(2) = 3, so the fp16 value is 18, the scale 2 * 18/6 = 6 (0x4C), the output
    # scale 2 * rcp(6), and 18 * 0.3333 -> code 7. With 6 * g it would be 72 and a scale of 24 (0x5C).
    x = row_of({0: 6.0}, dtype=torch.float8_e4m3fn)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([2.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x4C]] and packed[0, 0].item() == 0x07


def test_fp8_input_drops_a_nan_element_from_the_block_amax():
    # e4m3 NaN next to 6.0 (g = 1): __hmax drops the NaN, amax 36, scale 0x4C; the NaN still encodes as 7.
    x = row_of({0: 6.0, 1: float("nan")}, dtype=torch.float8_e4m3fn)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x4C]] and packed.tolist() == [[0x77] + [0] * 7]


def test_oracle_and_reference_agree_on_a_hand_computed_block():
    # A sanity anchor for the oracle itself: amax 6, g = 1 -> scale 1.0 (0x38), codes 7, 13 (-3), 3 (1.5).
    x = row_of({0: 6.0, 1: -3.0, 2: 1.5})
    assert fp4_oracle.quantize(x.float().tolist(), [1.0], 16, False) == ([[7 | 13 << 4, 3, 0, 0, 0, 0, 0, 0]], [[0x38]])
    assert not math.isnan(fp4_oracle.e4m3_value(0x7E)) and fp4_oracle.e4m3_value(0x7E) == 448.0


def test_an_mxfp4_scale_below_two_to_the_minus_127_rounds_to_byte_0():
    # 0.7.4 keeps subnormals in MXFP4: amax 2^-130 / 6 = 2^-132.6, whose power of two rounded up (2^-132) is
    # below e8m0's smallest, 2^-127: byte 0 (cuda_fp8.hpp saturates there), and the block's codes are 0.
    arithmetic = fp4_releases.target_for("0.7.4").arithmetic
    x = torch.full((1, 32), 2.0 ** -130, dtype=torch.bfloat16)
    packed, sf = reference.quantize(x, None, 32, True, recipe=Recipe(arithmetic))
    assert sf.tolist() == [[0]] and packed.tolist() == [[0] * 16]
    assert fp4_oracle.quantize(x.float().tolist(), None, 32, True, release="0.7.4") == ([[0] * 16], [[0]])
