"""The CPU reference's FP4 family functions called directly, on the cases a common input would hide: the recipe and
the scale type passed through, leading dimensions, MXFP4's fixed block, the input's device, the mask's rows."""

from __future__ import annotations

import pytest
import torch

from _fp4_dynamo_shim.fp4 import layout
from _fp4_dynamo_shim.fp4 import reference
from _fp4_dynamo_shim.fp4.arithmetic import Recipe

FAST_MATH_OFF = Recipe(fast_math=False)


def _nan_lanes_row() -> torch.Tensor:
    # 1.0, then NaN in every odd lane and 0 in the even ones. With global scale 3 both modes give scale byte 0x7F,
    # but fast math (the default) writes code 7 in every lane, while fast math off writes 7 for the NaN lanes and
    # 0 for the zeros: bytes 0x77 throughout against 0x77 then 0x70.
    row = torch.full((1, 16), float("nan"), dtype=torch.bfloat16)
    row[0, 0::2] = 0.0
    row[0, 0] = 1.0
    return row


def test_the_nan_lanes_row_tells_the_two_fast_math_modes_apart():
    x = _nan_lanes_row()
    assert [t.tolist() for t in reference.quantize(x, torch.tensor([3.0]), 16, False)] == [[[0x77] * 8], [[0x7F]]]
    assert [t.tolist() for t in reference.quantize(x, torch.tensor([3.0]), 16, False, recipe=FAST_MATH_OFF)] == [
        [[0x77] + [0x70] * 7], [[0x7F]]]


def test_batched_quantize_computes_in_the_recipe_it_is_given():
    packed, sf = reference.batched_quantize(_nan_lanes_row().view(1, 1, 16), torch.tensor([3.0]), 16, False,
                                            recipe=FAST_MATH_OFF)
    assert packed.tolist() == [[[0x77] + [0x70] * 7]]
    assert layout.unswizzle(sf[0], 1, 1, False).tolist() == [[0x7F]]


def test_experts_quantize_computes_in_the_recipe_it_is_given():
    packed, sf = reference.experts_quantize(_nan_lanes_row().view(1, 1, 16), torch.tensor([3.0]),
                                            torch.tensor([1], dtype=torch.int32), False, recipe=FAST_MATH_OFF)
    assert packed.tolist() == [[[0x77] + [0x70] * 7]]
    assert layout.unswizzle(sf[0].view(torch.uint8), 1, 1, False).tolist() == [[0x7F]]


def test_batched_quantize_gives_mxfp4_scale_bytes_when_asked_for_ue8m0():
    # One 32-element block with amax 6: MXFP4's scale is 6/6 = 1 = 2^0, e8m0 byte 127 (NVFP4 would give e4m3
    # 1.0, byte 0x38); 6 is e2m1 code 7, 0 code 0.
    x = torch.zeros(1, 1, 32, dtype=torch.bfloat16)
    x[0, 0, 0] = 6.0
    packed, sf = reference.batched_quantize(x, torch.tensor([1.0]), 32, True)
    assert layout.unswizzle(sf[0], 1, 1, False).tolist() == [[127]]
    assert packed.tolist() == [[[0x07] + [0] * 15]]


def test_silu_and_mul_product_is_rounded_to_the_input_dtype_before_quantizing():
    # The kernel stores silu(gate) * up in the input dtype (bf16 here) before quantizing. For this row the
    # float32 product would quantize to scale byte 73 and a code byte 228; the bf16 one gives 74 and 227.
    gate = [1.4765625, 2.90625, 3.546875, 5.3125, 2.875, 5.0625, -5.65625, -0.412109375, 5.3125, 1.7890625, 4.8125,
            -4.65625, -0.37109375, -3.046875, 0.5234375, 0.88671875]
    up = [-5.84375, -3.40625, -2.640625, 5.0, 3.1875, -4.09375, 3.5625, -4.34375, 1.40625, -4.46875, -5.96875,
          4.46875, -3.484375, -3.421875, 5.78125, 4.46875]
    x = torch.tensor([[gate + up]], dtype=torch.bfloat16)
    packed, sf = reference.experts_quantize(x, torch.tensor([1.0]), torch.tensor([1], dtype=torch.int32), True)
    assert packed.tolist() == [[[203, 124, 227, 8, 179, 143, 0, 17]]]
    assert layout.unswizzle(sf[0].view(torch.uint8), 1, 1, False).tolist() == [[74]]


def test_unpack_nibbles_keeps_every_leading_dimension():
    # [2, 3, 1] bytes -> [2, 3, 2] codes, low nibble first; a 2-D input would not tell the leading dimensions
    # (all but the last) from the first one, nor the last dimension from the second.
    packed = torch.tensor([[[0x21], [0x43], [0x65]], [[0x87], [0xA9], [0xCB]]], dtype=torch.uint8)
    assert reference.unpack_nibbles(packed).tolist() == [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]]


def test_ue8m0_dequantize_leaves_its_result_on_the_inputs_device_whatever_the_default_device():
    # The scale powers are built on the packed codes' device, not torch's default one (a meta default here stands
    # for a CUDA one around CPU tensors). Codes 0x2 (1.0) with e8m0 byte 127 (2^0) give 1.0.
    packed = torch.full((1, 16), 0x22, dtype=torch.uint8)
    sf_bytes = torch.tensor([[127]], dtype=torch.uint8)
    with torch.device("meta"):
        values = reference.dequantize(packed, sf_bytes, None, 32, True)
    assert values.device == packed.device
    assert values.tolist() == [[1.0] * 32]


def _mxfp4_operands():
    # One row of a, one row of the weight, K = 32: every code 0x2 (1.0), so a @ b is the sum of 32 products of
    # the two blocks' scales. The single 128x4 scale tile holds 2^0 (byte 127) at [0, 0] and zero bytes (2^-127)
    # elsewhere, [0, 1] included.
    a = torch.full((1, 16), 0x22, dtype=torch.uint8)
    weight = torch.full((1, 16), 0x22, dtype=torch.uint8)
    grid = torch.zeros(1, 4, dtype=torch.uint8)
    grid[0, 0] = 127
    tile = layout.swizzle(grid, False).view(128, 4)
    return a, weight.t(), tile, tile.t()


def test_mm_fp4_reads_mxfp4_in_32_element_blocks_whatever_block_size_says():
    # MXFP4's block is 32: with block_size 16 taken at its word, the second 16 codes would be scaled by [0, 1]'s
    # 2^-127 and the product would be 16, not 32.
    a, b, a_descale, b_descale = _mxfp4_operands()
    product = reference.mm_fp4(a, b, a_descale, b_descale, None, torch.float32, 16, False, False)
    assert product.tolist() == [[32.0]]
