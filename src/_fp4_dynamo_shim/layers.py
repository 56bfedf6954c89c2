"""The one shape every layer of the lifecycle has, and the one undo stack.

A layer is a module (or any object) with ``apply(context) -> record``. The record has ``undo()`` and
``describe()``, which returns the layer's part of ``status()`` (its keys, plus optional "skipped" and
"warnings" lines). ``lifecycle`` applies the layers in order and pushes each record's ``undo`` on one
:class:`UndoStack`; a failure half-way, and ``revert()``, run them newest first. A layer that fails in
``apply`` leaves nothing of its own behind: it keeps its own steps on an :class:`UndoStack` too, and runs
them before raising.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Protocol

from .settings import Settings


@dataclasses.dataclass(frozen=True)
class Context:
    """What every layer is applied with."""

    settings: Settings
    #: The installed FlashInfer release.
    version: str
    #: The release row whose facts apply: the version itself when tested, else the newest tested one.
    row: str
    #: Parts of an untested release left as FlashInfer's -> why (empty on a tested release).
    left: dict


class Record(Protocol):
    def undo(self) -> None: ...

    def describe(self) -> dict: ...


class UndoStack:
    """Undo steps, run newest first: the lifecycle's (one per applied layer) and a layer's own."""

    def __init__(self) -> None:
        self._steps: List[Callable[[], None]] = []

    def push(self, step: Callable[[], None]) -> None:
        self._steps.append(step)

    def undo_all(self) -> None:
        """Run every step, newest first; each is popped before it runs, so none runs twice."""
        while self._steps:
            self._steps.pop()()

    def __len__(self) -> int:
        return len(self._steps)
