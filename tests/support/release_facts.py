"""What each FlashInfer release does, written down release by release from its wheel, for the tests.

Independent of ``_fp4_dynamo_shim.fp4.fp4_releases`` on purpose: a test whose expectation comes from the row it
tests passes whatever the row says. Read off the released wheels (``fp4_quantize`` and the
``fp4_quantize_sm100`` closure in ``get_fp4_quantization_module``; the family functions' signatures).
"""

from __future__ import annotations

import dataclasses

import pytest

from _fp4_dynamo_shim import lifecycle

LEGACY = "flashinfer.fp4_quantization"
QUANTIZATION = "flashinfer.quantization.fp4_quantization"
BASE = ("sf_vec_size", "sf_use_ue8m0", "is_sf_swizzled_layout", "is_sf_8x4_layout", "enable_pdl")
INVERSED = ("sf_vec_size", "sf_use_ue8m0", "is_sf_swizzled_layout", "is_sf_8x4_layout", "is_global_scale_inversed",
            "enable_pdl")
FOUR_OVER_SIX = INVERSED + ("nvfp4_4over6_code",)


@dataclasses.dataclass(frozen=True)
class Facts:
    module: str
    #: ``module.fp4_quantize(input, global_scale, out_val, out_sf, <these>)`` in the closure.
    kernel_args: tuple
    #: Swizzled scale factors are viewed as ``(-1, round_up(K/sfv, 4))`` (else ``(-1, K/sfv)``).
    swizzled_sf_padded_columns: bool
    #: Rows the linear scale buffer is allocated for: ``round_up(M, this)``.
    linear_sf_row_alignment: int
    #: ``global_scale.to(device=input.device, dtype=torch.float32)`` in ``fp4_quantize``.
    converts_global_scale: bool
    #: ``fp4_quantize`` takes a global scale with one value per row.
    row_wise_global_scale: bool
    #: ``nvfp4_batched_quantize`` takes a global scale with one value per row.
    per_row_batched_global_scale: bool
    #: envUtils.cpp: the variables that switch fast math off (getBoolEnv: exactly "1").
    fast_math_switches: tuple = ()
    #: How 4over6 reaches the kernel: "none", "environment" (C++ reads FLASHINFER_NVFP4_4OVER6* per launch),
    #: "code" (the nvfp4_4over6 argument, resolved by Python; the environment when it is left out).
    four_over_six: str = "none"
    #: quantization_utils.cuh: the output scale is 0 only for a zero block ("amax", where a scale that rounds
    #: to e4m3 zero gives rcp(0) = inf) or whenever the scale byte is 0 ("byte", from 0.7.4).
    zero_scale: str = "amax"
    #: MXFP4 without flush-to-zero (0.7.4's mx_quantize_mul).
    mxfp4_keeps_subnormals: bool = False
    #: torch.ops.flashinfer.fp4_quantize's body: None (no op), "positional" or "keyword".
    flashinfer_op: str | None = None


def _facts(module, kernel_args, padded, alignment, converts, row_wise=False, batched_per_row=False, **kernel):
    return Facts(module, kernel_args, padded, alignment, converts, row_wise, batched_per_row, **kernel)


TRTLLM = ("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH",)
BOTH = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")


FACTS = {
    "0.5.3": _facts(LEGACY, BASE, False, 1, False),
    "0.6.0": _facts(LEGACY, BASE, False, 1, False),
    "0.6.1": _facts(LEGACY, BASE, False, 1, False),
    "0.6.3": _facts(LEGACY, BASE, False, 1, False),
    "0.6.7.post2": _facts(QUANTIZATION, BASE, False, 16, False),
    "0.6.8.post1": _facts(QUANTIZATION, BASE, True, 16, False),
    "0.6.11.post1": _facts(QUANTIZATION, INVERSED, True, 16, False, batched_per_row=True),
    "0.6.12": _facts(QUANTIZATION, INVERSED, True, 16, False, batched_per_row=True, fast_math_switches=TRTLLM,
                     four_over_six="environment", flashinfer_op="positional"),
    "0.6.13": _facts(QUANTIZATION, INVERSED, True, 16, True, batched_per_row=True, fast_math_switches=BOTH,
                     four_over_six="environment", flashinfer_op="positional"),
    "0.6.15.post1": _facts(QUANTIZATION, INVERSED, True, 16, True, batched_per_row=True, fast_math_switches=BOTH,
                           four_over_six="environment", flashinfer_op="positional"),
    "0.6.16": _facts(QUANTIZATION, INVERSED, True, 16, True, batched_per_row=True, fast_math_switches=BOTH,
                     four_over_six="environment", flashinfer_op="positional"),
    "0.6.18": _facts(QUANTIZATION, INVERSED, True, 16, True, batched_per_row=True, fast_math_switches=BOTH,
                     four_over_six="environment", flashinfer_op="positional"),
    "0.7.1": _facts(QUANTIZATION, FOUR_OVER_SIX, True, 16, True, batched_per_row=True, fast_math_switches=BOTH,
                    four_over_six="code", flashinfer_op="keyword"),
    "0.7.2": _facts(QUANTIZATION, FOUR_OVER_SIX, True, 16, True, batched_per_row=True, fast_math_switches=BOTH,
                    four_over_six="code", flashinfer_op="keyword"),
    "0.7.4": _facts(QUANTIZATION, FOUR_OVER_SIX, True, 1, True, row_wise=True, batched_per_row=True,
                    fast_math_switches=BOTH, four_over_six="code", zero_scale="byte", mxfp4_keeps_subnormals=True,
                    flashinfer_op="keyword"),
}


def installed_facts() -> Facts:
    version = lifecycle.flashinfer_version()
    if version not in FACTS:
        pytest.skip(f"no written-down facts for flashinfer-python {version}; add its row to tests/support/release_facts.py")
    return FACTS[version]
