"""What a FlashInfer release's Python sources say about the functions the shim patches, read without importing.

A release newer than the tested ones is judged by comparing these facts with those of the newest tested release
(``tested_sources.RECORD``, written by ``tools/release_parts.py``), part by part: a part whose facts are equal
is patched as that release's row says; one whose facts differ is left as FlashInfer's, and the difference is
said in words. The facts of a function are its signature and a digest of its source together with every
module-level name it reaches in its own module (helpers, constants), docstrings and comments aside, so
that a changed body is seen even where the signature stayed.

The digest is taken over the syntax tree with empty fields left out, so the same source gives the same digest
on every Python the shim supports (3.12 added fields that 3.11 lacks).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Part:
    """One thing the shim patches, as FlashInfer's sources define it."""

    #: How status(), warnings and the tool name it.
    name: str
    #: The dotted module whose name ``function`` the shim binds.
    module: str
    #: The function (or class) the shim binds there; its facts are its signature and its source digest.
    function: Optional[str] = None
    #: Other module-level names of ``module`` the shim binds (defined or imported there).
    names: Tuple[str, ...] = ()
    #: For a JIT getter: the ``SimpleNamespace(...)`` keys it returns that the shim binds.
    returns: Tuple[str, ...] = ()
    #: Compare the digest of the source too (else only presence and the signature).
    source: bool = True


class Sources:
    """A FlashInfer package's Python files, parsed on demand: the installed one or an unpacked wheel's."""

    def __init__(self, package: Path):
        self.package = Path(package)
        self._trees: Dict[str, Optional[ast.Module]] = {}

    def tree(self, module: str) -> Optional[ast.Module]:
        """The parsed file of a dotted module of the package, or None where it has none."""
        if module not in self._trees:
            parts = module.split(".")[1:]
            path = self.package.joinpath(*parts)
            candidates = [path / "__init__.py", path.with_suffix(".py")] if parts else [path / "__init__.py"]
            found = next((candidate for candidate in candidates if candidate.is_file()), None)
            self._trees[module] = ast.parse(found.read_text(encoding="utf-8"), str(found)) if found else None
        return self._trees[module]

    def definition(self, module: str, name: str, depth: int = 0) -> Optional[Tuple[str, ast.AST]]:
        """(the module that defines ``name``, its top-level node), following the package's own re-exports."""
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return module, node
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, is_package=self._is_package(module))
                        if source and source.split(".")[0] == module.split(".")[0]:
                            return self.definition(source, alias.name, depth + 1)
        return None

    def binds(self, module: str, name: str) -> bool:
        """Whether ``module`` defines or imports ``name`` at its top level."""
        tree = self.tree(module)
        return tree is not None and name in _top_level_names(tree)

    def _is_package(self, module: str) -> bool:
        return self.package.joinpath(*module.split(".")[1:], "__init__.py").is_file()


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> Optional[str]:
    if node.level == 0:
        return node.module
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else [])) or None


def _top_level_names(tree: ast.Module) -> Dict[str, ast.AST]:
    names: Dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _canonical(node) -> str:
    """The tree as text, the same on every Python: node names and non-empty fields, no positions or docstrings."""
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = []
    for field in node._fields:
        value = getattr(node, field, None)
        if field == "body" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            value = _without_docstring(value)
        if value is None or value == []:
            continue
        fields.append(f"{field}={_canonical(value)}")
    return f"{type(node).__name__}({','.join(fields)})"


def _closure(tree: ast.Module, node: ast.AST, stop: frozenset = frozenset()) -> Tuple[List[ast.AST], List[str]]:
    """(``node`` and every top-level definition of its module that it reaches by name, transitively; the names
    in ``stop`` it reaches, which are not followed: other parts, judged on their own)."""
    top = {name: definition for name, definition in _top_level_names(tree).items()
           if not isinstance(definition, (ast.Import, ast.ImportFrom))}
    seen, queue, order, stopped = {id(node)}, [node], [node], set()
    while queue:
        for leaf in ast.walk(queue.pop()):
            reached = top.get(leaf.id) if isinstance(leaf, ast.Name) else None
            if reached is not None and leaf.id in stop and reached is not node:
                stopped.add(leaf.id)
            elif reached is not None and id(reached) not in seen:
                seen.add(id(reached))
                queue.append(reached)
                order.append(reached)
    return order, sorted(stopped)


def digest(tree: ast.Module, node: ast.AST, stop: frozenset = frozenset()) -> Tuple[str, List[str]]:
    """(a digest of ``node``'s source and what it reaches, the names of ``stop`` it reaches)."""
    reached, stopped = _closure(tree, node, stop)
    text = "\n".join(sorted(_canonical(item) for item in reached))
    return hashlib.sha256(text.encode()).hexdigest()[:16], stopped


def function_digest(node: ast.FunctionDef) -> str:
    """A digest of a function's parameters and body as written, docstring, decorators and positions aside (a body
    compared across releases whose decorators changed)."""
    text = f"{_canonical(node.args)}\n{_canonical(_without_docstring(node.body))}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def signature(node: ast.AST) -> List[List[str]]:
    """[name, kind, default] per parameter (kind as ``inspect.Parameter`` names it; default as written, or "")."""
    if isinstance(node, ast.ClassDef):
        return []
    arguments = node.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    rows = [[a.arg, "POSITIONAL_ONLY" if i < len(arguments.posonlyargs) else "POSITIONAL_OR_KEYWORD",
             ast.unparse(d) if d is not None else ""] for i, (a, d) in enumerate(zip(positional, defaults))]
    if arguments.vararg:
        rows.append([arguments.vararg.arg, "VAR_POSITIONAL", ""])
    rows += [[a.arg, "KEYWORD_ONLY", ast.unparse(d) if d is not None else ""]
             for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    if arguments.kwarg:
        rows.append([arguments.kwarg.arg, "VAR_KEYWORD", ""])
    return rows


def returned_namespace(node: ast.AST) -> List[str]:
    """The keys of the ``SimpleNamespace(...)`` a JIT getter returns last."""
    for statement in reversed(getattr(node, "body", [])):
        if isinstance(statement, ast.Return) and isinstance(statement.value, ast.Call):
            return sorted(keyword.arg for keyword in statement.value.keywords if keyword.arg)
    return []


def call_arguments(node: ast.AST, inner: str, attribute: str) -> Optional[List[str]]:
    """The argument names of the first ``<x>.<attribute>(...)`` call inside the nested function ``inner``."""
    for child in ast.walk(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == inner:
            for call in ast.walk(child):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and call.func.attr == attribute:
                    return [ast.unparse(argument) for argument in call.args]
    return None


def facts(sources: Sources, part: Part, others: frozenset = frozenset()) -> dict:
    """What the release has of ``part``: JSON data, compared with :func:`differences`. ``others`` are the
    functions of the other parts: their sources count for them, and ``reaches`` says which this one calls."""
    if sources.tree(part.module) is None:
        return {"module": None}
    found: dict = {"names": {name: sources.binds(part.module, name) for name in part.names}}
    if part.function is not None:
        located = sources.definition(part.module, part.function)
        if located is None:
            found["function"] = None
        else:
            defined_in, node = located
            found["function"] = {"module": defined_in, "signature": signature(node)}
            if part.source:
                found["function"]["source"], found["function"]["reaches"] = digest(
                    sources.tree(defined_in), node, others - {part.function})
            if part.returns:
                present = set(returned_namespace(node))
                found["returns"] = {name: name in present for name in part.returns}
    return found


def _signature_words(recorded: list, found: list) -> List[str]:
    old = {row[0]: row for row in recorded}
    new = {row[0]: row for row in found}
    words = [f"new parameter `{name}`" for name in new if name not in old]
    words += [f"parameter `{name}` removed" for name in old if name not in new]
    for name in new:
        if name in old and old[name] != new[name]:
            (_, old_kind, old_default), (_, new_kind, new_default) = old[name], new[name]
            if old_kind != new_kind:
                words.append(f"parameter `{name}` is now {new_kind.lower().replace('_', '-')}")
            if old_default != new_default:
                words.append(f"default of `{name}` {old_default or '(none)'} -> {new_default or '(none)'}")
    if not words and [row[0] for row in recorded] != [row[0] for row in found]:
        words.append("parameters reordered")
    return words


def differences(part: Part, recorded: dict, found: dict, release: str) -> List[str]:
    """How ``found`` differs from ``recorded`` (the facts of ``release``), in words; empty when it does not."""
    if found.get("module", True) is None:
        return [f"module `{part.module}` is gone"]
    words = [f"`{part.module}` no longer has `{name}`"
             for name, present in found["names"].items() if not present and recorded["names"].get(name, True)]
    if part.function is not None:
        old, new = recorded.get("function"), found.get("function")
        if new is None:
            words.append(f"`{part.module}` no longer defines `{part.function}`")
        elif old is not None:
            words += [f"`{name}` no longer returned" for name, present in found.get("returns", {}).items()
                      if not present and recorded.get("returns", {}).get(name, True)]
            if new["module"] != old["module"]:
                words.append(f"`{part.function}` moved from `{old['module']}` to `{new['module']}`")
            words += _signature_words(old["signature"], new["signature"])
            if not words and new.get("source") != old.get("source"):
                words.append(f"its source differs from {release}'s (same signature)")
    return words
