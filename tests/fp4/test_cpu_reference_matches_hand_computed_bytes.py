"""The CPU reference quantizer against hand-computed bytes, through the public (shimmed) function."""

from __future__ import annotations

import flashinfer
import pytest
import torch

import fp4_oracle
import fp4_oracle_modes
from _fp4_dynamo_shim.fp4 import layout
from _fp4_dynamo_shim.fp4 import reference
from nvfp4_inputs import nvfp4_input


def _row(values, width=16, dtype=torch.bfloat16):
    row = torch.zeros(width, dtype=torch.float32)
    row[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return row.to(dtype)


def test_e2m1_rounds_to_nearest_with_ties_to_the_even_code_and_saturates():
    values = torch.tensor(
        [0.0, 0.25, 0.26, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 100.0,
         -0.25, -0.75, -5.0, -7.0, -0.0, -0.1]
    )
    expected = [0, 0, 1, 1, 2, 2, 2, 3, 4, 4, 4, 5, 6, 6, 6, 7, 7, 7, 8, 10, 14, 15, 8, 8]
    assert reference.e2m1_codes(values).tolist() == expected


def test_two_codes_per_byte_first_in_the_low_nibble():
    codes = torch.tensor([[7, 13, 3, 0]], dtype=torch.uint8)
    assert reference.pack_nibbles(codes).tolist() == [[7 | 13 << 4, 3]]
    assert torch.equal(reference.unpack_nibbles(reference.pack_nibbles(codes)), codes)


def test_nvfp4_block_hand_computed():
    # amax 6 with global scale 1: scale 6/6 = 1.0 -> e4m3 0x38; output scale 1.
    x = _row([6.0, -3.0, 1.5, 0.25]).view(1, 16)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x38]]
    assert packed.tolist() == [[7 | 13 << 4, 3, 0, 0, 0, 0, 0, 0]]


def test_nvfp4_scale_saturates_at_448_and_values_at_6():
    # global scale 1000: 1000 * 6/6 = 1000 > 448 -> 0x7E (448); 6 / (448/1000) = 13.4 -> saturates to 6.
    x = _row([6.0, -6.0]).view(1, 16)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1000.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x7E]]
    assert packed[0, 0].item() == 7 | 15 << 4


def test_all_zero_block_gives_zero_scale_and_zero_codes():
    x = torch.zeros(1, 32, dtype=torch.float16)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0, 0]] and not packed.any()


def test_inversed_global_scale_is_its_reciprocal():
    # inversed 0.5 -> 2: scale 2 * 6/6 = 2 -> e4m3 0x40; output scale 1/(2 * 1/2) = 1.
    x = _row([6.0, 3.0]).view(1, 16)
    packed, sf = reference.quantize(x, torch.tensor([0.5]), 16, False, is_global_scale_inversed=True)
    assert sf.tolist() == [[0x40]]
    assert packed[0, 0].item() == 7 | 5 << 4


def test_mxfp4_rounds_the_scale_up_to_a_power_of_two_and_ignores_the_global_scale():
    # amax 6: 6/6 = 1 = 2^0 -> byte 127; amax 7: 7/6 rounds *up* to 2 -> byte 128, values halve: 3.5 -> 4.
    x = torch.stack([_row([6.0, 1.0], 32), _row([7.0, 1.0], 32)])
    for global_scale in (torch.tensor([1.0]), torch.tensor([123.0])):
        packed, sf = flashinfer.fp4_quantize(x, global_scale, 32, True, False)
        assert sf.tolist() == [[127], [128]]
        assert packed[:, 0].tolist() == [7 | 2 << 4, 6 | 1 << 4]


def test_fp8_input_is_dequantized_before_scaling():
    # e4m3 input 6 with global scale 1: fp16 6*6 = 36; scale 36/6 = 6 -> 0x4C; values 36/6 = 6 -> code 7.
    x = _row([6.0], dtype=torch.float32).to(torch.float8_e4m3fn).view(1, 16)
    packed, sf = reference.quantize(x, torch.tensor([1.0]), 16, False)
    assert sf.tolist() == [[0x4C]]
    assert packed[0, 0].item() == 7


def test_dequantize_recovers_values_within_one_fp4_step():
    torch.manual_seed(0)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    global_scale = (448 * 6) / x.float().abs().max()
    packed, sf = reference.quantize(x, global_scale.reshape(1), 16, False)
    back = reference.dequantize(packed, sf, global_scale.reshape(1), 16, False)
    blocks = x.float().view(8, 4, 16)
    amax = blocks.abs().amax(-1, keepdim=True)
    # Half the widest e2m1 gap (4 -> 6) is one unit of amax/6; the e4m3 scale adds at most 1/16 of amax.
    assert ((back.view(8, 4, 16) - blocks).abs() <= amax / 6 + amax / 16).all()


def _offset_128x4(m, k, columns):
    # quantization_utils.cuh get_sf_out_offset_128x4, transcribed.
    k_tiles = (columns + 3) // 4
    return ((m // 128) * k_tiles * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (k % 4))


def _offset_8x4(m, k, columns):
    k_tiles = (columns + 3) // 4
    return (m // 8) * k_tiles * 32 + (k // 4) * 32 + (m % 8) * 4 + (k % 4)


@pytest.mark.parametrize("is_8x4, offset", [(False, _offset_128x4), (True, _offset_8x4)])
@pytest.mark.parametrize("rows, columns", [(1, 1), (5, 3), (130, 4), (9, 7)])
def test_swizzled_layouts_match_the_kernels_offset_functions(is_8x4, offset, rows, columns):
    grid = (torch.arange(rows * columns) % 250 + 1).to(torch.uint8).view(rows, columns)
    buffer = layout.swizzle(grid, is_8x4)
    padded_rows, padded_columns = layout.swizzled_sf_shape(rows, columns, is_8x4)
    assert buffer.numel() == padded_rows * padded_columns
    expected = torch.zeros_like(buffer)
    for m in range(rows):
        for k in range(columns):
            expected[offset(m, k, columns)] = grid[m, k]
    assert torch.equal(buffer, expected)  # and zero in every padding byte
    assert torch.equal(layout.unswizzle(buffer, rows, columns, is_8x4), grid)


@pytest.mark.parametrize("is_8x4", [False, True])
def test_swizzled_output_of_the_public_function_holds_the_linear_factors_permuted(is_8x4):
    x, global_scale = nvfp4_input(20, 128, dtype=torch.float16, seed=1)
    _, linear = flashinfer.fp4_quantize(x, global_scale, is_sf_swizzled_layout=False)
    _, swizzled = flashinfer.fp4_quantize(x, global_scale, is_sf_8x4_layout=is_8x4)
    assert torch.equal(layout.unswizzle(swizzled, 20, 8, is_8x4), linear)


def _far_apart_blocks(seed: int) -> torch.Tensor:
    """One 16-element block of random values per power of two from bfloat16's smallest subnormal (2^-133) to
    2^127, shuffled into 29 rows of 9: beside a row's largest block the small ones' scales land under e4m3's
    smallest step, in its subnormals or in float32's, and under an extreme global scale the large ones overflow."""
    generator = torch.Generator().manual_seed(seed)
    exponents = torch.arange(-133, 128, dtype=torch.float32)[torch.randperm(261, generator=generator)]
    values = torch.randn(261, 16, generator=generator) * (2.0 ** exponents).unsqueeze(-1)
    return values.reshape(29, 9 * 16).to(torch.bfloat16)


#: Global scales: SGLang's for the input, 1, and those under which one order of the kernel's float32 operations
#: flushes or overflows where another does not (found by comparing reorderings of the reference).
GLOBAL_SCALES = {"sglang": None, "one": 1.0, "0.3": 0.3, "3e-5": 3.0e-5, "2^-124": 2.0 ** -124, "1.7e38": 1.7e38}


@pytest.mark.parametrize("fast_math_off", [False, True], ids=["fast-math", "fast-math-off"])
@pytest.mark.parametrize("scale", list(GLOBAL_SCALES))
def test_blocks_far_apart_in_magnitude_get_each_its_own_scale_as_the_kernel_computes_it(scale, fast_math_off,
                                                                                       monkeypatch):
    """Each block's scale is ``e4m3(g * (amax / 6))`` and its output scale ``rcp(scale * rcp(g))`` (fast math
    off: ``amax * (g / 6)`` and ``1 / (scale * (1 / g))``), in that order and with every flush: the same value
    reached in another order differs where one block of a row lies far from the others or from the global scale."""
    release = fp4_oracle_modes.release_of(flashinfer.__version__)
    switches = fp4_oracle_modes.FAST_MATH_SWITCHES[release]
    if fast_math_off and not switches:
        pytest.skip(f"FlashInfer {flashinfer.__version__}'s kernel has no fast-math switch")
    for name in switches:
        monkeypatch.delenv(name, raising=False)
    if fast_math_off:
        monkeypatch.setenv(switches[0], "1")  # read by the kernel, and the reference, at every call
    x = _far_apart_blocks(seed=0)
    g = GLOBAL_SCALES[scale] or 448.0 * 6.0 / x.float().abs().amax().item()
    packed, scales = flashinfer.fp4_quantize(x, torch.tensor([g], dtype=torch.float32), is_sf_swizzled_layout=False)
    want_packed, want_scales = fp4_oracle.quantize(x.float().tolist(), [g], 16, False,
                                                   mode=fp4_oracle_modes.Mode(fast_math=not fast_math_off), release=release)
    assert scales.reshape(x.shape[0], -1).tolist() == want_scales
    assert packed.tolist() == want_packed
