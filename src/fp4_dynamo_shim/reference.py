"""A pure-PyTorch NVFP4 / MXFP4 quantizer that computes what FlashInfer's kernel computes.

It is the op's CPU kernel (so trace -> compile -> run works with no GPU) and the
opt-in fallback on GPUs that lack the Blackwell kernel. Vectorised; no Python
loop touches elements. It runs inside CUDA-graph capture: nothing here copies
from the host or synchronises.

Semantics follow ``cvt_warp_fp16_to_fp4`` / ``cvt_warp_fp8_to_fp4`` in
``quantization_utils.cuh`` and FlashInfer's own Python reference
(``ref_fp4_quant``). Where the two can differ (the kernel's approximate
reciprocal, NaN, scale underflow) is written down in docs/how-it-works.md.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: float32(1/6), what ``rcp.approx.ftz.f32(6.0)`` returns on the GPU.
RECIPROCAL_OF_E2M1_MAX = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()
#: e2m1 magnitudes by code.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E8M0_NAN = 255
E8M0_BIAS = 127

FP8_INPUT_DTYPES = (torch.float8_e4m3fn,)


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """Round float32 values to e2m1 codes (sign in bit 3), nearest with ties to the even code.

    Saturates at +-6 like ``cvt.rn.satfinite.e2m1x2.f32``. Boundaries: a tie goes
    to the neighbour whose code is even, so 0.25 -> 0 (code 0), 0.75 -> 1 (code 2),
    1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    """
    magnitude = values.abs()
    code = (
        (magnitude > 0.25).to(torch.uint8)
        + (magnitude >= 0.75)
        + (magnitude > 1.25)
        + (magnitude >= 1.75)
        + (magnitude > 2.5)
        + (magnitude >= 3.5)
        + (magnitude > 5.0)
    )
    return code | (torch.signbit(values).to(torch.uint8) << 3)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte, the first in the low nibble: ``[..., K] -> [..., K/2]``."""
    pairs = codes.view(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    low = packed & 0xF
    high = packed >> 4
    return torch.stack((low, high), dim=-1).view(*packed.shape[:-1], packed.shape[-1] * 2)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Values of e2m1 codes. Computed from the bits (exponent e = bits 1-2, mantissa m = bit 0: m/2 when
    e = 0, else 2^(e-1) * (1 + m/2)), not looked up in a table: a table would be a host-to-device copy,
    which CUDA-graph capture forbids."""
    exponent = ((codes >> 1) & 0x3).to(torch.float32)
    half_mantissa = (codes & 0x1).to(torch.float32) * 0.5
    magnitude = torch.where(exponent == 0, half_mantissa, torch.ldexp(1.0 + half_mantissa, exponent - 1))
    return torch.where((codes & 0x8) != 0, -magnitude, magnitude)


def e4m3_round(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(byte, value) of a positive float32 scale stored as e4m3: nearest-even, saturating at 448."""
    as_e4m3 = scale.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    return as_e4m3.view(torch.uint8), as_e4m3.to(torch.float32)


def e8m0_round_up(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(byte, value) of a non-negative scale rounded *up* to a power of two (``cudaRoundPosInf``).

    Saturates at 2^127 (byte 254); zero and anything at or below 2^-127 give byte 0; NaN gives 255.
    """
    mantissa, exponent = torch.frexp(scale)
    # scale = mantissa * 2**exponent with mantissa in [0.5, 1): a power of two has mantissa 0.5.
    exact_power = mantissa == 0.5
    ceil_log2 = torch.where(exact_power, exponent - 1, exponent)
    biased = (ceil_log2 + E8M0_BIAS).clamp(0, 254)
    biased = torch.where(scale > 0, biased, torch.zeros_like(biased))
    biased = torch.where(torch.isinf(scale), torch.full_like(biased, 254), biased)
    biased = torch.where(torch.isnan(scale), torch.full_like(biased, E8M0_NAN), biased)
    value = torch.ldexp(torch.ones_like(scale), (biased - E8M0_BIAS).to(torch.float32))
    return biased.to(torch.uint8), value


def e8m0_inverse(byte: torch.Tensor) -> torch.Tensor:
    """``ue8m0_inverse_scale``: 2^(127 - byte), and 0 for byte 0."""
    inverse = torch.ldexp(torch.ones(byte.shape, device=byte.device), (E8M0_BIAS - byte.to(torch.float32)))
    return torch.where(byte == 0, torch.zeros_like(inverse), inverse)


def _reciprocal_or_zero(value: torch.Tensor) -> torch.Tensor:
    return torch.where(value == 0, torch.zeros_like(value), 1.0 / value)


def _block_amax(blocks: torch.Tensor) -> torch.Tensor:
    # The kernel's fmax-based reduction skips NaN; torch.amax would propagate it.
    return blocks.abs().nan_to_num(nan=0.0).amax(dim=-1)


def quantize(
    input: torch.Tensor,
    global_scale: torch.Tensor | None,
    sf_vec_size: int,
    sf_use_ue8m0: bool,
    is_global_scale_inversed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a row-major ``[M, K]`` tensor; returns (packed ``[M, K/2]`` uint8, scale bytes ``[M, K/sf_vec_size]``).

    ``global_scale`` is a float32 tensor with one element, or one per row.
    """
    rows, columns = input.shape
    blocks = input.to(torch.float32).view(rows, columns // sf_vec_size, sf_vec_size)
    if global_scale is None:
        scale_of_row = torch.ones((rows, 1), dtype=torch.float32, device=input.device)
    else:
        scale_of_row = global_scale.to(torch.float32).reshape(-1, 1).expand(rows, 1)
        if is_global_scale_inversed:
            scale_of_row = 1.0 / scale_of_row

    if input.dtype in FP8_INPUT_DTYPES:
        # cvt_warp_fp8_to_fp4: dequantize to fp16 first, then the scale applies twice.
        blocks = (blocks * (E2M1_MAX / scale_of_row).unsqueeze(-1)).to(torch.float16).to(torch.float32)
        scale = scale_of_row * (_block_amax(blocks) * RECIPROCAL_OF_E2M1_MAX)
        sf_bytes, narrow = e8m0_round_up(scale) if sf_use_ue8m0 else e4m3_round(scale)
        output_scale = torch.where(scale == 0, torch.zeros_like(scale), scale_of_row * _reciprocal_or_zero(narrow))
    elif sf_use_ue8m0:
        # MXFP4 from 16-bit input: the kernel does not apply the global scale.
        sf_bytes, _ = e8m0_round_up(_block_amax(blocks) * RECIPROCAL_OF_E2M1_MAX)
        output_scale = e8m0_inverse(sf_bytes)
    else:
        scale = scale_of_row * (_block_amax(blocks) * RECIPROCAL_OF_E2M1_MAX)
        sf_bytes, narrow = e4m3_round(scale)
        output_scale = _reciprocal_or_zero(narrow * _reciprocal_or_zero(scale_of_row))

    codes = e2m1_codes(blocks * output_scale.unsqueeze(-1)).view(rows, columns)
    return pack_nibbles(codes), sf_bytes


def dequantize(
    packed: torch.Tensor,
    sf_bytes: torch.Tensor,
    global_scale: torch.Tensor | float | None,
    sf_vec_size: int,
    sf_use_ue8m0: bool,
) -> torch.Tensor:
    """float32 values back from packed codes and a row-major ``[M, K/sf_vec_size]`` scale grid."""
    values = e2m1_to_float(unpack_nibbles(packed))
    rows, columns = values.shape
    if sf_use_ue8m0:
        scale = torch.ldexp(torch.ones(sf_bytes.shape, device=packed.device), sf_bytes.to(torch.float32) - E8M0_BIAS)
    else:
        scale = sf_bytes.view(torch.float8_e4m3fn).to(torch.float32)
        if global_scale is not None:
            scale = scale / (global_scale if isinstance(global_scale, float) else global_scale.float().reshape(-1, 1))
    blocks = values.view(rows, columns // sf_vec_size, sf_vec_size) * scale.unsqueeze(-1)
    return blocks.view(rows, columns)


# --- The rest of FlashInfer's FP4 family (see family.py) -------------------------------------------


def block_scale_interleave(sf: torch.Tensor) -> torch.Tensor:
    """``block_scale_interleave_kernel``: each ``[R, C]`` grid (per expert) into the 128x4 layout, flat."""
    from . import layout

    experts = sf.reshape(-1, sf.shape[-2], sf.shape[-1])
    return torch.cat([layout.swizzle(grid, False) for grid in experts]) if experts.shape[0] else sf.new_empty((0,))


def decode_scale_bytes(sf_bytes: torch.Tensor, ufp8_type: int, global_scale) -> torch.Tensor:
    """``E2M1AndUFP8SFScaleToFloatV2``'s scale decode: UE8M0 is ``uint32(byte) << 23`` as float (byte 0 -> 0,
    255 -> inf), with no global scale; otherwise e4m3, times the global scale only when ``ufp8_type == 1``."""
    if ufp8_type == 0:
        return (sf_bytes.to(torch.int32) << 23).view(torch.float32)
    scale = sf_bytes.view(torch.float8_e4m3fn).to(torch.float32)
    return scale * global_scale.to(torch.float32).reshape(-1)[0] if ufp8_type == 1 else scale


def e2m1_and_ufp8sf_scale_to_float(packed, sf_bytes, global_scale, sf_vec_size, ufp8_type, is_sf_swizzled_layout,
                                   is_sf_8x4_layout=False) -> torch.Tensor:
    """Dequantize ``[M, K/2]`` packed codes with flat scale bytes in a swizzled or linear layout, on the CPU."""
    from . import layout

    rows, columns = packed.shape[0], packed.shape[1] * 2
    sf_columns = columns // sf_vec_size
    flat = sf_bytes.reshape(-1)
    grid = (layout.unswizzle(flat, rows, sf_columns, is_sf_8x4_layout) if is_sf_swizzled_layout
            else flat[: rows * sf_columns].view(rows, sf_columns))
    scale = decode_scale_bytes(grid, ufp8_type, global_scale)
    values = e2m1_to_float(unpack_nibbles(packed)).view(rows, sf_columns, sf_vec_size)
    return (values * scale.unsqueeze(-1)).view(rows, columns)


def mxfp4_dequantize_host(weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """``mxfp4_dequantize_host``: linear e8m0 scales, ``2^(e-127)`` (e=0 gives 2^-127, e=255 NaN)."""
    values = e2m1_to_float(unpack_nibbles(weight))
    exponent = scale.to(torch.float32) - E8M0_BIAS
    factor = torch.where(scale == E8M0_NAN, torch.full_like(exponent, float("nan")),
                         torch.ldexp(torch.ones_like(exponent), exponent))
    return (values.view(weight.shape[0], -1, group_size) * factor.unsqueeze(-1)).view(values.shape)


def batched_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0):
    """``fp4_batched_quantize``: ``[B, M, K]`` -> (``[B, M, K/2]``, ``[B, swizzled 128x4 bytes]``).

    A global scale with one value per row (``[M]``) applies to that row in every batch.
    """
    from . import layout

    batches, rows, columns = input.shape
    if global_scale.numel() > 1:
        global_scale = global_scale.reshape(1, rows).expand(batches, rows).reshape(-1)
    packed, sf = quantize(input.reshape(batches * rows, columns), global_scale, sf_vec_size, sf_use_ue8m0)
    grids = sf.view(batches, rows, columns // sf_vec_size)
    return packed.view(batches, rows, columns // 2), torch.stack([layout.swizzle(g, False) for g in grids])


def experts_quantize(input, global_scale, mask, use_silu_and_mul):
    """``silu_and_mul_scaled_nvfp4_experts_quantize`` (the grouped quantize too, without the silu).

    ``[L, M, K]`` (``2K`` with silu: gate first, up second, computed in float and rounded to the input
    dtype) -> packed ``[L, M, K/2]`` and the 128x4 scale bytes as int32 ``[L, round_up(M,128), pk/4]``.
    Expert ``e`` uses ``global_scale[e]``. Rows at or beyond ``mask[e]`` are left zero (the kernel leaves
    them unwritten).
    """
    from . import layout

    experts, rows, width = input.shape
    if use_silu_and_mul:
        gate, up = input[..., : width // 2].float(), input[..., width // 2:].float()
        input = (gate / (1.0 + torch.exp(-gate)) * up).to(input.dtype)
    columns = input.shape[-1]
    scale_of_row = global_scale.to(torch.float32).reshape(experts, 1).expand(experts, rows).reshape(-1)
    packed, sf = quantize(input.reshape(experts * rows, columns), scale_of_row, 16, False)
    valid = torch.arange(rows, device=input.device).unsqueeze(0) < mask.to(torch.int64).unsqueeze(1)
    packed = torch.where(valid.reshape(-1, 1), packed, torch.zeros_like(packed)).view(experts, rows, columns // 2)
    sf = torch.where(valid.reshape(-1, 1), sf, torch.zeros_like(sf)).view(experts, rows, columns // 16)
    swizzled = torch.stack([layout.swizzle(grid, False) for grid in sf])
    padded_rows, padded_columns = layout.swizzled_sf_shape(rows, columns // 16, False)
    return packed, swizzled.view(torch.int32).view(experts, padded_rows, padded_columns // 4)


def mm_fp4(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, use_nvfp4):
    """FP4 GEMM ``a @ b`` in float32, for the cuDNN/CUTLASS operand layout SGLang uses.

    ``a``: ``[M, K/2]`` packed, ``a_descale``: its swizzled scale bytes (128x4, or 8x4); ``b``: ``[K/2, N]``,
    the transpose of an ``[N, K/2]`` packed weight, ``b_descale``: the transpose of that weight's 128x4
    scale bytes. NVFP4 scales are e4m3 (``alpha`` carries the global scales), MXFP4 ones e8m0.
    The TRT-LLM backend's shuffled weight layouts are not modelled.
    """
    from . import layout

    rows, columns = a.shape[0], a.shape[1] * 2
    outputs = b.shape[1]
    sf_vec_size = block_size if use_nvfp4 else 32

    def dequantize_operand(packed, scale_bytes, rows_of, is_8x4):
        grid = layout.unswizzle(scale_bytes.contiguous().view(torch.uint8).reshape(-1), rows_of,
                                columns // sf_vec_size, is_8x4)
        return dequantize(packed.contiguous().view(torch.uint8), grid, None, sf_vec_size, not use_nvfp4)

    left = dequantize_operand(a, a_descale, rows, use_8x4_sf_layout)
    right = dequantize_operand(b.t(), b_descale.t(), outputs, False)
    product = left @ right.t()
    if alpha is not None:
        product = product * alpha.to(torch.float32).reshape(-1)[0]
    return product.to(out_dtype)
