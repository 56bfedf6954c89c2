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


def _default(name: str):
    return dataclasses.field(default=switches.VARIABLES[name].default)


@dataclasses.dataclass(frozen=True)
class Settings:
    """One field per row of :data:`switches.VARIABLES` (its ``setting``), and what was not understood."""

    strict: bool = _default(STRICT)
    disabled: bool = _default(DISABLE)
    cuda_version: str = _default(CUDA_VERSION)
    fallback: str = _default(FALLBACK)
    flashinfer_ops: str = _default(FLASHINFER_OPS)
    #: The start-up hook's switch: the .pth line reads it at start-up; read here too so that its problem is reported.
    hook: bool = _default(HOOK)
    #: One message per variable whose value was not understood (its default was used instead).
    problems: Tuple[str, ...] = ()

    @classmethod
    def from_environment(cls) -> "Settings":
        values, problems = {}, []
        for name, variable in switches.VARIABLES.items():
            values[variable.setting], problem = switches.read(name)
            problems += [problem] if problem else []
        return cls(**values, problems=tuple(problems))
