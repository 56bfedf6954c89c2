"""An independent oracle for FlashInfer's FP4 quantize kernel: one element at a time, plain Python.

Written from each release's ``csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh``
(``cvt_warp_fp16_to_fp4``, ``cvt_warp_fp8_to_fp4``), ``quantization.cuh`` (the global scale, inverse
scale) and ``cpp/common/envUtils.cpp`` (the switches), and CUDA's ``cuda_fp8.hpp`` (the e8m0 rounding),
on purpose without looking at ``_fp4_dynamo_shim.fp4.arithmetic``: property tests compare the shim's
reference with this, so a shared mistake would pass both. No torch here, so the two cannot share a
conversion either: float32 arithmetic is numpy's IEEE float32 (or an exact fraction rounded once),
e4m3/e2m1 come from their bit layouts, half precision from numpy.float16.

The kernel is built with ``-use_fast_math``: its float32 multiplies, divisions and comparisons flush
subnormal operands and results to a signed zero (``ftz``); ``mx_quantize_mul`` (0.7.4's MXFP4) is inline
``mul.rn.f32`` without it. ``rcp.approx.ftz.f32`` is taken as the exactly rounded reciprocal, like the
reference (the GPU's differs for a measured ~8e-4 of packed bytes; docs/how-it-works.md). Sixteen
elements per thread (SM100 and nvcc >= 12.9): the 4over6 error of an NVFP4 block is one sequential sum.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Sequence

import numpy

from fp4_oracle_modes import Mode

FLT_MIN = 2.0 ** -126
FLT_MAX = float(numpy.finfo(numpy.float32).max)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# --- float32 arithmetic as the kernel does it ---------------------------------------------------------

def _f32(value) -> float:
    with numpy.errstate(all="ignore"):
        return float(numpy.float32(value))


def flush(value: float) -> float:
    """-ftz: a subnormal float32 becomes the zero of its sign."""
    if value == value and value != 0.0 and abs(value) < FLT_MIN:
        return math.copysign(0.0, value)
    return value


def mul(a: float, b: float, ftz: bool = True) -> float:
    if ftz:
        a, b = flush(a), flush(b)
    with numpy.errstate(all="ignore"):
        product = float(numpy.float32(a) * numpy.float32(b))
    return flush(product) if ftz else product


def div(a: float, b: float) -> float:
    a, b = flush(a), flush(b)
    with numpy.errstate(all="ignore"):
        return flush(float(numpy.float32(a) / numpy.float32(b)))


def add(a: float, b: float) -> float:
    a, b = flush(a), flush(b)
    with numpy.errstate(all="ignore"):
        return flush(float(numpy.float32(a) + numpy.float32(b)))


def sub(a: float, b: float) -> float:
    return add(a, -b)


def rcp(a: float) -> float:
    return div(1.0, a)


def _round_exact(value: Fraction) -> float:
    """An exact rational rounded once to float32, nearest-even (for fma)."""
    if value == 0:
        return 0.0
    sign, magnitude = (-1.0 if value < 0 else 1.0), abs(value)
    exponent = math.floor(math.log2(magnitude.numerator) - math.log2(magnitude.denominator))
    while Fraction(2) ** exponent > magnitude:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    quantum = Fraction(2) ** (max(exponent, -126) - 23)
    steps, remainder = divmod(magnitude, quantum)
    if remainder * 2 > quantum or (remainder * 2 == quantum and steps % 2 == 1):
        steps += 1
    result = float(steps * quantum)
    return sign * (math.inf if result > FLT_MAX else result)


def fma(a: float, b: float, c: float) -> float:
    """fma.rn.ftz.f32: a * b + c rounded once."""
    a, b, c = flush(a), flush(b), flush(c)
    if not all(math.isfinite(v) for v in (a, b, c)):
        with numpy.errstate(all="ignore"):
            return float(numpy.float32(a) * numpy.float32(b) + numpy.float32(c))
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        product_negative = math.copysign(1.0, a) * math.copysign(1.0, b) < 0
        return -0.0 if product_negative and math.copysign(1.0, c) < 0 else 0.0
    return flush(_round_exact(exact))


def fmin_flt_max(value: float) -> float:
    """fminf(value, FLT_MAX): NaN gives the other operand."""
    return FLT_MAX if value != value or value > FLT_MAX else value


def to_half(value: float) -> float:
    """__float2half_rn."""
    with numpy.errstate(all="ignore"):
        return float(numpy.float16(numpy.float32(value)))


# --- the narrow formats, from their bit layouts ---------------------------------------------------------

def e4m3_value(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** -6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


_E4M3_POSITIVE = [(e4m3_value(byte), byte) for byte in range(0x7F)]


def e4m3_byte(value: float) -> int:
    """__nv_fp8_e4m3(float): nearest, ties to the even byte, saturating at 448 (inf too), NaN to 0x7F."""
    if value != value:
        return 0x7F
    sign = 0x80 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if magnitude >= 448.0:
        return sign | 0x7E
    best = min(_E4M3_POSITIVE, key=lambda entry: (abs(entry[0] - magnitude), entry[1] & 1))
    return sign | best[1]


def e2m1_code(value: float) -> int:
    """cvt.rn.satfinite.e2m1x2.f32: nearest, ties to the even code, saturating at 6, NaN to +6."""
    if value != value:
        return 7
    sign = 8 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if magnitude >= 6.0:
        return sign | 7
    code = min(range(8), key=lambda c: (abs(E2M1_MAGNITUDES[c] - magnitude), c & 1))
    return sign | code


def e2m1_value(code: int) -> float:
    magnitude = E2M1_MAGNITUDES[code & 7]
    return -magnitude if code & 8 else magnitude


def e8m0_byte_round_up(value: float) -> int:
    """__nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf), cuda_fp8.hpp's emulation: |x| rounded up
    to bfloat16, its exponent field, plus one when its mantissa is not zero and it is above 2^-127 and
    finite; NaN 0xFF, an overflow 0xFE."""
    if value != value:
        return 0xFF
    bits = int(numpy.array([abs(value)], dtype=numpy.float32).view(numpy.uint32)[0])
    bf16 = bits >> 16
    if bits < 0x7F800000 and bits & 0xFFFF:
        bf16 += 1
    byte = (bf16 >> 7) & 0xFF
    if (bf16 & 0x7F) and (bf16 & 0x7FFF) > 0x0040 and (bf16 & 0x7FFF) < 0x7F80:
        byte += 1
    if (bf16 & 0x7FFF) <= 0x7F80 and byte >= 0xFF:
        byte = 0xFE
    return byte


def e8m0_value(byte: int) -> float:
    """static_cast<float>(__nv_fp8_e8m0): 2^(byte - 127), NaN for 0xFF."""
    return math.nan if byte == 0xFF else 2.0 ** (byte - 127)


# --- the kernel, per block ---------------------------------------------------------------------------------

def _hmax(a: float, b: float) -> float:
    """__hmax / __hmax2 lanes: NaN-dropping."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a > b else b


def _amax_16_bit(block: Sequence[float]) -> float:
    """cuda_max over half2 lanes (__hmax2, NaN-dropping per lane), then (x > y) ? x : y."""
    even = odd = None
    for index, value in enumerate(block):
        magnitude = abs(value)
        if index % 2 == 0:
            even = magnitude if even is None else _hmax(even, magnitude)
        else:
            odd = magnitude if odd is None else _hmax(odd, magnitude)
    return even if even > odd else odd


def _is_zero(value: float) -> bool:
    return flush(value) == 0.0  # a setp under -ftz: a subnormal equals zero


def _nvfp4_block(block, g, mode: Mode, release: str):
    """cvt_warp_fp16_to_fp4 with E4M3 scales: (scale byte, codes)."""
    vec_max = _amax_16_bit(block)
    if mode.four_over_six:
        return _four_over_six_block(block, g, vec_max, mode, release)
    if not mode.fast_math:
        sf = mul(vec_max, mul(g, _f32(1.0 / 6.0))) if not _is_zero(vec_max) else 0.0
        byte = e4m3_byte(sf)
        narrow = e4m3_value(byte)
        output = fmin_flt_max(div(1.0, mul(narrow, div(1.0, g)))) if not _is_zero(vec_max) else 0.0
    else:
        sf = mul(g, mul(vec_max, rcp(6.0)))
        byte = e4m3_byte(sf)
        narrow = e4m3_value(byte)
        if release == "0.7.4":
            output = rcp(mul(narrow, rcp(g))) if byte != 0 else 0.0
        else:
            output = rcp(mul(narrow, rcp(g))) if not _is_zero(vec_max) else 0.0
    return byte, [e2m1_code(mul(x, output)) for x in block]


def _four_over_six_block(block, g, vec_max, mode: Mode, release: str):
    if _is_zero(vec_max):
        return 0, [0] * len(block)
    if not mode.fast_math:
        if release == "0.6.12":
            sf6 = mul(vec_max, div(g, 6.0))
        else:
            sf6 = mul(div(vec_max, 6.0), g)
    else:
        sf6 = mul(g, mul(vec_max, rcp(6.0)))
    sf4 = mul(sf6, 1.5)
    byte4, byte6 = e4m3_byte(sf4), e4m3_byte(sf6)
    value4, value6 = e4m3_value(byte4), e4m3_value(byte6)
    decode = div(1.0, g) if not mode.fast_math else rcp(g)
    if not mode.fast_math:
        output4, output6 = (fmin_flt_max(div(1.0, mul(v, decode))) for v in (value4, value6))
    else:
        output4, output6 = (rcp(mul(v, decode)) for v in (value4, value6))
    codes4 = [e2m1_code(mul(x, output4)) for x in block]
    codes6 = [e2m1_code(mul(x, output6)) for x in block]
    error4 = _block_error(block, g, codes4, value4, byte4, decode, mode, release)
    error6 = _block_error(block, g, codes6, value6, byte6, decode, mode, release)
    if error4 < error6:
        return byte4, codes4
    return byte6, codes6


def _block_error(block, g, codes, sf_value, sf_byte, decode, mode: Mode, release: str) -> float:
    error = 0.0
    for x, code in zip(block, codes):
        q = e2m1_value(code)
        if mode.fast_error and release == "0.6.12":
            # e2m1Val * sfValue * globalDecodeScale - inputVal; nvcc contracts the last multiply and the
            # subtraction into one fma, and error += diff * diff into another.
            difference = fma(mul(q, sf_value), decode, -x)
            if mode.mse:
                error = fma(difference, difference, error)
            else:
                error = add(error, abs(difference))
            continue
        if mode.fast_error:
            # e2m1x2_byte_scaled_e4m3_to_float2: q and the e4m3 scale in half precision, mul.rn.f16x2
            candidate = to_half(q * e4m3_value(sf_byte))
            difference = sub(candidate, mul(x, g))
        else:
            difference = sub(mul(mul(q, sf_value), decode), x)
        error = add(error, mul(difference, difference) if mode.mse else abs(difference))
    return error


def _mxfp4_block(block, release: str):
    """cvt_warp_fp16_to_fp4 with UE8M0 scales (the global scale is not read)."""
    vec_max = _amax_16_bit(block)
    if release == "0.7.4":
        scaled = mul(vec_max, rcp(6.0), ftz=False)  # mx_quantize_mul
        byte = e8m0_byte_round_up(scaled)
        exponent_field = max(254 - byte, 0)  # ue8m0_inverse_scale: uint_as_float(field << 23), 0 for byte 0
        output = 0.0 if byte == 0 or exponent_field == 0 else 2.0 ** (exponent_field - 127)
        return byte, [e2m1_code(mul(x, output, ftz=False)) for x in block]
    scaled = mul(vec_max, rcp(6.0))
    byte = e8m0_byte_round_up(scaled)
    power = flush(2.0 ** (127 - byte))  # exp2f_rcp: ex2.approx.ftz of an integer
    output = (1.0 if byte == 0 else power) if not _is_zero(scaled) else 0.0
    return byte, [e2m1_code(mul(x, output)) for x in block]


def _fp8_block(block, g, ue8m0: bool):
    """cvt_warp_fp8_to_fp4: dequantize to half with 6 * rcp(g), then scale (no switch reaches it)."""
    dequantize = mul(6.0, rcp(g))
    halves = [to_half(mul(x, dequantize)) for x in block]
    vec_max = None
    for h in halves:
        vec_max = abs(h) if vec_max is None else _hmax(vec_max, abs(h))
    sf = mul(g, mul(vec_max, rcp(6.0)))
    if ue8m0:
        byte = e8m0_byte_round_up(sf)
        narrow = e8m0_value(byte)
    else:
        byte = e4m3_byte(sf)
        narrow = e4m3_value(byte)
    output = mul(g, rcp(narrow)) if not _is_zero(sf) else 0.0
    return byte, [e2m1_code(mul(h, output)) for h in halves]


def quantize(rows: Sequence[Sequence[float]], global_scale: Optional[Sequence[float]], sf_vec_size: int,
             ue8m0: bool, fp8_input: bool = False, inversed: bool = False, mode: Mode = Mode(),
             release: str = "0.7.4"):
    """(packed bytes per row, scale bytes per row) for row-major input given as float values (the exact
    values of the fp16/bf16/e4m3 elements). ``global_scale``: one value, or one per row; None is 1."""
    packed, scales = [], []
    for index, row in enumerate(rows):
        if global_scale is None:
            g = 1.0
        else:
            g = _f32(global_scale[index] if len(global_scale) > 1 else global_scale[0])
            if inversed:
                g = div(1.0, g) if not mode.fast_math and not fp8_input else rcp(g)
        row_codes, row_scales = [], []
        for start in range(0, len(row), sf_vec_size):
            block = [float(v) for v in row[start:start + sf_vec_size]]
            if fp8_input:
                byte, codes = _fp8_block(block, g, ue8m0)
            elif ue8m0:
                byte, codes = _mxfp4_block(block, release)
            else:
                byte, codes = _nvfp4_block(block, g, mode, release)
            row_scales.append(byte)
            row_codes.extend(codes)
        packed.append([row_codes[i] | row_codes[i + 1] << 4 for i in range(0, len(row_codes), 2)])
        scales.append(row_scales)
    return packed, scales


# --- where the scale bytes go (quantization_utils.cuh get_sf_out_offset_*) ---------------------------

def offset_128x4(row: int, column: int, columns: int) -> int:
    k_tiles = (columns + 3) // 4
    return ((row // 128) * k_tiles * 512 + (column // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4
            + column % 4)


def offset_8x4(row: int, column: int, columns: int) -> int:
    k_tiles = (columns + 3) // 4
    return (row // 8) * k_tiles * 32 + (column // 4) * 32 + (row % 8) * 4 + column % 4


def swizzled(scales: Sequence[Sequence[int]], columns: int, is_8x4: bool) -> list:
    """The flat swizzled buffer: padded to whole row tiles and to a multiple of 4 columns, zeros there."""
    tile = 8 if is_8x4 else 128
    padded_rows = -(-len(scales) // tile) * tile
    buffer = [0] * (padded_rows * -(-columns // 4) * 4)
    place = offset_8x4 if is_8x4 else offset_128x4
    for r, row in enumerate(scales):
        for c, byte in enumerate(row):
            buffer[place(r, c, columns)] = byte
    return buffer
