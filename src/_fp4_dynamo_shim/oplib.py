"""The one way the shim registers an op, and the one exact-signature generator.

Ops are registered with ``Library.define`` + ``impl`` + ``register_fake`` (the shape of vLLM's
``direct_register_custom_op``) rather than ``torch.library.custom_op``: the latter's Python wrapper cost
1.1-1.8x the original FlashInfer call per eager call on an H200. Eager calls skip the dispatcher altogether
(the replacements call the kernels directly); the op is what Dynamo records.

Replacements and callers are generated as source with the original function's exact parameter list, so
that ``inspect.signature``, positional and keyword calls and defaults behave as FlashInfer's own.
"""

from __future__ import annotations

import inspect
from typing import Callable, Dict, Optional

import torch

#: The dispatch keys an op of the shim runs on.
DEVICES = ("CPU", "CUDA")


def library(namespace: str) -> torch.library.Library:
    """A fragment of ``namespace``; keep it alive as long as its ops (dropping it unregisters them)."""
    return torch.library.Library(namespace, "FRAGMENT")


def define(fragment: torch.library.Library, schema: str, kernels: Dict[str, Callable], fake: Callable):
    """Define ``schema`` ("name(arguments) -> returns") in ``fragment``, implement it per dispatch key, register
    its fake; returns the op's default overload."""
    name = schema.split("(", 1)[0]
    fragment.define(schema)
    implement(fragment, name, kernels, fake)
    return getattr(getattr(torch.ops, fragment.ns), name).default


def implement(fragment: torch.library.Library, name: str, kernels: Dict[str, Callable], fake: Callable,
              override: bool = False) -> None:
    """Kernels per dispatch key and the fake for the op ``name`` of ``fragment``'s namespace (``override``: an op
    another library already gave a fake, as FlashInfer's own)."""
    for key, kernel in kernels.items():
        fragment.impl(name, kernel, key)
    if override:
        fragment._register_fake(name, fake, allow_override=True)
    else:
        torch.library.register_fake(f"{fragment.ns}::{name}", fake, lib=fragment)


def declare(signature: inspect.Signature, namespace: dict, prefix: str = "") -> str:
    """The parameter list reproducing ``signature``, each default bound by name in ``namespace``.

    Only named parameters: a function taking ``*args`` or ``**kwargs`` has no exact list to reproduce."""
    declared, keyword_only = [], False
    for parameter in signature.parameters.values():
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise TypeError(f"parameter {parameter.name!r} is {parameter.kind.description}")
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only:
            declared.append("*")
            keyword_only = True
        if parameter.default is parameter.empty:
            declared.append(parameter.name)
        else:
            default = f"_{prefix}_default_{parameter.name}" if prefix else f"_default_{parameter.name}"
            namespace[default] = parameter.default
            declared.append(f"{parameter.name}={default}")
    return ", ".join(declared)


def run_source(source: str, filename: str, namespace: dict, local: Optional[dict] = None) -> dict:
    """Run generated (or FlashInfer's own) source in ``namespace``, naming it ``filename`` in tracebacks and in
    Dynamo's messages; the one place the shim compiles code. Returns where the definitions landed."""
    target = namespace if local is None else local
    exec(compile(source, filename, "exec"), namespace, target)  # noqa: S102 - generated from the shim's templates
    return target


def keywords(signature: inspect.Signature, names: Optional[list] = None) -> str:
    """``a=a, b=b`` for every parameter of ``signature`` (or ``names``)."""
    return ", ".join(f"{name}={name}" for name in (names if names is not None else signature.parameters))
