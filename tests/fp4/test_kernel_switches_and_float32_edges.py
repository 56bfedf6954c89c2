"""Edges of the kernel arithmetic that ordinary inputs never reach: the recipe a launch reads, float32 kept
under another default dtype, scales at the ends of the e8m0 range, FTZ's threshold, and the shapes
``pack_nibbles`` accepts.

Expected values are worked out by hand from the rules in ``arithmetic``'s docstrings (next to each case).
"""

from __future__ import annotations

import pytest
import torch

from _fp4_dynamo_shim.fp4 import arithmetic
from _fp4_dynamo_shim.fp4.arithmetic import Arithmetic, FourOverSix, Recipe, recipe

NO_FOUR_OVER_SIX = Arithmetic(fast_math_switches=("FAST_OFF",))
FROM_ENVIRONMENT = Arithmetic(fast_math_switches=("FAST_OFF",), four_over_six="environment")
FROM_CODE = Arithmetic(fast_math_switches=("FAST_OFF",), four_over_six="code")
FOUR_OVER_SIX_ON = {"FLASHINFER_NVFP4_4OVER6": "1"}


@pytest.fixture
def float64_default():
    # A caller may run with float64 as the default dtype; the kernel's arithmetic is float32 regardless.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# --- recipe: the switches one launch reads ----------------------------------------------------------------


def test_a_release_without_four_over_six_reads_only_the_fast_math_switch():
    # Code 0 is the default; -1 ("read the environment") is accepted and ignored: the release has no 4over6.
    assert recipe(NO_FOUR_OVER_SIX, environ={}) == Recipe(NO_FOUR_OVER_SIX, True, None)
    assert recipe(NO_FOUR_OVER_SIX, environ={"FAST_OFF": "1"}) == Recipe(NO_FOUR_OVER_SIX, False, None)
    on = {**FOUR_OVER_SIX_ON, "FAST_OFF": "1"}
    assert recipe(NO_FOUR_OVER_SIX, arithmetic.CODE_FROM_ENVIRONMENT, environ=on) == Recipe(NO_FOUR_OVER_SIX, False)


def test_a_release_without_four_over_six_refuses_a_four_over_six_code():
    with pytest.raises(NotImplementedError) as raised:
        recipe(NO_FOUR_OVER_SIX, 1, environ={})
    assert str(raised.value) == "this FlashInfer release has no NVFP4 4over6 recipe"


def test_the_default_code_asks_for_no_four_over_six():
    assert recipe(FROM_CODE, environ=FOUR_OVER_SIX_ON) == Recipe(FROM_CODE, True, None)


def test_an_environment_release_reads_four_over_six_without_a_code():
    assert recipe(FROM_ENVIRONMENT, environ=FOUR_OVER_SIX_ON) == Recipe(FROM_ENVIRONMENT, True, FourOverSix(False, False))


@pytest.mark.parametrize("mode, mse", [("mae", False), ("MAE", False), ("mse", True), (None, False)])
def test_the_error_mode_variable_is_read_without_regard_to_case(mode, mse):
    environ = {**FOUR_OVER_SIX_ON, "FAST_OFF": "1", "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH": "1"}
    if mode is not None:
        environ["FLASHINFER_NVFP4_4OVER6_ERR_MODE"] = mode
    assert recipe(FROM_ENVIRONMENT, environ=environ) == Recipe(FROM_ENVIRONMENT, False, FourOverSix(mse, True))


def test_the_fast_error_variable_is_off_unless_exactly_one():
    environ = {**FOUR_OVER_SIX_ON, "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH": "true"}
    assert recipe(FROM_ENVIRONMENT, environ=environ) == Recipe(FROM_ENVIRONMENT, True, FourOverSix(False, False))


def test_an_unknown_error_mode_is_refused_with_the_kernels_message():
    environ = {**FOUR_OVER_SIX_ON, "FLASHINFER_NVFP4_4OVER6_ERR_MODE": "MAX"}
    with pytest.raises(ValueError) as raised:
        recipe(FROM_ENVIRONMENT, environ=environ)
    assert str(raised.value) == "FLASHINFER_NVFP4_4OVER6_ERR_MODE must be MAE or MSE."


@pytest.mark.parametrize("code", [2, 4, 6, 16, 30])
def test_an_even_code_is_four_over_six_off_whatever_its_other_bits(code):
    # Bit 0 enables 4over6; with it clear resolveNVFP4Recipe returns the default recipe.
    assert recipe(FROM_CODE, code, environ={}) == Recipe(FROM_CODE, True, None)


@pytest.mark.parametrize("code, settings", [(1, FourOverSix(False, False)), (5, FourOverSix(True, False)),
                                            (17, FourOverSix(False, True)), (21, FourOverSix(True, True))])
def test_an_odd_code_reads_error_mode_and_fast_error_from_its_bits(code, settings):
    # Bits 2-3: error mode (0 MAE, 1 MSE); bit 4: the fast error estimate.
    assert recipe(FROM_CODE, code, environ={"FAST_OFF": "1"}) == Recipe(FROM_CODE, False, settings)


@pytest.mark.parametrize("code", [1 | 2 << 2, 1 | 3 << 2, 1 | 1 << 5])
def test_error_modes_two_and_three_and_unknown_bits_are_refused(code):
    with pytest.raises(ValueError) as raised:
        recipe(FROM_CODE, code, environ={})
    assert str(raised.value) == f"invalid nvfp4_4over6 code {code}"


# --- float32 whatever the default dtype -------------------------------------------------------------------


def test_mul_and_div_round_python_operands_to_float32(float64_default):
    # 1 + 2^-30 is 1.0 in float32; kept as float64 the product and quotient would be 1 + 2^-30.
    for operation in (arithmetic.mul, arithmetic.div):
        for a, b in ((1.0 + 2.0**-30, 1.0), (1.0, 1.0 / (1.0 + 2.0**-30))):
            result = operation(a, b)
            assert result.dtype == torch.float32 and result.item() == 1.0


def test_e2m1_values_are_float32(float64_default):
    values = arithmetic.e2m1_values(torch.arange(16, dtype=torch.uint8))
    assert values.dtype == torch.float32
    assert values.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def test_e8m0_values_are_float32_also_for_a_float16_scale():
    # 65504 (float16's largest) rounds up to 2^16, byte 127 + 16 = 143; 2^16 is float16's inf, so the value
    # has to be computed in float32.
    byte, value = arithmetic.e8m0_round_up(torch.tensor([65504.0, 3.0], dtype=torch.float16))
    assert byte.tolist() == [143, 129] and value.dtype == torch.float32 and value.tolist() == [65536.0, 4.0]


def test_the_four_over_six_error_accumulates_in_float32(float64_default):
    # MAE of codes 0 against x = [1, 2^-25 x 15] (scale 1, g 1): in float32 1 + 2^-25 rounds back to 1 every
    # time, so the error is exactly 1; a float64 sum would be 1 + 15 * 2^-25.
    blocks = torch.tensor([[[1.0] + [2.0**-25] * 15]], dtype=torch.float32)
    one = torch.ones((1, 1), dtype=torch.float32)
    codes = torch.zeros((1, 1, 16), dtype=torch.uint8)
    mae = Recipe(Arithmetic(four_over_six="code"), True, FourOverSix(False, False))
    error = arithmetic._candidate_error(blocks, one, one, codes, one, mae)
    assert error.dtype == torch.float32 and error.tolist() == [[1.0]]


# --- quantize's edges -------------------------------------------------------------------------------------


def test_a_bfloat16_global_scale_is_inverted_in_float32():
    # g = 13 inverted: rcp(13) = 0.07692308 in float32 (bf16 would give 0.07714844). s = g * (7 * f32(1/6))
    # = 0.0897436 lies below the e4m3 midpoint 0.08984375 of 0.0859375 (byte 27) and 0.09375 (byte 28);
    # with the bf16 inverse it would be 0.0900, byte 28. os = rcp(0.0859375 * 13) = 0.895: 7 -> 6 (code 7),
    # bf16(7/3) = 2.328 -> 2.08 -> 2 (code 4).
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 7.0, 7.0 / 3.0
    packed, sf = arithmetic.quantize(x, torch.tensor([13.0], dtype=torch.bfloat16), 16, False,
                                     is_global_scale_inversed=True)
    assert sf.tolist() == [[27]] and packed.tolist() == [[0x47, 0, 0, 0, 0, 0, 0, 0]]


def test_no_global_scale_is_a_global_scale_of_one():
    # The kernel reads SFScaleVal as 1 when no pointer is given; three blocks, each with its own scale.
    x = torch.zeros(1, 48, dtype=torch.bfloat16)
    x[0, 0], x[0, 16], x[0, 32] = 6.0, 12.0, -3.0
    packed, sf = arithmetic.quantize(x, None, 16, False)
    assert (packed.tolist(), sf.tolist()) == tuple(t.tolist() for t in arithmetic.quantize(x, torch.tensor([1.0]), 16, False))
    # s = amax / 6: 1.0 (0x38), 2.0 (0x40), 0.5 (0x30); each element is the block's +-6 (code 7, 0xF negative).
    assert sf.tolist() == [[0x38, 0x40, 0x30]] and packed.tolist() == [[7] + [0] * 7 + [7] + [0] * 7 + [0xF] + [0] * 7]


def test_an_mxfp4_block_whose_scale_is_the_smallest_normal_gets_byte_one():
    # amax = 1.5 * 2^-124 (a normal bf16): amax * f32(1/6) = 2^-126 exactly, rounded up to the e8m0 byte 1;
    # the inverse scale is ex2(127 - 1) = 2^126, so the element encodes as 6 (code 7), not as 0.
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0] = 1.5 * 2.0**-124
    packed, sf = arithmetic.quantize(x, None, 32, True)
    assert sf.tolist() == [[1]] and packed.tolist() == [[7] + [0] * 15]


# --- the kernel's float operations and conversions -------------------------------------------------------


def test_the_smallest_normal_float_is_not_zero_under_ftz():
    # setp.eq.ftz flushes subnormals only: 2^-126 is normal and compares unequal to 0.
    tiny = arithmetic.FLT_MIN
    assert arithmetic.is_zero(torch.tensor([tiny, -tiny, tiny / 2, 0.0])).tolist() == [False, False, True, True]


def test_e8m0_saturates_above_two_to_the_127_at_byte_254():
    # cvt.rp.satfinite.ue8m0x2: anything above 2^127 (finite) is 254, not the NaN byte 255.
    byte, value = arithmetic.e8m0_round_up(torch.tensor([1.5 * 2.0**127, arithmetic.FLT_MAX, -arithmetic.FLT_MAX]))
    assert byte.tolist() == [254, 254, 254] and value.tolist() == [2.0**127] * 3


@pytest.mark.parametrize("shape", [(16,), (2, 3, 16)])
def test_pack_nibbles_pairs_the_last_dimension_of_any_shape(shape):
    codes = (torch.arange(torch.Size(shape).numel()) % 16).to(torch.uint8).view(shape)
    packed = arithmetic.pack_nibbles(codes)
    assert packed.shape == (*shape[:-1], 8)
    # codes 0..15 along the last dimension: bytes 0x10, 0x32, ..., 0xFE (first code in the low nibble).
    assert packed.reshape(-1, 8).tolist() == [[0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]] * (codes.numel() // 16)
