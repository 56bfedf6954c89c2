"""What differs between FlashInfer releases, as data.

Every ``if version ...`` the shim needs is a column here; code reads the row for
the installed release (:func:`target_for`) and never compares versions itself.
Rows were read off the released wheels (``fp4_quantize`` and the
``fp4_quantize_sm100`` closure inside ``get_fp4_quantization_module``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from packaging.specifiers import SpecifierSet

from ..versions import row_for
from .arithmetic import Arithmetic

#: Kernel-entry arguments after ``(input, global_scale, out_val, out_sf)``, by generation.
#: The JIT getter's closure around the JIT entry, and the entry's name in the JIT module: every FP4 kernel is
#: called through the module this closure captures (kernels.jit_module_of), with the row's ``kernel_args``.
QUANTIZE_CLOSURE, JIT_ENTRY = "fp4_quantize_sm100", "fp4_quantize"
_KERNEL_ARGS_BASE = ("sf_vec_size", "sf_use_ue8m0", "is_sf_swizzled_layout", "is_sf_8x4_layout", "enable_pdl")
_KERNEL_ARGS_INVERSED = (
    "sf_vec_size", "sf_use_ue8m0", "is_sf_swizzled_layout", "is_sf_8x4_layout",
    "is_global_scale_inversed", "enable_pdl",
)
_KERNEL_ARGS_4OVER6 = _KERNEL_ARGS_INVERSED + ("nvfp4_4over6_code",)


@dataclasses.dataclass(frozen=True)
class Target:
    """How one range of FlashInfer releases implements ``fp4_quantize``."""

    versions: SpecifierSet
    #: Module that defines ``fp4_quantize`` and ``get_fp4_quantization_module``.
    module: str
    #: Order of the scalar arguments ``module.fp4_quantize`` takes after the four tensors.
    kernel_args: tuple
    #: Swizzled scale factors come back as ``(-1, round_up(K/sfv, 4))`` (else ``(-1, K/sfv)``).
    swizzled_sf_padded_columns: bool
    #: The linear scale-factor buffer is allocated for ``round_up(M, n)`` rows, then sliced to M.
    linear_sf_row_alignment: int
    #: ``global_scale`` is converted to float32 on the input's device (else it must already be).
    converts_global_scale: bool
    #: ``global_scale`` may hold one value per row.
    row_wise_global_scale: bool = False
    #: The kernel's arithmetic beyond the default recipe: the switches it reads, its edge rules.
    arithmetic: Arithmetic = Arithmetic()
    #: FlashInfer's own ``torch.ops.flashinfer.fp4_quantize``: None (absent), "positional" (its body passes
    #: enable_pdl into is_global_scale_inversed) or "keyword" (fixed in 0.7.1). Its fake returns contiguous
    #: outputs for column-major input in every release that has it, so the shim repairs it in all of them.
    flashinfer_op: Optional[str] = None


_QUANTIZATION = "flashinfer.quantization.fp4_quantization"
_LEGACY = "flashinfer.fp4_quantization"

_FAST_MATH_0_6_12 = ("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH",)
_FAST_MATH_0_6_13 = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
_ARITHMETIC_0_6_12 = Arithmetic(_FAST_MATH_0_6_12, "environment", four_over_six_formula=1)
_ARITHMETIC_0_6_13 = Arithmetic(_FAST_MATH_0_6_13, "environment")
_ARITHMETIC_0_7_1 = Arithmetic(_FAST_MATH_0_6_13, "code")
_ARITHMETIC_0_7_4 = Arithmetic(_FAST_MATH_0_6_13, "code", zero_scale="byte", mxfp4_keeps_subnormals=True)

TARGETS = (
    Target(SpecifierSet(">=0.5.3,<0.6.7"), _LEGACY, _KERNEL_ARGS_BASE, False, 1, False),
    Target(SpecifierSet(">=0.6.7,<0.6.8"), _QUANTIZATION, _KERNEL_ARGS_BASE, False, 16, False),
    Target(SpecifierSet(">=0.6.8,<0.6.11"), _QUANTIZATION, _KERNEL_ARGS_BASE, True, 16, False),
    Target(SpecifierSet(">=0.6.11,<0.6.12"), _QUANTIZATION, _KERNEL_ARGS_INVERSED, True, 16, False),
    Target(SpecifierSet(">=0.6.12,<0.6.13"), _QUANTIZATION, _KERNEL_ARGS_INVERSED, True, 16, False,
           arithmetic=_ARITHMETIC_0_6_12, flashinfer_op="positional"),
    Target(SpecifierSet(">=0.6.13,<0.7.1"), _QUANTIZATION, _KERNEL_ARGS_INVERSED, True, 16, True,
           arithmetic=_ARITHMETIC_0_6_13, flashinfer_op="positional"),
    Target(SpecifierSet(">=0.7.1,<0.7.4"), _QUANTIZATION, _KERNEL_ARGS_4OVER6, True, 16, True,
           arithmetic=_ARITHMETIC_0_7_1, flashinfer_op="keyword"),
    Target(SpecifierSet(">=0.7.4,<0.7.5"), _QUANTIZATION, _KERNEL_ARGS_4OVER6, True, 1, True, row_wise_global_scale=True,
           arithmetic=_ARITHMETIC_0_7_4, flashinfer_op="keyword"),
)

def describe(target: Target) -> dict:
    """The row as JSON-serialisable data, for status()."""
    row = dataclasses.asdict(target)
    row["versions"], row["kernel_args"] = str(target.versions), list(target.kernel_args)
    row["arithmetic"]["fast_math_switches"] = list(target.arithmetic.fast_math_switches)
    return row


def target_for(version: str) -> Optional[Target]:
    """The row for an installed FlashInfer version string, or None when it is not supported."""
    return row_for(version, TARGETS)
