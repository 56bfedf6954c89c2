"""The project's environment variables, read once per ``apply()`` so nothing on the hot path touches
``os.environ``. On/off switches are parsed by the start-up hook module's :func:`switch`, so the hook and
the package agree on every value."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Tuple

import fp4_dynamo_shim_hook as _startup

#: Set to 1 to have the import hook apply the shim in every process that imports flashinfer.
HOOK = _startup.HOOK_VARIABLE
#: Set to 1 to switch the shim off on every route (import, hook, sitecustomize, plugin).
DISABLE = _startup.DISABLE_VARIABLE
#: Set to 1 to turn every refusal (unsupported FlashInfer, failed apply, unknown values) into an exception.
STRICT = "FP4_DYNAMO_SHIM_STRICT"
#: ``torch`` (default), ``nvcc`` or an explicit ``X.Y``: the CUDA version FlashInfer's JIT sees.
CUDA_VERSION = "FP4_DYNAMO_SHIM_CUDA_VERSION"
#: What to do on a GPU without the FP4 kernel (SM < 100): ``error`` (default), ``reference``, or
#: ``launch`` (launch FlashInfer's empty kernel anyway; outputs are uninitialized: benchmarks only).
FALLBACK = "FP4_DYNAMO_SHIM_FALLBACK"

FALLBACK_CHOICES = ("error", "reference", "launch")
#: Which of FlashInfer's own declared ops become real ops (``declared_ops``): ``sglang`` (default: what
#: SGLang's traced paths call raw, ``declared_rules.SGLANG``), ``all``, or ``off``.
FLASHINFER_OPS = "FP4_DYNAMO_SHIM_FLASHINFER_OPS"
FLASHINFER_OPS_CHOICES = ("sglang", "all", "off")

switch = _startup.switch
#: Warnings the start-up module has printed in this process (the same message is not printed twice).
startup_warnings = _startup.warned


@dataclasses.dataclass(frozen=True)
class Settings:
    strict: bool
    disabled: bool
    cuda_version: str
    fallback: str
    #: One message per variable whose value was not understood (its default was used instead).
    problems: Tuple[str, ...] = ()
    flashinfer_ops: str = FLASHINFER_OPS_CHOICES[0]

    @classmethod
    def from_environment(cls) -> "Settings":
        problems = []
        strict, problem = switch(STRICT)
        problems += [problem] if problem else []
        disabled, problem = switch(DISABLE)
        problems += [problem] if problem else []
        _, problem = switch(HOOK)  # read by the .pth hook at start-up; here so the same rule holds for it
        problems += [problem] if problem else []
        fallback = os.environ.get(FALLBACK, "").strip().lower() or "error"
        if fallback not in FALLBACK_CHOICES:
            problems.append(f"{FALLBACK}={os.environ[FALLBACK]!r} is not understood; use one of "
                            f"{', '.join(FALLBACK_CHOICES)} (treated as error)")
            fallback = "error"
        cuda_version = os.environ.get(CUDA_VERSION, "").strip() or "torch"
        if cuda_version not in ("torch", "nvcc") and not re.fullmatch(r"\d+\.\d+(\.\d+)?", cuda_version):
            problems.append(f"{CUDA_VERSION}={os.environ[CUDA_VERSION]!r} is not understood; use torch, nvcc or a "
                            "version like 12.8 (treated as torch)")
            cuda_version = "torch"
        gate = os.environ.get(FLASHINFER_OPS, "").strip().lower() or FLASHINFER_OPS_CHOICES[0]
        if gate not in FLASHINFER_OPS_CHOICES:
            problems.append(f"{FLASHINFER_OPS}={os.environ[FLASHINFER_OPS]!r} is not understood; use one of "
                            f"{', '.join(FLASHINFER_OPS_CHOICES)} (treated as {FLASHINFER_OPS_CHOICES[0]})")
            gate = FLASHINFER_OPS_CHOICES[0]
        return cls(strict, disabled, cuda_version, fallback, tuple(problems), gate)
