"""What the declared ops need from Inductor while they are registered: the lowering it lacks for
``aten.sym_storage_offset``, and a compile-cache key that tells their schemas apart.

A declared op that writes a tensor (an attention run's KV cache, ``out=``) gets it back from functionalization
as ``as_strided(base, size, stride, sym_storage_offset(view))``. Torch 2.11-2.14 have no Inductor lowering for
``sym_storage_offset``: Inductor falls back to running it on a tensor it rebuilds without the offset, so under
dynamic shapes every such view starts at its base's first element. FlashInfer's single-tensor KV cache
``[pages, 2, page, heads, dim]``, which ``run()`` unbinds, then hands the kernel K's half as V, silently
(``aot_eager`` is right). The lowering below is the one PyTorch's proposed fix adds.

The lowering reads the offset from the node's metadata, as Inductor's ``sym_size`` and ``sym_stride`` lowerings
do. It is installed when ``torch._inductor.lowering`` is imported (at once if it is: importing it costs seconds),
and only where torch has no lowering of its own for the op: an implicit fallback, which Inductor registers on
first use, is replaced, anything else is left as torch's. :func:`install_lowering` returns the undo, which puts
back whatever was there.

Torch's graph caches (FX graph, AOTAutograd) key a graph by its code, which names an op but not
its schema: a graph compiled when an op took 8 arguments, or wrote none of them, is loaded when the op takes 7
(another FlashInfer release) or writes two, and so is one compiled before the lowering existed. The shim adds a
digest of its ops' schemas to ``torch.compiler.config.cache_key_tag``, torch's own means to "break caches",
after whatever tag the user set, and puts the user's tag back on revert.
"""

from __future__ import annotations

import hashlib
from typing import Callable, List, Optional

from .. import switches

MODULE = "torch._inductor.lowering"
WHAT = (f"{MODULE}: a lowering for aten.sym_storage_offset where torch has none of its own, added when Inductor is "
        "imported (without it, a written view of a larger tensor, such as one half of a single-tensor KV cache, "
        "loses its storage offset under dynamic shapes)")


def _sym_storage_offset(tensor):
    import torch
    from torch._inductor.virtualized import V

    value = V.graph.current_node.meta["val"]
    return value.node.expr if isinstance(value, torch.SymInt) else int(value)


def install_lowering(describe: List[str]) -> Callable[[], None]:
    """Add the lowering when Inductor's lowerings are imported (wrapt calls at once when they are); appends what it
    does to ``describe``. Returns the undo."""
    import torch
    import wrapt

    op = torch.ops.aten.sym_storage_offset.default
    installed: list = []  # (lowerings, the entry it replaced or None), once added
    active = [True]

    def add(lowering) -> None:
        # None of its own: none yet, or the implicit fallback Inductor registers on first use.
        if not active[0] or (op in lowering.lowerings and op not in lowering.fallbacks):
            return
        previous = lowering.lowerings.get(op)
        try:
            lowering.register_lowering(op, type_promotion_kind=None)(_sym_storage_offset)
        except Exception as error:  # run from the user's import of Inductor: said, never raised there
            message = (f"fp4_dynamo_shim: the lowering for aten.sym_storage_offset could not be added "
                       f"({type(error).__name__}: {error}); compiled with Inductor under dynamic shapes, a declared op "
                       "that writes a view of a larger tensor (a KV cache of one tensor) may get it at offset 0")
            describe.append(message)
            switches.warn(message)
            return
        installed.append((lowering, previous))

    wrapt.register_post_import_hook(add, MODULE)
    describe.append(WHAT)

    def undo() -> None:
        active[0] = False  # the hook wrapt still holds does nothing from now on
        for lowering, previous in installed:
            if previous is None:
                lowering.lowerings.pop(op, None)
            else:
                lowering.lowerings[op] = previous
        installed.clear()

    return undo


class CacheKey:
    """The shim's part of torch's compile-cache tag: a digest of everything ``add`` was given."""

    WHAT = ("torch.compiler.config.cache_key_tag: a digest of the shim's op schemas after the user's tag, so that "
            "torch's graph caches serve no graph compiled for another schema")

    def __init__(self) -> None:
        import torch

        self._config = torch.compiler.config
        self._users: str = self._config.cache_key_tag
        self._digest = hashlib.sha256()
        self._ours: Optional[str] = None

    def add(self, text: str) -> None:
        self._digest.update(text.encode() + b"\n")
        self._ours = f"{self._users}|fp4_dynamo_shim:{self._digest.hexdigest()[:16]}"
        self._config.cache_key_tag = self._ours

    def undo(self) -> None:
        """Put the user's tag back, unless the user has set another since."""
        if self._ours is not None and self._config.cache_key_tag == self._ours:
            self._config.cache_key_tag = self._users
        self._ours = None
