"""The types ``torch.library.infer_schema`` does not know, carried across an op boundary as types it does: a
parameter's as schema-able parts (:class:`Adapter`), a return's as a schema-able value (:class:`ReturnAdapter`).

Data, read by ``codegen`` when it plans an op; each entry says which FlashInfer declaration needs it.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Callable, Optional, Tuple

import torch

@dataclasses.dataclass(frozen=True)
class Adapter:
    """One parameter type the op schema cannot hold, carried as schema-able parts.

    ``parts``: (suffix, annotation) of the op parameters that carry it; ``pack``: the expression (over the
    parameter's name ``{n}``) giving those parts in the traced caller; ``unpack``: the expression (over the
    parts, ``{n}`` and ``{n}__number``) rebuilding the value in the kernel; ``check``: a statement the caller
    runs first, for values no part can carry.
    """

    name: str
    parts: Tuple[Tuple[str, object], ...]
    pack: str
    unpack: str
    check: str = ""


_TENSOR_OR = Adapter("tensor or number", (("", Optional[torch.Tensor]), ("__number", Optional[float])),
                     "{n} if isinstance({n}, _Tensor) else None, None if isinstance({n}, _Tensor) else {n}",
                     "{n} if {n} is not None else {n}__number")
_TENSOR_OR_INT = dataclasses.replace(_TENSOR_OR, parts=(("", Optional[torch.Tensor]), ("__number", Optional[int])))
_NO_GENERATOR = Adapter(
    "torch.Generator (must be None)", (), "", "None",
    "if {n} is not None: raise _NotExpressible('{function}: a torch.Generator cannot cross a custom op; under "
    "torch.compile pass seed/offset (or nothing) instead')")

#: A list that may be None (0.7.4's trtllm fp4 MoE ``routing_metadata``): the schema has no optional list, and
#: FlashInfer tests ``is not None``, so an empty list cannot stand for None: a flag says which it was.
_TENSOR_LIST_OR_NONE = Adapter("optional tensor list", (("", typing.List[torch.Tensor]), ("__given", bool)),
                               "[] if {n} is None else {n}, {n} is not None", "{n} if {n}__given else None")

#: Annotation (as typing compares them: Union order does not matter) -> adapter.
ADAPTERS = (
    (typing.Union[float, torch.Tensor], _TENSOR_OR),
    (typing.Optional[typing.Union[float, torch.Tensor]], _TENSOR_OR),
    (typing.Union[int, torch.Tensor], _TENSOR_OR_INT),
    (typing.Optional[typing.Union[int, torch.Tensor]], _TENSOR_OR_INT),
    (typing.Optional[torch.Generator], _NO_GENERATOR),
    (torch.Generator, _NO_GENERATOR),
    (typing.Optional[typing.List[torch.Tensor]], _TENSOR_LIST_OR_NONE),
)


def _lookup(table, annotation):
    for known, adapter in table:
        try:
            if annotation == known:
                return adapter
        except TypeError:  # an annotation that cannot be compared is in no table
            continue
    return None


def adapter_for(annotation) -> Optional[Adapter]:
    return _lookup(ADAPTERS, annotation)


@dataclasses.dataclass(frozen=True)
class ReturnAdapter:
    """A return type the schema cannot hold: the op returns ``schema_type``; ``to_op`` converts FlashInfer's
    value (in the kernel and the fake), ``from_op`` converts back in the traced caller."""

    schema_type: object
    to_op: Callable
    from_op: str  # an expression over the op's result ``r``


def _as_list(result):
    return [result] if isinstance(result, torch.Tensor) else list(result)


RETURN_ADAPTERS = (
    # sampling: one tensor, or (samples, valid) with return_valid=True
    (typing.Union[torch.Tensor, typing.Tuple[torch.Tensor, torch.Tensor]],
     ReturnAdapter(typing.List[torch.Tensor], _as_list, "r[0] if len(r) == 1 else tuple(r)")),
)


#: How many tensors a list-returning op that writes in place returns (its list, padded): torch.compile cannot
#: functionalize an op that both mutates and returns ``Tensor[]`` ("Not yet supported: List[Tensor] return",
#: torch/_higher_order_ops/auto_functionalize.py), but it can one that returns a fixed number of tensors.
#: FlashInfer's trtllm MoE ops return at most 4 (0.7.4's ``unpack_trtllm_moe_output``).
LIST_RETURN_WIDTH = 8


def _padded(result):
    """A list of tensors as LIST_RETURN_WIDTH tensors, then a marker whose shape says what it was (a shape, so the
    traced caller reads it as a constant, under fake tensors too): (n,) for a list of n, (1, 1) for one tensor
    returned bare (prims_ts' fp8 MoE returns ``out if do_finalize else [out, ...]``)."""
    bare = isinstance(result, torch.Tensor)
    result = [result] if bare else list(result)
    if len(result) > LIST_RETURN_WIDTH:
        raise ValueError(f"returned {len(result)} tensors; the op carries at most {LIST_RETURN_WIDTH}")
    device = result[0].device if result else None
    return (*result, *(torch.empty(0, device=device) for _ in range(LIST_RETURN_WIDTH - len(result))),
            torch.zeros((1, 1) if bare else len(result), dtype=torch.uint8, device=device))


_PADDED = typing.Tuple[(torch.Tensor,) * (LIST_RETURN_WIDTH + 1)]
_PADDED_LISTS = (
    (typing.List[torch.Tensor], ReturnAdapter(_PADDED, _padded, "list(r[:r[-1].shape[0]])")),
    (typing.Union[typing.List[torch.Tensor], torch.Tensor],
     ReturnAdapter(_PADDED, _padded, "r[0] if r[-1].dim() == 2 else list(r[:r[-1].shape[0]])")),
)


def return_adapter_for(annotation, mutates=()) -> Optional[ReturnAdapter]:
    return _lookup(_PADDED_LISTS if mutates else (), annotation) or _lookup(RETURN_ADAPTERS, annotation)
