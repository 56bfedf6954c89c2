"""The shim's settings, read once per ``apply()`` so nothing on the hot path touches ``os.environ``.

Every variable is a row of :data:`switches.VARIABLES` and is parsed by :func:`switches.read`: the start-up hook
and the package agree on every value, and every variable follows the same case, whitespace and unknown-word
rules.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

from . import switches
from .switches import CUDA_VERSION, DISABLE, FALLBACK, FLASHINFER_OPS, HOOK, STRICT

__all__ = ["Settings", "HOOK", "DISABLE", "STRICT", "CUDA_VERSION", "FALLBACK", "FLASHINFER_OPS"]


@dataclasses.dataclass(frozen=True)
class Settings:
    strict: bool
    disabled: bool
    cuda_version: str
    fallback: str
    #: One message per variable whose value was not understood (its default was used instead).
    problems: Tuple[str, ...] = ()
    flashinfer_ops: str = switches.VARIABLES[FLASHINFER_OPS].default

    @classmethod
    def from_environment(cls) -> "Settings":
        # HOOK is read by the .pth hook at start-up; it is read here too so that its problem is reported.
        values, problems = {}, []
        for name in (STRICT, DISABLE, HOOK, FALLBACK, CUDA_VERSION, FLASHINFER_OPS):
            values[name], problem = switches.read(name)
            problems += [problem] if problem else []
        return cls(values[STRICT], values[DISABLE], values[CUDA_VERSION], values[FALLBACK], tuple(problems),
                   values[FLASHINFER_OPS])
