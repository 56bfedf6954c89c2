"""The ops FlashInfer declares, read from its source files rather than caught while its decorators run.

FlashInfer marks its kernels' Python entry points ``@register_custom_op("flashinfer::name", mutates_args=...)``
and their fakes ``@register_fake_op("flashinfer::name")``. In every release 0.5.3-0.7.4 both decorators return
the function unchanged, on either side of their ``torch < 2.4`` test (``flashinfer/utils.py``), so nothing of
them survives import: the plugin route applies after FlashInfer's modules are imported, and a decorator
patched at that point would have seen nothing. The declarations are therefore read back with :mod:`ast`, from
the installed package (``apply``) or from an unpacked wheel (the per-release table's script), and come out the
same whatever was imported when.

Most declarations sit inside a cached module getter (``get_sampling_module()`` builds the JIT module and
returns a ``SimpleNamespace`` of the functions it defines); for those the getter's parameters and the names the
namespace gives each function are recorded too, since that is how FlashInfer's public functions reach them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

PREFIX = "flashinfer::"
CUSTOM, FAKE = "register_custom_op", "register_fake_op"


@dataclasses.dataclass(frozen=True)
class Fake:
    function: str
    line: int
    #: The fake's own text (decorators removed), compiled in its module's globals when it is nested.
    source: str


@dataclasses.dataclass(frozen=True)
class Declaration:
    module: str  # "flashinfer.norm"
    function: str  # the decorated def: "_rmsnorm_impl"
    line: int
    #: The op name after ``flashinfer::`` when it is a literal; None when it is computed at run time.
    name: Optional[str]
    name_source: str  # the first decorator argument, as written
    #: ``mutates_args`` as a tuple of names (FlashInfer also writes one string, or ""); None when not a literal.
    mutates: Optional[Tuple[str, ...]]
    #: Enclosing defs and classes, outermost first ("class X" for a class); () at module level.
    scope: Tuple[str, ...]
    parameters: str  # ast.unparse of the def's arguments
    returns: Optional[str]
    fake: Optional[Fake]
    #: For a def nested in a getter (one level): the getter's parameters.
    getter_parameters: Optional[str] = None
    #: What its own ``return`` statements return, as written (a list annotation over ``return output`` is a fault).
    return_values: Tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Unique within a release: module, enclosing scope and def name."""
        return ".".join((self.module, *self.scope, self.function))

    @property
    def getter(self) -> Optional[str]:
        return self.scope[0] if len(self.scope) == 1 and not self.scope[0].startswith("class ") else None


@dataclasses.dataclass(frozen=True)
class Namespace:
    """What a getter returns, ``SimpleNamespace(key=value, ...)``: (key, value source) pairs. A key computed
    from the getter's parameters is the expression computing it, prefixed with "=" (``"=f'{act}_and_mul'"``)."""

    module: str
    getter: str
    entries: Tuple[Tuple[str, str], ...]
    #: Why the namespace cannot be rebuilt from the source, if it cannot.
    problem: Optional[str] = None
    #: The module's cached functions that end in ``return <getter>(...)``: where the getter takes what no schema
    #: holds (0.7.4's ``_build_trtllm_moe_namespace(module)``, a JIT spec), the op goes through such a function
    #: (``_get_trtllm_moe_sm100_module_impl(enable_rubin: bool)``), whose arguments are the whole key.
    built_by: Tuple[str, ...] = ()

    def keys_of(self, function: str) -> Tuple[str, ...]:
        return tuple(key for key, value in self.entries if value == function)


@dataclasses.dataclass(frozen=True)
class Scan:
    declarations: Tuple[Declaration, ...]
    #: (module, getter) -> its namespace, for every getter that declares ops.
    namespaces: Dict[Tuple[str, str], Namespace]


def _decorator(node: ast.expr) -> Optional[Tuple[str, ast.Call]]:
    if isinstance(node, ast.Call):
        function = node.func
        name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
        if name in (CUSTOM, FAKE):
            return name, node
    return None


def _literal_name(call: ast.Call) -> Tuple[Optional[str], str]:
    argument = call.args[0] if call.args else None
    source = ast.unparse(argument) if argument is not None else ""
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str) and argument.value.startswith(PREFIX):
        return argument.value[len(PREFIX):], source
    return None, source


def _mutates(call: ast.Call) -> Optional[Tuple[str, ...]]:
    for keyword in call.keywords:
        if keyword.arg == "mutates_args":
            try:
                value = ast.literal_eval(keyword.value)
            except ValueError:
                return None
            if isinstance(value, str):
                return (value,) if value else ()
            if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
                return tuple(item for item in value if item)
            return None
    return ()


def _without_decorators(node: ast.FunctionDef) -> str:
    copy = ast.FunctionDef(node.name, node.args, node.body, [], node.returns, getattr(node, "type_comment", None),
                           **({"type_params": []} if "type_params" in ast.FunctionDef._fields else {}))
    return ast.unparse(ast.copy_location(copy, node))


def _simple_assignments(getter: ast.FunctionDef) -> Dict[str, ast.expr]:
    """Top-level ``name = <f-string or constant>`` statements of the getter (how it computes a key)."""
    found = {}
    for statement in getter.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and isinstance(statement.value, (ast.JoinedStr, ast.Constant))):
            found[statement.targets[0].id] = statement.value
    return found


def _inline(expression: ast.expr, assignments: Dict[str, ast.expr]) -> str:
    """The key expression in terms of the getter's parameters: simple local names replaced by their values."""

    class Inline(ast.NodeTransformer):
        def visit_Name(self, node):
            return assignments[node.id] if node.id in assignments else node

    return ast.unparse(Inline().visit(expression))


def _namespace(getter: ast.FunctionDef, module: str) -> Namespace:
    returns = [node for node in _walk_own(getter) if isinstance(node, ast.Return)]
    calls = [r.value for r in returns if isinstance(r.value, ast.Call)
             and getattr(r.value.func, "id", getattr(r.value.func, "attr", None)) == "SimpleNamespace"]
    if len(returns) != 1 or len(calls) != 1:
        return Namespace(module, getter.name, (), f"{getter.name} does not end in one `return SimpleNamespace(...)`")
    call, entries = calls[0], []
    assignments = _simple_assignments(getter)
    for keyword in call.keywords:
        if keyword.arg is not None:
            entries.append((keyword.arg, ast.unparse(keyword.value)))
        elif isinstance(keyword.value, ast.Dict):  # SimpleNamespace(**{fname: fn})
            for key, value in zip(keyword.value.keys, keyword.value.values):
                literal = isinstance(key, ast.Constant) and isinstance(key.value, str)
                entries.append((key.value if literal else "=" + _inline(key, assignments), ast.unparse(value)))
        else:
            return Namespace(module, getter.name, (),
                             f"{getter.name} returns SimpleNamespace(**{ast.unparse(keyword.value)})")
    return Namespace(module, getter.name, tuple(entries))


def _cached_callers(tree: ast.Module, getter: str) -> Tuple[str, ...]:
    """The module-level defs decorated with a cache (``functools.cache``, ``lru_cache(...)``) whose last statement
    is ``return <getter>(...)``."""
    found = []
    for node in (n for statement in tree.body for n in _direct_definitions(statement)):
        if not isinstance(node, ast.FunctionDef) or not node.body:
            continue
        last = node.body[-1]
        cached = any("cache" in ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list)
        if cached and isinstance(last, ast.Return) and isinstance(last.value, ast.Call) \
                and getattr(last.value.func, "id", None) == getter:
            found.append(node.name)
    return tuple(found)


def _walk_own(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``function``'s body, not descending into nested defs, lambdas or classes."""
    stack = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _scopes(tree: ast.Module) -> Iterator[Tuple[Tuple[str, ...], List[ast.stmt], Optional[ast.FunctionDef]]]:
    """(scope names, statements, enclosing def) for the module and every def or class in it."""
    pending = [((), tree.body, None)]
    while pending:
        scope, body, enclosing = pending.pop()
        yield scope, body, enclosing
        for node in body:
            for child in _direct_definitions(node):
                if isinstance(child, ast.ClassDef):
                    pending.append((scope + (f"class {child.name}",), child.body, None))
                else:
                    pending.append((scope + (child.name,), child.body, child))


def _direct_definitions(node: ast.stmt) -> Iterator[ast.stmt]:
    """Defs and classes defined by ``node`` in the same scope (also inside if/try/with blocks)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node
        return
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, ()) or ():
            yield from _direct_definitions(child)


def scan_source(text: str, module: str) -> Tuple[List[Declaration], List[Namespace]]:
    """Every ``register_custom_op`` declaration in one file's text, with its fake, and the namespaces of the
    getters that hold declarations."""
    tree = ast.parse(text)
    found, namespaces = [], []
    for scope, body, enclosing in _scopes(tree):
        defs = [node for statement in body for node in _direct_definitions(statement)
                if isinstance(node, ast.FunctionDef)]
        fakes = {}
        for node in defs:
            for decorator in node.decorator_list:
                marked = _decorator(decorator)
                if marked and marked[0] == FAKE:
                    fakes[_literal_name(marked[1])[1]] = Fake(node.name, node.lineno, _without_decorators(node))
        getter = enclosing is not None and len(scope) == 1
        declared_here = False
        for node in defs:
            for decorator in node.decorator_list:
                marked = _decorator(decorator)
                if not marked or marked[0] != CUSTOM:
                    continue
                name, name_source = _literal_name(marked[1])
                declared_here = True
                found.append(Declaration(
                    module, node.name, node.lineno, name, name_source, _mutates(marked[1]), scope,
                    ast.unparse(node.args), ast.unparse(node.returns) if node.returns is not None else None,
                    fakes.get(name_source), ast.unparse(enclosing.args) if getter else None,
                    tuple(ast.unparse(r.value) for r in _walk_own(node) if isinstance(r, ast.Return) and r.value),
                ))
        if getter and declared_here:
            namespaces.append(dataclasses.replace(_namespace(enclosing, module),
                                                  built_by=_cached_callers(tree, enclosing.name)))
    return sorted(found, key=lambda d: (d.module, d.line)), namespaces


def module_name(package_dir: Path, path: Path) -> str:
    relative = path.relative_to(package_dir.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _declares(path: Path, mtime_ns: int, size: int) -> bool:
    try:
        return f"@{CUSTOM}" in path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


@functools.lru_cache(maxsize=None)
def _python_files(package_dir: Path, installed_ns: int) -> Tuple[Path, ...]:
    """The package's .py files, listed once per installation (``installed_ns``: its __init__.py's mtime)."""
    return tuple(sorted(package_dir.rglob("*.py")))


def declaring_files(package_dir: Path) -> Iterator[Path]:
    """The package's files that mention ``register_custom_op`` (a text test first: parsing is the cost)."""
    for path in _python_files(package_dir, (package_dir / "__init__.py").stat().st_mtime_ns):
        stat = path.stat()
        if _declares(path, stat.st_mtime_ns, stat.st_size):
            yield path


def scan(package_dir: Path) -> Scan:
    """Every declaration under ``package_dir`` (the ``flashinfer`` directory), sorted by module and line."""
    return scan_files(Path(package_dir), declaring_files(Path(package_dir)))


@functools.lru_cache(maxsize=None)
def _scan_file(path: Path, module: str, mtime_ns: int, size: int):
    """One file's declarations, parsed once per content (revert() and apply() again re-read nothing)."""
    return scan_source(path.read_text(encoding="utf-8"), module)


def scan_files(package_dir: Path, paths) -> Scan:
    """The declarations of some of the package's files."""
    declarations, namespaces = [], {}
    for path in paths:
        stat = path.stat()
        found, getters = _scan_file(path, module_name(package_dir, path), stat.st_mtime_ns, stat.st_size)
        declarations.extend(found)
        namespaces.update({(n.module, n.getter): n for n in getters})
    return Scan(tuple(declarations), namespaces)
