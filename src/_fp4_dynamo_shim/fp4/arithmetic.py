"""FlashInfer's FP4 quantize kernel arithmetic, in PyTorch, for every mode the kernel has.

Read off ``quantization_utils.cuh`` (``cvt_warp_fp16_to_fp4``, ``cvt_warp_fp8_to_fp4``) and
``envUtils.cpp`` of each release, and their PTX: the FP4 module is built with ``-use_fast_math``, so every
multiply flushes subnormal inputs and results to a signed zero (FTZ), and a subnormal compares equal to
0. Each kernel step is one function here, in the kernel's order:

* default (fast math): ``s = g * (amax * f32(1/6))``, ``sf = e4m3(s)``, ``os = rcp(sf * rcp(g))`` (0 when
  the block is zero; up to 0.7.2 a block whose scale rounds to e4m3 zero gets ``rcp(0) = inf``, from 0.7.4
  0); codes ``e2m1(x * os)``;
* fast math off (``TRTLLM_DISABLE_FP4_QUANT_FAST_MATH=1``, from 0.6.13 also ``FLASHINFER_...``):
  ``s = amax * (g * f32(1/6))``, ``os = min(1 / (sf * (1 / g)), FLT_MAX)`` with exact divisions;
* 4over6 (``FLASHINFER_NVFP4_4OVER6=1``, from 0.7.1 also the ``nvfp4_4over6`` code): per block, the
  6-based and the 1.5x larger 4-based scale; the one with the smaller error (MAE or MSE, exact or the
  release's fast estimate; a tie keeps 6) wins;
* MXFP4: ``amax * f32(1/6)`` rounded up to a power of two; up to 0.7.2 with FTZ, from 0.7.4 without;
* FP8 input: dequantized to fp16 with ``6 * rcp(g)`` first, then ``os = g * rcp(sf)``.

Only NVFP4 from 16-bit input reads the switches. The one knowable difference left is ``rcp``: the kernel's
``rcp.approx.ftz.f32`` is within 1 ulp of ``1/x`` and differs from it for about 13% of mantissas; here it
is the exact reciprocal (docs/how-it-works.md gives the measured rate and the command that measures it).
Vectorised, and safe inside CUDA-graph capture: nothing copies from the host.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, Tuple

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: float32(1/6): what ``rcp.approx.ftz.f32(6.0)`` gives (constant-folded; checked on hardware).
ONE_SIXTH = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()
FLT_MIN = torch.finfo(torch.float32).tiny
FLT_MAX = torch.finfo(torch.float32).max
E8M0_NAN = 255
E8M0_BIAS = 127
FP8_INPUT_DTYPES = (torch.float8_e4m3fn,)

#: ``nvfp4_4over6_code`` that asks the kernel to read ``FLASHINFER_NVFP4_4OVER6*`` itself (0.7.1+).
CODE_FROM_ENVIRONMENT = -1


@dataclasses.dataclass(frozen=True)
class Arithmetic:
    """What one range of releases computes, beyond the default recipe (a column group of the targets table)."""

    #: Environment variables of which one set to exactly "1" switches fast math off (read every launch).
    fast_math_switches: Tuple[str, ...] = ()
    #: Where the 4over6 recipe comes from: "none", "environment" (the kernel reads it every launch), or
    #: "code" (the nvfp4_4over6 code FlashInfer's Python passes; -1 makes the kernel read the environment).
    four_over_six: str = "none"
    #: 1: 0.6.12's formulas (fast-off ``amax * (g / 6)``, error estimate fused into one fma); 2: 0.6.13 on.
    four_over_six_formula: int = 2
    #: When the NVFP4 output scale is 0: "amax" (only for a zero block; a scale that rounds to e4m3 zero
    #: gives rcp(0) = inf) or "byte" (whenever the e4m3 scale byte is 0, from 0.7.4).
    zero_scale: str = "amax"
    #: MXFP4 multiplies keep float32 subnormals (0.7.4: mul.rn without FTZ, exact inverse scales).
    mxfp4_keeps_subnormals: bool = False


@dataclasses.dataclass(frozen=True)
class FourOverSix:
    mse: bool = False
    fast_error: bool = False


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What one call computes: the release's arithmetic plus the switches in force for this call."""

    arithmetic: Arithmetic = Arithmetic()
    fast_math: bool = True
    four_over_six: Optional[FourOverSix] = None


FOUR_OVER_SIX_VARIABLE = "FLASHINFER_NVFP4_4OVER6"
ERROR_MODE_VARIABLE = "FLASHINFER_NVFP4_4OVER6_ERR_MODE"
FAST_ERROR_VARIABLE = "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH"


def _on(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name) == "1"  # getBoolEnv: exactly "1", nothing else


def recipe(arithmetic: Arithmetic, code: int = 0, environ: Optional[Mapping[str, str]] = None) -> Recipe:
    """The recipe of one kernel launch, reading the switches where and as the kernel reads them."""
    environ = os.environ if environ is None else environ
    fast_math = not any(_on(environ, name) for name in arithmetic.fast_math_switches)
    if arithmetic.four_over_six == "none":
        if code not in (0, CODE_FROM_ENVIRONMENT):
            raise NotImplementedError("this FlashInfer release has no NVFP4 4over6 recipe")
        return Recipe(arithmetic, fast_math)
    if arithmetic.four_over_six == "environment" or code == CODE_FROM_ENVIRONMENT:
        if not _on(environ, FOUR_OVER_SIX_VARIABLE):
            return Recipe(arithmetic, fast_math)
        mode = environ.get(ERROR_MODE_VARIABLE)
        if mode is not None and mode.upper() not in ("MAE", "MSE"):  # C++: std::invalid_argument
            raise ValueError(f"{ERROR_MODE_VARIABLE} must be MAE or MSE.")
        return Recipe(arithmetic, fast_math, FourOverSix(mode is not None and mode.upper() == "MSE",
                                                         _on(environ, FAST_ERROR_VARIABLE)))
    if code % 2 == 0:
        return Recipe(arithmetic, fast_math)
    if code >> 5 or (code >> 2) & 3 > 1:  # resolveNVFP4Recipe: unknown bits, error modes 2 and 3
        raise ValueError(f"invalid nvfp4_4over6 code {code}")
    return Recipe(arithmetic, fast_math, FourOverSix(bool((code >> 2) & 1), bool((code >> 4) & 1)))


# --- the kernel's float32 operations ------------------------------------------------------------------

def ftz(value: torch.Tensor) -> torch.Tensor:
    """Flush subnormals to a zero of the same sign (``value * 0`` keeps the sign; NaN stays NaN)."""
    return torch.where(value.abs() < FLT_MIN, value * 0, value)


def mul(a, b) -> torch.Tensor:
    """``mul.ftz.f32``: round to nearest, subnormal operands and results flushed."""
    return ftz(ftz(torch.as_tensor(a, dtype=torch.float32)) * ftz(torch.as_tensor(b, dtype=torch.float32)))


def rcp(a: torch.Tensor) -> torch.Tensor:
    """``rcp.approx.ftz.f32`` as the correctly rounded reciprocal (rcp(0) = inf, subnormals flushed)."""
    return ftz(1.0 / ftz(a))


def div(a, b) -> torch.Tensor:
    """``div.rn.ftz.f32``."""
    return ftz(ftz(torch.as_tensor(a, dtype=torch.float32)) / ftz(torch.as_tensor(b, dtype=torch.float32)))


def min_flt_max(value: torch.Tensor) -> torch.Tensor:
    """``fminf(value, FLT_MAX)``: fmin returns the non-NaN operand, so NaN gives FLT_MAX too."""
    return torch.where(torch.isnan(value) | (value > FLT_MAX), torch.full_like(value, FLT_MAX), value)


def is_zero(value: torch.Tensor) -> torch.Tensor:
    """``setp.eq.ftz``: a subnormal compares equal to zero."""
    return value.abs() < FLT_MIN


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """``cvt.rn.satfinite.e2m1x2.f32``: nearest, ties to the even code, saturating at +-6, sign kept
    (-0 and negative values that round to zero give code 8), NaN to +6 (code 7)."""
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
    code = code | (torch.signbit(values).to(torch.uint8) << 3)
    return torch.where(torch.isnan(values), torch.full_like(code, 7), code)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """Values of e2m1 codes from their bits (exponent = bits 1-2, mantissa = bit 0): no table, so no host copy."""
    exponent = ((codes >> 1) & 0x3).to(torch.float32)
    half_mantissa = (codes & 0x1).to(torch.float32) * 0.5
    magnitude = torch.where(exponent == 0, half_mantissa, torch.ldexp(1.0 + half_mantissa, exponent - 1))
    return torch.where((codes & 0x8) != 0, -magnitude, magnitude)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte, the first in the low nibble: ``[..., K] -> [..., K/2]``."""
    pairs = codes.view(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def e4m3_round(scale: torch.Tensor) -> tuple:
    """``cvt.rn.satfinite.e4m3x2.f32``: (byte, value) nearest-even, saturating at +-448, NaN to 0x7F."""
    as_e4m3 = scale.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    byte = torch.where(torch.isnan(scale), torch.full_like(as_e4m3.view(torch.uint8), 0x7F), as_e4m3.view(torch.uint8))
    return byte, byte.view(torch.float8_e4m3fn).to(torch.float32)


def e8m0_round_up(scale: torch.Tensor) -> tuple:
    """``cvt.rp.satfinite.ue8m0x2.f32``: (byte, value), the smallest 2^(byte-127) >= |scale|; byte 0 for
    (0, 2^-127] and 0, 254 for infinities and anything above 2^127, 255 for NaN. The magnitude, as in
    cuda_fp8.hpp's ``__nv_cvt_float_to_e8m0`` (it clears the sign bit first): a negative scale comes only
    from FP8 input with a negative global scale."""
    magnitude = scale.abs()
    mantissa, exponent = torch.frexp(magnitude)
    # scale = mantissa * 2**exponent with mantissa in [0.5, 1): a power of two has mantissa 0.5.
    ceil_log2 = torch.where(mantissa == 0.5, exponent - 1, exponent)
    biased = (ceil_log2 + E8M0_BIAS).clamp(0, 254)
    biased = torch.where(magnitude > 0, biased, torch.zeros_like(biased))
    biased = torch.where(torch.isinf(scale), torch.full_like(biased, 254), biased)
    biased = torch.where(torch.isnan(scale), torch.full_like(biased, E8M0_NAN), biased)
    value = torch.ldexp(torch.ones_like(scale), (biased - E8M0_BIAS).to(torch.float32))
    return biased.to(torch.uint8), value


def _amax_16_bit(blocks: torch.Tensor) -> torch.Tensor:
    """The kernel's block amax of 16-bit input: NaN-dropping ``__hmax2`` per lane (even and odd elements),
    then ``(even > odd) ? even : odd``, which is NaN exactly when every odd element is NaN."""
    magnitudes = blocks.abs()

    def lane_max(lane):
        finite = torch.where(torch.isnan(lane), torch.zeros_like(lane), lane).amax(dim=-1)
        return torch.where(torch.isnan(lane).all(dim=-1), torch.full_like(finite, float("nan")), finite)

    even, odd = lane_max(magnitudes[..., 0::2]), lane_max(magnitudes[..., 1::2])
    return torch.where(even > odd, even, odd)


def _amax_nan_dropping(blocks: torch.Tensor) -> torch.Tensor:
    """``__hmax`` on both sides: NaN only when the whole block is NaN."""
    magnitudes = blocks.abs()
    finite = torch.where(torch.isnan(magnitudes), torch.zeros_like(magnitudes), magnitudes).amax(dim=-1)
    return torch.where(torch.isnan(magnitudes).all(dim=-1), torch.full_like(finite, float("nan")), finite)


# --- one function per kernel branch ---------------------------------------------------------------------

def _nvfp4(blocks, g, amax, recipe: Recipe):
    """NVFP4 from 16-bit input, default or fast math off: (scale bytes, per-block output scale)."""
    zero_block = is_zero(amax)
    if recipe.fast_math:
        scale = mul(g, mul(amax, ONE_SIXTH))
        byte, narrow = e4m3_round(scale)
        guard = byte == 0 if recipe.arithmetic.zero_scale == "byte" else zero_block
        output = torch.where(guard, torch.zeros_like(scale), rcp(mul(narrow, rcp(g))))
    else:
        scale = torch.where(zero_block, torch.zeros_like(amax), mul(amax, mul(g, ONE_SIXTH)))
        byte, narrow = e4m3_round(scale)
        output = torch.where(zero_block, torch.zeros_like(scale), min_flt_max(div(1.0, mul(narrow, div(1.0, g)))))
    return byte, output


def _candidate(blocks, g, amax, recipe: Recipe, factor: float):
    """One 4over6 candidate: (scale byte, scale value, codes, the global decode scale)."""
    if recipe.fast_math:
        scale = mul(g, mul(amax, ONE_SIXTH))
    elif recipe.arithmetic.four_over_six_formula == 1:
        scale = mul(amax, div(g, E2M1_MAX))
    else:
        scale = mul(div(amax, E2M1_MAX), g)
    if factor != 1.0:
        scale = mul(scale, factor)
    byte, narrow = e4m3_round(scale)
    decode = rcp(g) if recipe.fast_math else div(1.0, g)
    if recipe.fast_math:
        output = rcp(mul(narrow, decode))
    else:
        output = min_flt_max(div(1.0, mul(narrow, decode)))
    codes = e2m1_codes(mul(blocks, output.unsqueeze(-1)))
    return byte, narrow, codes, decode


def _fma(a, b, c) -> torch.Tensor:
    """``fma.rn.ftz.f32``: one rounding (float64 holds the float32 product exactly)."""
    return ftz((ftz(a).double() * ftz(b).double() + ftz(c).double()).float())


def _candidate_error(blocks, g, narrow, codes, decode, recipe: Recipe) -> torch.Tensor:
    """The candidate's error over each block, accumulated in element order like the kernel."""
    values = e2m1_values(codes)
    settings = recipe.four_over_six
    if settings.fast_error and recipe.arithmetic.four_over_six_formula == 1:
        # 0.6.12: (q * sf) * (1/g) - x, which ptxas fuses into one fma; MSE accumulates with fma too.
        difference = _fma(mul(values, narrow.unsqueeze(-1)), decode.unsqueeze(-1), -blocks)
        terms = difference
    elif settings.fast_error:
        # 0.6.13+: in the scaled domain, q * sf (exact in fp16) against x * g.
        difference = mul(values, narrow.unsqueeze(-1)) - mul(blocks, g.unsqueeze(-1))
        terms = ftz(difference)
    else:
        dequantized = mul(mul(values, narrow.unsqueeze(-1)), decode.unsqueeze(-1))
        terms = ftz(dequantized - blocks)
    error = torch.zeros(blocks.shape[:-1], dtype=torch.float32, device=blocks.device)
    for index in range(blocks.shape[-1]):
        term = terms[..., index]
        if settings.mse:
            error = _fma(term, term, error) if settings.fast_error and recipe.arithmetic.four_over_six_formula == 1 \
                else ftz(error + mul(term, term))
        else:
            error = ftz(error + term.abs())
    return error


def _four_over_six(blocks, g, amax, recipe: Recipe):
    """NVFP4 4over6: (scale bytes, codes) of the winning candidate per block; a zero block is all zero."""
    zero_block = is_zero(amax)
    byte6, narrow6, codes6, decode = _candidate(blocks, g, amax, recipe, 1.0)
    byte4, narrow4, codes4, _ = _candidate(blocks, g, amax, recipe, 1.5)
    error6 = _candidate_error(blocks, g, narrow6, codes6, decode, recipe)
    error4 = _candidate_error(blocks, g, narrow4, codes4, decode, recipe)
    four = error4 < error6  # strict: a tie (or NaN) keeps the 6 candidate
    byte = torch.where(zero_block, torch.zeros_like(byte6), torch.where(four, byte4, byte6))
    codes = torch.where((four & ~zero_block).unsqueeze(-1), codes4, codes6)
    codes = torch.where(zero_block.unsqueeze(-1), torch.zeros_like(codes), codes)
    return byte, codes


def _mxfp4(blocks, amax, recipe: Recipe):
    """MXFP4 from 16-bit input (the global scale is not used): (scale bytes, per-block output scale, values
    to encode)."""
    if recipe.arithmetic.mxfp4_keeps_subnormals:  # 0.7.4: mul.rn.f32, exact 2^(127-byte), 0 for bytes 0/254/255
        byte, _ = e8m0_round_up(amax * ONE_SIXTH)
        exponent = (E8M0_BIAS - byte.to(torch.float32))
        output = torch.where((byte == 0) | (byte >= 254), torch.zeros_like(amax),
                             torch.ldexp(torch.ones_like(amax), exponent))
        return byte, output, blocks * output.unsqueeze(-1)
    scaled = mul(amax, ONE_SIXTH)
    byte, _ = e8m0_round_up(scaled)
    # ex2.approx.ftz(127 - byte): exact on integers, 2^-127 and 2^-128 flush to 0; byte 0 gives 1 (never
    # reached: under FTZ a nonzero block has amax/6 >= 2^-126, so byte >= 1).
    power = ftz(torch.ldexp(torch.ones_like(amax), E8M0_BIAS - byte.to(torch.float32)))
    output = torch.where(is_zero(scaled), torch.zeros_like(amax), torch.where(byte == 0, torch.ones_like(amax), power))
    return byte, output, mul(blocks, output.unsqueeze(-1))


def quantize(input: torch.Tensor, global_scale: Optional[torch.Tensor], sf_vec_size: int, sf_use_ue8m0: bool,
             is_global_scale_inversed: bool = False, recipe: Recipe = Recipe()) -> tuple:
    """Quantize a row-major ``[M, K]`` tensor as the kernel does; returns (packed ``[M, K/2]`` uint8, scale
    bytes ``[M, K/sf_vec_size]``). ``global_scale`` is a float32 tensor with one element, or one per row."""
    rows, columns = input.shape
    blocks = input.to(torch.float32).view(rows, columns // sf_vec_size, sf_vec_size)
    if global_scale is None:
        g = torch.ones((rows, 1), dtype=torch.float32, device=input.device)
    else:
        g = global_scale.to(torch.float32).reshape(-1, 1).expand(rows, 1)
        if is_global_scale_inversed:
            g = rcp(g) if recipe.fast_math else div(1.0, g)

    if input.dtype in FP8_INPUT_DTYPES:
        # cvt_warp_fp8_to_fp4 (no fast-math switch, no 4over6): to fp16 with 6 * rcp(g) first.
        halves = mul(blocks, mul(E2M1_MAX, rcp(g)).unsqueeze(-1)).to(torch.float16).to(torch.float32)
        scale = mul(g, mul(_amax_nan_dropping(halves), ONE_SIXTH))
        sf_bytes, narrow = e8m0_round_up(scale) if sf_use_ue8m0 else e4m3_round(scale)
        output = torch.where(is_zero(scale), torch.zeros_like(scale), mul(g, rcp(narrow)))
        codes = e2m1_codes(mul(halves, output.unsqueeze(-1)))
    elif sf_use_ue8m0:
        sf_bytes, output, scaled = _mxfp4(blocks, _amax_16_bit(blocks), recipe)
        codes = e2m1_codes(scaled)
    elif recipe.four_over_six is not None:
        sf_bytes, codes = _four_over_six(blocks, g.expand(rows, blocks.shape[1]), _amax_16_bit(blocks), recipe)
    else:
        sf_bytes, output = _nvfp4(blocks, g, _amax_16_bit(blocks), recipe)
        codes = e2m1_codes(mul(blocks, output.unsqueeze(-1)))
    return pack_nibbles(codes.view(rows, columns)), sf_bytes
