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
from packaging.version import Version

#: Kernel-entry arguments after ``(input, global_scale, out_val, out_sf)``, by generation.
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


_QUANTIZATION = "flashinfer.quantization.fp4_quantization"
_LEGACY = "flashinfer.fp4_quantization"

TARGETS = (
    Target(SpecifierSet(">=0.5.3,<0.6.7"), _LEGACY, _KERNEL_ARGS_BASE, False, 1, False),
    Target(SpecifierSet(">=0.6.7,<0.6.8"), _QUANTIZATION, _KERNEL_ARGS_BASE, False, 16, False),
    Target(SpecifierSet(">=0.6.8,<0.6.11"), _QUANTIZATION, _KERNEL_ARGS_BASE, True, 16, False),
    Target(SpecifierSet(">=0.6.11,<0.6.13"), _QUANTIZATION, _KERNEL_ARGS_INVERSED, True, 16, False),
    Target(SpecifierSet(">=0.6.13,<0.7.1"), _QUANTIZATION, _KERNEL_ARGS_INVERSED, True, 16, True),
    Target(SpecifierSet(">=0.7.1,<0.7.4"), _QUANTIZATION, _KERNEL_ARGS_4OVER6, True, 16, True),
    Target(SpecifierSet(">=0.7.4,<0.7.5"), _QUANTIZATION, _KERNEL_ARGS_4OVER6, True, 1, True, row_wise_global_scale=True),
)

SUPPORTED_RANGE = "flashinfer-python >=0.5.3, <=0.7.4"


def describe(target: Target) -> dict:
    """The row as JSON-serialisable data, for status()."""
    row = dataclasses.asdict(target)
    row["versions"], row["kernel_args"] = str(target.versions), list(target.kernel_args)
    return row


def target_for(version: str) -> Optional[Target]:
    """The row for an installed FlashInfer version string, or None when it is not supported."""
    parsed = Version(version)
    # Treat local builds ("0.6.3+cu128") like the release they were cut from.
    release = Version(parsed.public)
    for target in TARGETS:
        if target.versions.contains(release, prereleases=True):
            return target
    return None
