"""The oracle's reading of which kernel mode a launch runs in, per release: the switch variables the C++ side
reads (``cpp/common/envUtils.cpp``) and the 0.7.1+ recipe code (``nvfp4Recipe.h``), read off each wheel's
sources without looking at the shim's own switch parsing (``fp4_oracle.py`` says why).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

#: envUtils.cpp getEnvDisableFP4QuantFastMath(): the variables of which one "1" switches fast math off.
FAST_MATH_SWITCHES = {
    "legacy": (),  # before 0.6.12 the kernel reads no switch
    "0.6.12": ("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH",),
    "0.6.13": ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH"),
    "0.7.1": ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH"),
    "0.7.4": ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH"),
}
#: Releases whose NVFP4 kernel has the 4over6 recipe.
HAS_FOUR_OVER_SIX = {"legacy": False, "0.6.12": True, "0.6.13": True, "0.7.1": True, "0.7.4": True}


def release_of(version: str) -> str:
    """The oracle's arithmetic for an installed FlashInfer version (its sources changed at these releases)."""
    parts = tuple(int(p) for p in version.split("+")[0].split(".post")[0].split(".")[:3])
    if parts >= (0, 7, 4):
        return "0.7.4"
    if parts >= (0, 7, 1):
        return "0.7.1"
    if parts >= (0, 6, 13):
        return "0.6.13"
    if parts >= (0, 6, 12):
        return "0.6.12"
    return "legacy"


@dataclasses.dataclass(frozen=True)
class Mode:
    """One kernel launch's switches: fast math, and the 4over6 recipe (None: off)."""

    fast_math: bool = True
    four_over_six: bool = False
    mse: bool = False
    fast_error: bool = False


def _bool_env(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name)
    return value is not None and value == "1"  # getBoolEnv: env[0] == '1' && env[1] == '\0'


def mode_from_environment(release: str, environ: Mapping[str, str]) -> Mode:
    """What the C++ side reads per launch (0.6.12-0.7.0 always; 0.7.1+ when the code is -1)."""
    fast_math = not any(_bool_env(environ, name) for name in FAST_MATH_SWITCHES[release])
    if not HAS_FOUR_OVER_SIX[release] or not _bool_env(environ, "FLASHINFER_NVFP4_4OVER6"):
        return Mode(fast_math)
    error_mode = environ.get("FLASHINFER_NVFP4_4OVER6_ERR_MODE")
    if error_mode is not None and error_mode.upper() not in ("MAE", "MSE"):
        raise ValueError("FLASHINFER_NVFP4_4OVER6_ERR_MODE must be MAE or MSE.")
    return Mode(fast_math, True, error_mode is not None and error_mode.upper() == "MSE",
                _bool_env(environ, "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH"))


def mode_from_code(release: str, code: int, environ: Mapping[str, str]) -> Mode:
    """nvfp4Recipe.h (0.7.1+): -1 reads the environment, bit 0 switches 4over6 on, bit 1 is e4m3Max (not
    read by fp4_quantize's kernel), bits 2-3 the error mode (0 MAE, 1 MSE), bit 4 the fast error."""
    if code == -1:
        return mode_from_environment(release, environ)
    fast_math = not any(_bool_env(environ, name) for name in FAST_MATH_SWITCHES[release])
    if code & 1 == 0:
        return Mode(fast_math)
    if code >> 5 or (code >> 2) & 3 > 1:
        raise ValueError(f"invalid nvfp4_4over6 code {code}")
    return Mode(fast_math, True, (code >> 2) & 3 == 1, bool(code >> 4 & 1))
