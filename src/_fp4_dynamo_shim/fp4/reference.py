"""The pure-PyTorch side of the shim: the quantizer, dequantization, and the FP4 family's references.

The quantizer (``fp4_arithmetic``) computes what FlashInfer's kernel computes; it is the op's CPU kernel
(so trace -> compile -> run works with no GPU) and the opt-in fallback on GPUs that lack the Blackwell
kernels. Vectorised; no Python loop touches elements; nothing copies from the host or synchronises, so
it runs inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

from .arithmetic import E8M0_BIAS, E8M0_NAN, Recipe, quantize
# The quantizer's packing pieces, which callers of the reference use through this module.
from .arithmetic import e2m1_codes, pack_nibbles  # noqa: F401
from .arithmetic import e2m1_values


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    low = packed & 0xF
    high = packed >> 4
    return torch.stack((low, high), dim=-1).view(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize(
    packed: torch.Tensor,
    sf_bytes: torch.Tensor,
    global_scale: torch.Tensor | float | None,
    sf_vec_size: int,
    sf_use_ue8m0: bool,
) -> torch.Tensor:
    """float32 values back from packed codes and a row-major ``[M, K/sf_vec_size]`` scale grid."""
    values = e2m1_values(unpack_nibbles(packed))
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
    values = e2m1_values(unpack_nibbles(packed)).view(rows, sf_columns, sf_vec_size)
    return (values * scale.unsqueeze(-1)).view(rows, columns)


def mxfp4_dequantize_host(weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """``mxfp4_dequantize_host``: linear e8m0 scales, ``2^(e-127)`` (e=0 gives 2^-127, e=255 NaN)."""
    values = e2m1_values(unpack_nibbles(weight))
    exponent = scale.to(torch.float32) - E8M0_BIAS
    factor = torch.where(scale == E8M0_NAN, torch.full_like(exponent, float("nan")),
                         torch.ldexp(torch.ones_like(exponent), exponent))
    return (values.view(weight.shape[0], -1, group_size) * factor.unsqueeze(-1)).view(values.shape)


def batched_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, recipe: Recipe = Recipe()):
    """``fp4_batched_quantize``: ``[B, M, K]`` -> (``[B, M, K/2]``, ``[B, swizzled 128x4 bytes]``).

    A global scale with one value per row (``[M]``) applies to that row in every batch.
    """
    from . import layout

    batches, rows, columns = input.shape
    if global_scale.numel() > 1:
        global_scale = global_scale.reshape(1, rows).expand(batches, rows).reshape(-1)
    packed, sf = quantize(input.reshape(batches * rows, columns), global_scale, sf_vec_size, sf_use_ue8m0,
                          recipe=recipe)
    grids = sf.view(batches, rows, columns // sf_vec_size)
    return packed.view(batches, rows, columns // 2), torch.stack([layout.swizzle(g, False) for g in grids])


def experts_quantize(input, global_scale, mask, use_silu_and_mul, recipe: Recipe = Recipe()):
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
    packed, sf = quantize(input.reshape(experts * rows, columns), scale_of_row, 16, False, recipe=recipe)
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
