"""Environment variables, read once per ``apply()`` so nothing on the hot path touches ``os.environ``."""

from __future__ import annotations

import dataclasses
import os

#: Set to 1 to make ``import fp4_dynamo_shim`` (and the hooks) do nothing.
DISABLE = "FP4_DYNAMO_SHIM_DISABLE"
#: Set to 1 to turn "unsupported FlashInfer" and apply failures into exceptions.
STRICT = "FP4_DYNAMO_SHIM_STRICT"
#: ``torch`` (default), ``nvcc`` or an explicit ``X.Y``: the CUDA version FlashInfer's JIT sees.
CUDA_VERSION = "FP4_DYNAMO_SHIM_CUDA_VERSION"
#: What to do on a GPU without the FP4 kernel (SM < 100): ``error`` (default), ``reference``, or
#: ``launch`` (launch FlashInfer's empty kernel anyway; outputs are uninitialized: benchmarks only).
FALLBACK = "FP4_DYNAMO_SHIM_FALLBACK"
#: Set to 1 to have the import hook apply the shim in every process that imports flashinfer.
HOOK = "FP4_DYNAMO_SHIM"

FALLBACK_CHOICES = ("error", "reference", "launch")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def disabled() -> bool:
    return _flag(DISABLE)


@dataclasses.dataclass(frozen=True)
class Settings:
    strict: bool
    cuda_version: str
    fallback: str

    @classmethod
    def from_environment(cls) -> "Settings":
        fallback = os.environ.get(FALLBACK, "error").strip().lower() or "error"
        if fallback not in FALLBACK_CHOICES:
            raise ValueError(f"{FALLBACK}={fallback!r}: expected one of {', '.join(FALLBACK_CHOICES)}")
        return cls(
            strict=_flag(STRICT),
            cuda_version=os.environ.get(CUDA_VERSION, "torch").strip() or "torch",
            fallback=fallback,
        )
