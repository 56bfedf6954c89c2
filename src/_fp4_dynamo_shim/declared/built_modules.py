"""Run functions of a JIT module that its getter returns built, with no Python def to read the op from.

``get_batch_mla_module(backend, *args)`` (0.5.3-0.6.x) returns ``gen_batch_mla_module(...).build_and_load()`` itself,
and the MLA wrapper's ``run()`` calls that module's ``run``, the C++ function: FlashInfer declares nothing for it.
The attention table read its parameters from the C++ source, with their kinds (``r``/``w`` tensors read/written,
``?`` optional, ``l`` int list, ``i``/``f``/``b`` scalars). From that row this module writes the declaration and the
getter's namespace that the scanner would have read had FlashInfer declared the function in a getter returning
``SimpleNamespace(run=run)``; ``build.getter`` then builds the op (its kernel calls
``get_batch_mla_module(...).run(...)``) and the traced getter from them, as for any getter.

What stays FlashInfer's is said in ``status()["flashinfer_ops"]["helpers"]`` (:func:`not_covered`): the module
built with ``use_profiler=True`` (its run takes a profiler buffer after the parameters the table read), the wrapper's
cutlass backend (another module and function) and 0.7.x, which runs MLA through backend objects the table has no
row for.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from . import rules
from . import scan

#: Python annotations of the table's kinds, as FlashInfer would have written them (evaluated in its module).
ANNOTATIONS = {"r": "torch.Tensor", "w": "torch.Tensor", "l": "list[int]", "i": "int", "f": "float", "b": "bool"}

#: Getter parameters whose true value builds a module the table's row does not describe: the traced getter refuses
#: those arguments with the reason (compiling ``run()`` then says it), and status() lists it.
REFUSED_ARGUMENTS = {
    "use_profiler": "built with use_profiler=True, its run takes a profiler buffer after the parameters the attention "
                    "table read from the C++ function; what it writes there is not read, so no op carries it",
}


def _class(entry_point: str):
    """The wrapper class of ``entry_point`` where its module is imported, or None."""
    module_name, class_name = rules.ATTENTION_WRAPPED[entry_point]
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except Exception:  # a module that does not import here, or lacks the class, has no wrapper to cover
        return None


def _annotated(row: dict) -> str:
    parameters = []
    for name, kind, marks in rules.kinds(row):
        annotation = ANNOTATIONS[kind]
        parameters.append(f"{name}: Optional[{annotation}]" if "?" in marks else f"{name}: {annotation}")
    return ", ".join(parameters)


def op_name(row_key: str) -> str:
    """``batch_mla.run/1`` -> ``batch_mla_run``: the getter's short name and the function, as for the others."""
    return row_key.split("/")[0].replace(".", "_")


def _returns(row: dict) -> Tuple[str, ...]:
    refusals = []
    for parameter, reason in REFUSED_ARGUMENTS.items():
        if f"{parameter}:" in row["getter_parameters"]:
            refusals += [f"if {parameter}:", f"    raise _NotExpressible({_refusal(row, parameter, reason)!r})"]
    return (*refusals, f"return _Namespace({{{row['entry']!r}: _entry_0}})")


def _refusal(row: dict, parameter: str, reason: str) -> str:
    return f"fp4_dynamo_shim: {row['getter']}(..., {parameter}=True).{row['entry']} stays FlashInfer's: {reason}"


def declarations(package: Path, release: Optional[str], wanted) -> Tuple[List[scan.Declaration], List[scan.Namespace]]:
    """The declarations and namespaces for the release's built-module runs whose wrapper the package read defines,
    those ``wanted(key)`` selects (the gate: a narrower one reads only what it can turn on)."""
    found, namespaces = [], []
    for entry_point, key in rules.attention_built_modules(release).items():
        row, wrapper = rules.attention_table.ROWS[key], _class(entry_point)
        if wrapper is None or not _inside(package, sys.modules[wrapper.__module__]):
            continue
        module = wrapper.__module__  # where the getter is defined, beside the wrapper that calls it
        declaration = scan.Declaration(
            module, row["entry"], 0, op_name(key),
            f"none: {row['getter']} returns its built module (the attention table's row)",
            tuple(name for name, kind, _ in rules.kinds(row) if kind == "w"), (row["getter"],), _annotated(row), "None",
            None)
        if wanted(declaration.key):
            found.append(declaration)
            namespaces.append(scan.Namespace(module, row["getter"], ((row["entry"], row["entry"]),),
                                             returns=_returns(row)))
    return found, namespaces


def _inside(package: Path, module) -> bool:
    try:
        return Path(module.__file__).resolve().is_relative_to(Path(package).resolve())
    except (AttributeError, TypeError):  # a module without a file is no part of the package read
        return False


def extended(scanned: scan.Scan, package: Path, release: Optional[str], wanted) -> scan.Scan:
    """``scanned`` (read from ``package``) with the release's built-module runs added (:func:`declarations`)."""
    found, namespaces = declarations(package, release, wanted)
    return scan.Scan(scanned.declarations + tuple(found),
                     {**scanned.namespaces, **{(n.module, n.getter): n for n in namespaces}})


#: Why a release may have no row for a built-module wrapper, per entry point.
WITHOUT_ROW = {"mla_paged": "0.7.x runs MLA through backend objects, flashinfer.mla._batch_mla, which the table does "
                            "not read"}

#: What a built-module wrapper's run() does other than calling the getter's module's run, per entry point.
OTHER_PATHS = {
    "mla_paged": "with backend='cutlass' its run() calls get_mla_module()'s cutlass_mla_paged_attention, which no op "
                 "carries: compiling it fails as without the shim",
}


def not_covered(package: Path, release: Optional[str], registered_getters, rowless: bool) -> List[str]:
    """The lines status() lists for what of the built-module wrappers the package read defines stays FlashInfer's:
    the refused getter arguments and other paths of a wrapper whose run is an op, and with ``rowless`` a wrapper the
    release's table has no row for."""
    lines = []
    rows = rules.attention_built_modules(release)
    for entry_point in OTHER_PATHS:
        wrapper = _class(entry_point)
        if wrapper is None or not _inside(package, sys.modules[wrapper.__module__]):
            continue
        where = f"{wrapper.__module__}.{wrapper.__name__}"
        row = rules.attention_table.ROWS.get(rows.get(entry_point))
        if row is None:
            if rowless:
                lines.append(f"not covered: {where}.run stays FlashInfer's: the attention table has no row for it in "
                             f"FlashInfer {release} ({WITHOUT_ROW[entry_point]})")
            continue
        if row["getter"] not in registered_getters:
            continue
        lines += [f"not covered: {wrapper.__module__}.{row['getter']}(..., {parameter}=True).{row['entry']}: {reason}"
                  for parameter, reason in REFUSED_ARGUMENTS.items() if f"{parameter}:" in row["getter_parameters"]]
        lines.append(f"not covered: {where}: {OTHER_PATHS[entry_point]}")
    return lines
