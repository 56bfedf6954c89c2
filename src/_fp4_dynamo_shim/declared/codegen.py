"""The generated pieces of one declared op: its schema, kernel, fake and the function Dynamo traces.

Each FlashInfer declaration becomes, from its ``inspect.Signature`` (the real function's, or one compiled from
the source for a def nested in a getter):

* the op's parameters: the getter's (renamed, see :func:`getter_argument`), then the function's, each type the
  schema cannot hold split by its ``adapters.Adapter`` into parts it can; the schema is
  ``torch.library.infer_schema``'s for them;
* the kernel and the fake: rebuild FlashInfer's arguments from the op's and call FlashInfer's function (through
  its getter when nested, called from a function of its own so that the getter's arguments never meet the
  function's) or FlashInfer's fake;
* the caller: FlashInfer's exact signature, calling the op. Dynamo traces it in place of FlashInfer's function
  (``polyfill``); it never runs eagerly.

Generated as source, like ``wrapper.py``'s replacements: positional binding and defaults then behave exactly
as FlashInfer's, and no per-call ``inspect`` work remains in the traced code.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Callable, List, Optional, Tuple

import torch

from .. import oplib
from . import adapters
from . import rules
from _fp4_dynamo_shim.errors import NotExpressibleError

_PLAIN = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class NotExpressible(Exception):
    """The declaration cannot be carried by an op; the message says why (it is listed, not registered)."""


@dataclasses.dataclass
class Piece:
    """One op parameter: its name, annotation, and where it comes from."""

    name: str
    annotation: object


@dataclasses.dataclass
class Op:
    """Everything needed to register and trace one declared function."""

    name: str  # op name in the shim's namespace
    schema: str  # "(Tensor input, ...) -> Tensor"
    pieces: List[Piece]
    signature: inspect.Signature  # FlashInfer's function's
    getter_signature: Optional[inspect.Signature]
    return_adapter: Optional[adapters.ReturnAdapter]
    #: Statements and expressions for the generated functions (see _caller_body / _kernel_source).
    pack: List[str]
    unpack: List[str]
    checks: List[str]
    #: The unpack statements the fake also runs (a carried plan stays a tensor there: a fake tensor has no values).
    fake_unpack: List[str] = dataclasses.field(default_factory=list)


def _parameters(signature: inspect.Signature, what: str):
    for parameter in signature.parameters.values():
        if parameter.kind not in _PLAIN:
            raise NotExpressible(f"{what} has a {parameter.kind.description} parameter ({parameter.name})")
        if parameter.annotation is inspect.Parameter.empty:
            raise NotExpressible(f"{what}: parameter {parameter.name} has no type annotation")
        yield parameter


def getter_argument(name: str) -> str:
    """The name a getter's parameter goes by in the op, the kernel and the caller: a getter and its function
    may both take a parameter of one name (flashinfer.xqa's ``q_seq_len``), each with its own value."""
    return f"getter_{name}"


def plan(name: str, function: str, signature: inspect.Signature, mutates, getter_signature=None, carried=()) -> Op:
    """The op for a function with ``signature`` (and, when nested, its getter's); raises NotExpressible.
    ``carried``: parameter -> the adapter the attention table's facts give it (``rules.attention_carried``)."""
    pieces, pack, unpack, checks, fake_unpack = [], [], [], [], []
    if getter_signature is not None:
        for parameter in _parameters(getter_signature, "its getter"):
            pieces.append(Piece(getter_argument(parameter.name), parameter.annotation))
            pack.append(getter_argument(parameter.name))
    for parameter in _parameters(signature, function):
        adapter = carried.get(parameter.name) if carried else None
        carry = adapter is rules.PLAN_TENSOR
        adapter = adapter or adapters.adapter_for(parameter.annotation)
        if adapter is None:
            pieces.append(Piece(parameter.name, parameter.annotation))
            pack.append(parameter.name)
            continue
        if parameter.name in (mutates or ()):
            raise NotExpressible(f"{function}: mutated parameter {parameter.name} has type {adapter.name}")
        # A part annotated None keeps the parameter's own annotation (an adapter that changes the value only).
        pieces.extend(Piece(parameter.name + suffix, parameter.annotation if annotation is None else annotation)
                      for suffix, annotation in adapter.parts)
        if adapter.pack:
            pack.append(adapter.pack.format(n=parameter.name, backend=getter_argument("backend")))
        unpack.append(f"{parameter.name} = " + adapter.unpack.format(n=parameter.name))
        if not carry:
            fake_unpack.append(unpack[-1])
        if adapter.check:
            checks.append(adapter.check.format(n=parameter.name, function=function))
    names = [piece.name for piece in pieces]
    if len(set(names)) != len(names):
        clash = sorted({n for n in names if names.count(n) > 1})
        raise NotExpressible(f"{function}: op parameter names collide ({', '.join(clash)})")
    return_annotation = signature.return_annotation
    return_adapter = adapters.return_adapter_for(return_annotation, mutates)
    if return_adapter is not None:
        return_annotation = return_adapter.schema_type
    if return_annotation is inspect.Signature.empty:
        raise NotExpressible(f"{function} has no return annotation")
    if return_annotation in (None, type(None)) and not mutates:
        # An op that returns nothing and writes nothing is dead code to torch.compile: the call would vanish.
        raise NotExpressible(f"{function} returns None and declares no mutated argument")
    schema = _infer(pieces, return_annotation, mutates or ())
    return Op(name, schema, pieces, signature, getter_signature, return_adapter, pack, unpack, checks, fake_unpack)


def _infer(pieces: List[Piece], return_annotation, mutates) -> str:
    def prototype(*args):  # only its __signature__ and __globals__ are read
        pass

    prototype.__signature__ = inspect.Signature(
        [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=p.annotation) for p in pieces],
        return_annotation=return_annotation,
    )
    # infer_schema logs a warning per type it does not know before it raises: the raise is the answer here.
    quiet = logging.getLogger("torch._library.opaque_object")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return torch.library.infer_schema(prototype, mutates_args=tuple(mutates))
    except (ValueError, TypeError) as error:
        message = str(error).splitlines()[0].split(". The valid types are")[0].replace("infer_schema(func): ", "")
        raise NotExpressible(f"schema: {message[:240]}") from None
    finally:
        quiet.setLevel(level)


def _call_arguments(signature: inspect.Signature) -> str:
    return ", ".join(p.name if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}"
                     for p in signature.parameters.values())


def caller_source(op: Op, index: int, namespace: dict, indent: str = "") -> str:
    """``def <function>(FlashInfer's parameters)`` calling the op (bound as ``_op_<index>``)."""
    body = [f"{check}" for check in op.checks]
    body.append(f"r = _op_{index}({', '.join(op.pack)})")
    if op.return_adapter is not None:
        body.append(f"r = {op.return_adapter.from_op}")
    body.append("return r")
    lines = [f"def _caller_{index}({oplib.declare(op.signature, namespace, f'c{index}')}):"]
    lines += [f"    {line}" for line in body]
    return "".join(f"{indent}{line}\n" for line in lines)


def _kernel_source(op: Op, index: int, target: str, role: str, keywords: Optional[List[str]] = None) -> str:
    lines = [f"def _{role}_{index}({', '.join(p.name for p in op.pieces)}):"]
    lines += [f"    {line}" for line in (op.fake_unpack if role == "fake" else op.unpack)]
    arguments = _call_arguments(op.signature) if keywords is None else ", ".join(f"{k}={k}" for k in keywords)
    result = f"{target}({arguments})"
    if op.return_adapter is not None:
        result = f"_to_op_{index}({result})"
    if op.signature.return_annotation in (None, type(None)):
        # Annotated None, yet some return their output anyway (single prefill's run returns o): an op whose
        # schema returns nothing must return None, or the dispatcher raises.
        lines += [f"    {result}", "    return None"]
    else:
        lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"


def target_expression(index: int, getter_signature: Optional[inspect.Signature], key: Optional[str]
                      ) -> Tuple[str, str]:
    """How the kernel reaches FlashInfer's function, and the source of what that needs: ``_target_<i>`` itself,
    or ``_resolve_<i>(the getter's arguments)``, a function of the getter's own parameters that calls the
    getter and takes the function from its namespace under ``key`` (a computed key is an expression over
    those parameters)."""
    if getter_signature is None:
        return f"_target_{index}", ""
    namespace = f"_getter_{index}({_call_arguments(getter_signature)})"
    entry = f"getattr({namespace}, {key[1:]})" if key.startswith("=") else f"{namespace}{accessor(key)}"
    parameters = list(getter_signature.parameters)
    source = f"def _resolve_{index}({', '.join(parameters)}):\n    return {entry}\n"
    return f"_resolve_{index}({', '.join(getter_argument(p) for p in parameters)})", source


def accessor(key: str) -> str:
    """Where a getter's entry ``key`` (``scan.Namespace``) sits in its result, as Python after the result: ``.run``,
    ``[1]``, or nothing for the result itself; a computed key as its expression (``.f'{act}_and_mul'``)."""
    return key if key == "" or key.startswith("[") else f".{key.lstrip('=')}"


def kernel_and_fake(op: Op, index: int, bindings: dict, target: Tuple[str, str], fake: Optional[Callable],
                    filename: str, fake_keywords: Optional[List[str]] = None) -> Tuple[Callable, Callable]:
    """The op's kernel (calling ``target``, see :func:`target_expression`, with ``bindings`` in scope) and its
    fake (FlashInfer's, rebuilt the same way, called by keyword with ``fake_keywords`` when its parameters
    are not the function's; or nothing, for a function that returns None in place)."""
    namespace = dict(bindings)
    target, resolver = target
    if resolver:
        oplib.run_source(resolver, filename, namespace)
    if op.return_adapter is not None:
        namespace[f"_to_op_{index}"] = op.return_adapter.to_op
    oplib.run_source(_kernel_source(op, index, target, "kernel"), filename, namespace)
    if fake is None:
        def fake_function(*args):  # FlashInfer declared no fake: the function returns None (in place)
            return None
    else:
        namespace[f"_fake_target_{index}"] = fake
        oplib.run_source(_kernel_source(op, index, f"_fake_target_{index}", "fake", fake_keywords), filename, namespace)
        fake_function = namespace[f"_fake_{index}"]
    return namespace[f"_kernel_{index}"], fake_function


class Namespace:
    """What a polyfilled getter returns under tracing (Dynamo cannot build a ``types.SimpleNamespace``)."""

    def __init__(self, entries: dict):
        for key, value in entries.items():
            setattr(self, key, value)


def unavailable(description: str) -> Callable:
    """What a polyfilled getter's namespace holds for an entry no op carries: it refuses when called."""

    def refuse(*args, **kwargs):
        raise NotExpressibleError(
            f"fp4_dynamo_shim: {description} is not behind a custom op, so it cannot run inside torch.compile; "
            "call it outside the compiled region (see status()['flashinfer_ops'] for why)"
        )

    return refuse
