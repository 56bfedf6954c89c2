"""The types ``torch.library.infer_schema`` does not know, carried across an op boundary as types it does: a
parameter's as schema-able parts (:class:`Adapter`), a return's as a schema-able value (:class:`ReturnAdapter`).

Data, read by ``codegen`` when it plans an op; each entry says which FlashInfer declaration needs it.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Callable, Optional, Tuple

import torch

@dataclasses.dataclass(frozen=True)
class Adapter:
    """One parameter type the op schema cannot hold, carried as schema-able parts.

    ``parts``: (suffix, annotation) of the op parameters that carry it (annotation None: the parameter's own);
    ``pack``: the expression (over the parameter's name ``{n}``, and ``{backend}``, the getter's backend argument)
    giving those parts in the traced caller; ``unpack``: the expression (over the
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

#: One tensor or a sequence of them (0.7.4's prims_ts bf16 MoE weights: shards, with partition resources): a list and
#: a flag saying it was one tensor, which FlashInfer's function receives as it was given.
_TENSOR_OR_TENSORS = Adapter("tensor or tensor sequence", (("", typing.List[torch.Tensor]), ("__bare", bool)),
                             "[{n}] if isinstance({n}, _Tensor) else list({n}), isinstance({n}, _Tensor)",
                             "{n}[0] if {n}__bare else {n}")

#: A string out of a fixed set (``Literal["tp_n_tp_n", "tp_n_tp_k"]``): the schema holds the string; FlashInfer's
#: function checks the value as it does eagerly.
_CHOICE = Adapter("string literal", (("", str),), "{n}", "{n}")
_CHOICE_OR_NONE = dataclasses.replace(_CHOICE, parts=(("", Optional[str]),))

#: Objects that cannot cross an op, in parameters whose default is None: (module, class) -> what they hold. The
#: op is exact for None (its public callers' default path) and refuses anything else under tracing.
NONE_ONLY = {
    ("flashinfer.prims_ts.moe.partition", "MoePartitionResources"):
        "caller-owned CUDA streams and events (the two-way green-context partition)",
}


def _none_only(holds: str) -> Adapter:
    return Adapter(f"{holds} (must be None)", (), "", "None",
                   "if {n} is not None: raise _NotExpressible('{function}: {n} holds " + holds + ", which cannot "
                   "cross a custom op; under torch.compile pass None (or call it outside the compiled region)')")


#: Annotation (as typing compares them: Union order does not matter) -> adapter.
ADAPTERS = (
    (typing.Union[float, torch.Tensor], _TENSOR_OR),
    (typing.Optional[typing.Union[float, torch.Tensor]], _TENSOR_OR),
    (typing.Union[int, torch.Tensor], _TENSOR_OR_INT),
    (typing.Optional[typing.Union[int, torch.Tensor]], _TENSOR_OR_INT),
    (typing.Optional[torch.Generator], _NO_GENERATOR),
    (torch.Generator, _NO_GENERATOR),
    (typing.Optional[typing.List[torch.Tensor]], _TENSOR_LIST_OR_NONE),
    (typing.Union[torch.Tensor, typing.Sequence[torch.Tensor]], _TENSOR_OR_TENSORS),
)


def _lookup(table, annotation):
    for known, adapter in table:
        try:
            if annotation == known:
                return adapter
        except TypeError:  # an annotation that cannot be compared is in no table
            continue
    return None


def _without_none(annotation):
    """``X`` for ``Optional[X]``; None for anything else."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else ()
    rest = [member for member in members if member is not type(None)]
    return rest[0] if len(members) == 2 and len(rest) == 1 else None


def _int_enum(annotation, optional: bool) -> Optional[Adapter]:
    """An ``IntEnum`` (FlashInfer's ``ActivationType``, ``SfLayout``, ...) as its int, the member rebuilt in the
    kernel: the same op on every torch (torch 2.11's ``infer_schema`` knows no enum type; later ones pass it)."""
    if not (isinstance(annotation, type) and issubclass(annotation, enum.IntEnum)):
        return None
    member = f"__import__({annotation.__module__!r}, fromlist=['_']).{annotation.__qualname__}({{n}})"
    if optional:
        return Adapter(f"optional {annotation.__qualname__}", (("", Optional[int]),),
                       "None if {n} is None else int({n})", f"None if {{n}} is None else {member}")
    return Adapter(annotation.__qualname__, (("", int),), "int({n})", member)


def adapter_for(annotation) -> Optional[Adapter]:
    found = _lookup(ADAPTERS, annotation)
    if found is not None:
        return found
    inner = _without_none(annotation)
    found = _int_enum(annotation, False) or _int_enum(inner, True)
    if found is not None:
        return found
    for candidate, optional in ((annotation, False), (inner, True)):
        if typing.get_origin(candidate) is typing.Literal and all(
                isinstance(value, str) for value in typing.get_args(candidate)):
            return _CHOICE_OR_NONE if optional else _CHOICE
    holds = NONE_ONLY.get((getattr(inner, "__module__", None), getattr(inner, "__qualname__", None)))
    return _none_only(holds) if holds is not None else None


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
