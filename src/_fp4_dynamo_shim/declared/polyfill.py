"""Dynamo polyfills that can be taken back: what Dynamo traces in place of a FlashInfer function.

``torch.compiler.substitute_in_graph(original)(traceable)`` makes Dynamo trace ``traceable`` wherever it meets
``original``, by identity, and leaves ``original`` itself alone: eager calls run FlashInfer's own function
object, at FlashInfer's own cost, and every reference to it (``from flashinfer.norm import layernorm`` in
SGLang, a closure, a default argument) is covered without rebinding anything. It has no inverse, so
:func:`install` returns the undo: it removes the four entries ``substitute_in_graph`` adds to Dynamo's tables
(torch 2.11, 2.13 and 2.14.1, the releases tested, keep them in the same places) and checks that Dynamo no longer sees a polyfill there.
"""

from __future__ import annotations

import contextlib
from typing import Callable


def _tables():
    from torch._dynamo import trace_rules
    from torch._dynamo.variables import PolyfilledFunctionVariable
    from torch._dynamo.variables.builder import VariableBuilder

    return (VariableBuilder._id_dispatch(), trace_rules._polyfilled_function_ids, trace_rules.get_torch_obj_rule_map(),
            PolyfilledFunctionVariable._get_polyfill_handlers())


def is_polyfilled(function) -> bool:
    from torch._dynamo import trace_rules

    return id(function) in trace_rules._polyfilled_function_ids


def install(original: Callable, traceable: Callable) -> Callable[[], None]:
    """Have Dynamo trace ``traceable`` for ``original``; returns the function that undoes it."""
    import torch

    wrapped = torch._dynamo.substitute_in_graph(original, skip_signature_check=True)(traceable)

    def undo() -> None:
        id_dispatch, polyfilled_ids, rule_map, handlers = _tables()
        for function in (original, wrapped):
            id_dispatch.pop(id(function), None)
            with contextlib.suppress(KeyError):
                polyfilled_ids.remove(id(function))
            rule_map.pop(function, None)
            handlers.pop(function, None)
        if is_polyfilled(original):
            raise RuntimeError(f"Dynamo still holds a polyfill for {original!r} after it was removed")

    if not is_polyfilled(original):  # this torch keeps its tables elsewhere: the undo could not work
        undo()
        raise RuntimeError("torch.compiler.substitute_in_graph registered nothing this shim can take back")
    return undo
