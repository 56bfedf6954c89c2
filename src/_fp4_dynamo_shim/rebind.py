"""Swap one function object for another wherever a module global *is* it.

SGLang and FlashInfer bind ``fp4_quantize`` at import time (``from flashinfer
import fp4_quantize``, ``... as fp4_quantize_flashinfer``), so patching the
defining module alone leaves those copies pointing at the original. Matching by
identity, not by name, catches aliases and never touches a different function
that happens to be called ``fp4_quantize`` (sgl_kernel's ``scaled_fp4_quant``).

The shim's own modules are never rebound: a reference the shim keeps to an original must stay the
original, or the replacement ends up calling itself.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Iterable, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Binding:
    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


#: The front package and the implementation.
SHIM_PACKAGES = ("fp4_dynamo_shim", "_fp4_dynamo_shim")


def is_shim_module(name: str) -> bool:
    return name.partition(".")[0] in SHIM_PACKAGES


def swap(pairs: Sequence[Tuple[object, object]], modules: Optional[Iterable[types.ModuleType]] = None) -> List[Binding]:
    """Rebind every module global that is one of the pairs' ``old`` objects to its ``new``; returns what was
    rebound. One walk over the modules for all pairs, and a module holding none of them is passed over at C
    speed (``isdisjoint`` over ``map(id, ...)``): a process with torch imported holds thousands of modules, and
    the walk in Python took most of apply()'s and revert()'s time."""
    replacements = {id(old): (old, new) for old, new in pairs}
    wanted = replacements.keys()
    rebound = []
    for module in list(sys.modules.values()) if modules is None else modules:
        # Only real modules: some libraries park other objects in sys.modules, and touching their
        # attributes can import things.
        if not isinstance(module, types.ModuleType):
            continue
        namespace = module.__dict__
        if wanted.isdisjoint(map(id, tuple(namespace.values()))):
            continue
        module_name = namespace.get("__name__", "?")
        if is_shim_module(str(module_name)):
            continue
        for name, value in list(namespace.items()):
            if id(value) in replacements and value is replacements[id(value)][0]:
                namespace[name] = replacements[id(value)][1]
                rebound.append(Binding(module_name, name))
    return rebound


@dataclasses.dataclass
class Swaps:
    """A layer's (original, replacement) pairs and every binding they changed: the swap, rebind and undo part
    that each layer which replaces functions shares."""

    pairs: List[tuple] = dataclasses.field(default_factory=list)
    bindings: List[Binding] = dataclasses.field(default_factory=list)

    def swap(self, *pairs) -> None:
        self.pairs.extend(pairs)
        self.bindings.extend(swap(pairs))

    def rebind(self, modules: Optional[Iterable[types.ModuleType]] = None) -> List[Binding]:
        """Rebind originals that appeared after the swap (all of sys.modules by default); returns what changed."""
        found = swap(self.pairs, modules)
        self.bindings.extend(found)
        return found

    def undo(self) -> None:
        swap([(new, old) for old, new in reversed(self.pairs)])
