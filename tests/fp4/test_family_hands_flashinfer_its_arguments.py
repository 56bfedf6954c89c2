"""What the FP4 family's GPU path hands FlashInfer: each ``*_flashinfer`` adapter against stand-ins of
FlashInfer's functions with the signatures of FlashInfer 0.7.4's (``flashinfer/quantization/fp4_quantization.py``,
``flashinfer/gemm/gemm_base.py``), or of an older release's without the trailing parameter, returning CPU tensors
shaped as the real ones return theirs. They compute nothing: FlashInfer's values are test_gpu_family.py's, and
test_family_parity.py compares the module calls with those FlashInfer's own functions make. The adapters run only
on a GPU, so they are called here through the op table ``family_ops.OPS``.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from _fp4_dynamo_shim.errors import InvalidArgumentError, ShimError
from _fp4_dynamo_shim.fp4 import devices
from _fp4_dynamo_shim.fp4 import family_ops

OPS = {op.name: op for op in family_ops.OPS}
U8, BF16 = torch.uint8, torch.bfloat16
# FlashInfer's FP4 module namespace as apply() loads it for one GPU; the adapters only pass it on.
MODULE = types.SimpleNamespace(gpu=0)


def closure(parameters, returns):
    """A stand-in for one of FlashInfer's functions: takes exactly ``parameters`` (FlashInfer's names, so the
    adapters can ask which it has), records each call's positional arguments, returns ``returns`` (or what
    ``returns`` computes from them)."""
    signature = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for name in parameters])
    calls = []

    def function(*arguments):
        signature.bind(*arguments)  # a TypeError, as from FlashInfer's own function, for an argument too many
        calls.append(arguments)
        return returns(*arguments) if callable(returns) else returns

    function.__signature__ = signature
    function.calls = calls
    return function


DEQUANTIZE = ("e2m1_tensor", "ufp8_scale_tensor", "global_scale_tensor", "sf_vec_size", "ufp8_type",
              "is_sf_swizzled_layout")
BATCHED = ("input", "global_scale", "sf_vec_size", "sf_use_ue8m0")


@pytest.mark.parametrize("has_8x4", [True, False], ids=["with is_sf_8x4_layout", "an older release's, without"])
def test_dequantize_hands_flashinfers_host_closure_the_8x4_flag_only_where_it_takes_one(has_8x4):
    e2m1, sf, global_scale = torch.zeros(2, 8, dtype=U8), torch.zeros(128 * 4, dtype=U8), torch.ones(1)
    dequantized = torch.zeros(2, 16)  # FlashInfer's host output: [M, K] float32 on the CPU
    function = closure(DEQUANTIZE + (("is_sf_8x4_layout",) if has_8x4 else ()), dequantized)
    namespace = types.SimpleNamespace(e2m1_and_ufp8sf_scale_to_float_sm100=function)
    got = OPS["e2m1_and_ufp8sf_scale_to_float"].via_flashinfer(namespace, e2m1, sf, global_scale, 16, 1, True, True)
    assert got is dequantized
    assert function.calls == [(e2m1, sf, global_scale, 16, 1, True) + ((True,) if has_8x4 else ())]


@pytest.mark.parametrize("has_code", [True, False], ids=["with nvfp4_4over6_code", "an older release's, without"])
def test_batched_quantize_hands_flashinfer_the_recipe_code_only_where_it_takes_one(has_code):
    x, global_scale = torch.zeros(2, 4, 32, dtype=BF16), torch.ones(1)
    # FlashInfer's outputs: [B, M, K/2] values and [B, round_up(M, 128) * round_up(K/16, 4)] scale factors.
    outputs = (torch.zeros(2, 4, 16, dtype=U8), torch.zeros(2, 128 * 4, dtype=U8))
    function = closure(BATCHED + (("nvfp4_4over6_code",) if has_code else ()), outputs)
    namespace = types.SimpleNamespace(fp4_batched_quantize_sm100=function)
    assert OPS["fp4_batched_quantize"].via_flashinfer(namespace, x, global_scale, 16, True, 7) is outputs
    assert function.calls == [(x, global_scale, 16, True) + ((7,) if has_code else ())]


def test_host_dequantize_and_interleave_hand_flashinfer_their_arguments_as_they_are():
    weight, scale, sf = torch.zeros(2, 16, dtype=U8), torch.zeros(2, 1, dtype=U8), torch.zeros(2, 4, dtype=U8)
    dequantized, interleaved = torch.zeros(2, 32), torch.zeros(128 * 4, dtype=U8)
    namespace = types.SimpleNamespace(
        mxfp4_dequantize_host=closure(("weight", "scale", "group_size"), dequantized),
        block_scale_interleave_sm100=closure(("unswizzled_sf",), interleaved))
    assert OPS["mxfp4_dequantize_host"].via_flashinfer(namespace, weight, scale, 32) is dequantized
    assert namespace.mxfp4_dequantize_host.calls == [(weight, scale, 32)]
    assert OPS["block_scale_interleave"].via_flashinfer(namespace, sf) is interleaved
    assert namespace.block_scale_interleave_sm100.calls == [(sf,)]


def flashinfers_experts_quantizer(parameters, silu):
    """FlashInfer's grouped or silu-and-mul quantizer (fp4_quantization.py, 0.7.4): fresh buffers, here filled
    with a pattern for the kernel's writes, returned as the permuted views FlashInfer returns (kept in
    ``.returned``, the buffers in ``.buffers``)."""

    def quantize(input, *_):
        experts, rows, columns = input.shape
        k = columns // 2 if silu else columns
        padded_k, padded_rows = (k // 16 + 3) // 4 * 4, (rows + 127) // 128 * 128
        values = (torch.arange(experts * rows * (k // 2)) % 251).to(U8).view(experts, rows, k // 2)
        scales = torch.arange(experts * padded_rows * (padded_k // 4), dtype=torch.int32).view(
            experts, padded_rows, padded_k // 4)
        scale_view = scales.view(torch.float8_e4m3fn).view(experts, padded_rows // 128, padded_k // 4, 32, 4, 4)
        function.buffers = (values, scales)
        function.returned = (values.permute(1, 2, 0), scale_view.permute(3, 4, 1, 5, 2, 0))
        return function.returned

    function = closure(parameters, quantize)
    return function


# Rows that pad to 256 and columns that do not: the returned buffers' shape depends on telling them apart, and
# K/16 = 32 scale columns are 8 int32 words, enough for a wrong word count to change the views.
ROWS, K = 130, 512
EXPERTS_CASES = [
    (False, ("input_tensor", "input_global_scale", "mask"), "scaled_fp4_grouped_quant_sm100"),
    (True, ("input", "mask", "global_scale"), "silu_and_mul_scaled_nvfp4_experts_quantize_sm100"),
]


@pytest.mark.parametrize("silu, parameters, function", EXPERTS_CASES, ids=["grouped", "silu_and_mul"])
@pytest.mark.parametrize("has_code", [True, False], ids=["with nvfp4_4over6_code", "an older release's, without"])
def test_experts_quantize_calls_flashinfers_quantizer_and_returns_the_buffers_under_its_views(
        silu, parameters, function, has_code):
    x = torch.zeros(2, ROWS, 2 * K if silu else K, dtype=BF16)
    global_scale, mask = torch.ones(2), torch.tensor([ROWS, 17], dtype=torch.int32)
    quantizer = flashinfers_experts_quantizer(parameters + (("nvfp4_4over6_code",) if has_code else ()), silu)
    namespace = types.SimpleNamespace(**{function: quantizer})
    values, scales = OPS["fp4_experts_quantize"].via_flashinfer(namespace, x, global_scale, mask, silu, 7)
    # The two FlashInfer-specific argument orders, and the code only where the closure takes it.
    ordered = (x, mask, global_scale) if silu else (x, global_scale, mask)
    assert quantizer.calls == [ordered + ((7,) if has_code else ())]
    # The op returns FlashInfer's buffers themselves, shaped and laid out as its fake says.
    fake_values, fake_scales = OPS["fp4_experts_quantize"].fake(x, global_scale, mask, silu, 7)
    for got, buffer, fake in zip((values, scales), quantizer.buffers, (fake_values, fake_scales)):
        assert (got.shape, got.stride(), got.dtype) == (fake.shape, fake.stride(), fake.dtype)
        assert (got.shape, got.data_ptr()) == (buffer.shape, buffer.data_ptr())
    # experts_views turns them back into exactly the views FlashInfer returned.
    for view, returned in zip(family_ops.experts_views(values, scales), quantizer.returned):
        assert described(view) == described(returned)


def described(view):
    return tuple(view.shape), view.stride(), view.dtype, view.data_ptr()


def test_silu_experts_quantize_checks_the_halved_columns_before_flashinfer_is_called():
    quantizer = flashinfers_experts_quantizer(EXPERTS_CASES[1][1], silu=True)
    namespace = types.SimpleNamespace(silu_and_mul_scaled_nvfp4_experts_quantize_sm100=quantizer)
    x = torch.zeros(2, 4, 48, dtype=BF16)  # 24 columns after silu_and_mul: not a multiple of 16
    with pytest.raises(InvalidArgumentError) as refused:
        OPS["fp4_experts_quantize"].via_flashinfer(namespace, x, torch.ones(2), torch.tensor([4, 4], dtype=torch.int32), True, 0)
    assert str(refused.value) == ("silu_and_mul_scaled_nvfp4_experts_quantize: the last dimension (24) must be a "
                                  "multiple of 16")
    assert quantizer.calls == []


# mm_fp4 -------------------------------------------------------------------------------------------------------
MM_FP4 = ("a", "b", "a_descale", "b_descale", "alpha", "out_dtype", "out", "block_size", "use_8x4_sf_layout",
          "backend", "use_nvfp4")


def flashinfers_mm_fp4(has_enable_pdl):
    """FlashInfer's public mm_fp4 (its 0.7.4 parameters, or an older release's without enable_pdl): records
    each call's arguments and returns an [M, N] product."""
    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if position < 4 else None)  # defaults from alpha on
                  for position, name in enumerate(MM_FP4 + (("enable_pdl",) if has_enable_pdl else ()))]
    signature = inspect.Signature(parameters)
    calls = []

    def mm_fp4(*arguments, **keywords):
        signature.bind(*arguments, **keywords)
        calls.append((arguments, keywords))
        return mm_fp4.product

    mm_fp4.__signature__, mm_fp4.calls, mm_fp4.product = signature, calls, torch.zeros(2, 3, dtype=BF16)
    return mm_fp4


# Operands the adapter only hands on, compared by identity.
OPERANDS = tuple(types.SimpleNamespace(name=name) for name in ("a", "b", "a_descale", "b_descale", "alpha"))
# Every value differs from FlashInfer's default and from None, so a dropped or emptied one shows.
SETTINGS = dict(out_dtype=torch.float16, block_size=32, use_8x4_sf_layout=True, backend="cutlass", use_nvfp4=False)


@pytest.mark.parametrize("has_enable_pdl, enable_pdl, passed", [
    (True, True, {"enable_pdl": True}),
    (True, False, {"enable_pdl": False}),
    (True, None, {}),  # not asked for: FlashInfer's default
    (False, True, {}),  # a release without the parameter
], ids=["pdl-on", "pdl-off", "pdl-unset", "older-release"])
def test_mm_fp4_calls_flashinfers_own_mm_fp4_with_every_setting_by_name(has_enable_pdl, enable_pdl, passed):
    mm_fp4 = flashinfers_mm_fp4(has_enable_pdl)
    a, b, a_descale, b_descale, alpha = OPERANDS
    with devices.overridden(mm_fp4=mm_fp4):
        got = OPS["mm_fp4"].via_flashinfer(MODULE, a, b, a_descale, b_descale, alpha, *SETTINGS.values(),
                                            enable_pdl)
    assert got is mm_fp4.product
    assert mm_fp4.calls == [((a, b, a_descale, b_descale), dict(alpha=alpha, **SETTINGS, **passed))]


def test_mm_fp4_says_the_shim_is_not_applied_when_flashinfers_mm_fp4_was_not_kept():
    with devices.overridden(mm_fp4=None):
        with pytest.raises(ShimError) as missing:
            OPS["mm_fp4"].via_flashinfer(MODULE, *OPERANDS, *SETTINGS.values(), True)
    assert str(missing.value) == "fp4_dynamo_shim: mm_fp4 is not available (the shim is not applied)"


@pytest.mark.parametrize("a_shape, b_shape, said", [
    ((1, 2, 4), (4, 3), "mm_fp4: a and b must be 2-D, got (1, 2, 4) and (4, 3)"),
    ((2, 4), (4, 3, 1), "mm_fp4: a and b must be 2-D, got (2, 4) and (4, 3, 1)"),
    ((2, 4), (8, 3), "mm_fp4: a (2, 4) and b (8, 3) do not multiply (b is the transpose of an [N, K/2] packed weight)"),
])
def test_mm_fp4s_fake_refuses_operands_that_do_not_multiply_in_words_that_show_them(a_shape, b_shape, said):
    with pytest.raises(InvalidArgumentError) as refused:
        OPS["mm_fp4"].fake(torch.zeros(a_shape, dtype=U8), torch.zeros(b_shape, dtype=U8), None, None, None,
                                BF16, 16, False, "auto", True, None)
    assert str(refused.value) == said


def test_mm_fp4s_fake_gives_an_m_by_n_product_of_the_asked_dtype():
    product = OPS["mm_fp4"].fake(torch.zeros(2, 4, dtype=U8), torch.zeros(4, 3, dtype=U8), None, None, None,
                                      torch.float16, 16, False, "auto", True, None)
    assert (product.shape, product.dtype) == ((2, 3), torch.float16)
