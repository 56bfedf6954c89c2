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
from typing import Dict, Iterator, List, Optional, Set, Tuple

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
    #: The op name after ``flashinfer::`` when the text gives it (string literals and constants, ``+``); else None.
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
    """What a getter returns: (key, value source) pairs, each key saying where the value sits in the getter's
    result. In a ``SimpleNamespace(key=value, ...)`` at the top the key is the attribute; a key computed from the
    getter's parameters is the expression computing it, prefixed with "=" (``"=f'{act}_and_mul'"``). Elsewhere it
    is the accessor from the result to the value: "" for the result itself (a getter that returns its function),
    ``"[1]"`` for a tuple's second item, ``"[0].run"`` for an attribute of a namespace inside one."""

    module: str
    getter: str
    entries: Tuple[Tuple[str, str], ...]
    #: Why the namespace cannot be rebuilt from the source, if it cannot.
    problem: Optional[str] = None
    #: The module's cached functions that end in ``return <getter>(...)``: where the getter takes what no schema
    #: holds (0.7.4's ``_build_trtllm_moe_namespace(module)``, a JIT spec), the op goes through such a function
    #: (``_get_trtllm_moe_sm100_module_impl(enable_rubin: bool)``), whose arguments are the whole key.
    built_by: Tuple[str, ...] = ()
    #: The getter's return statements and the ``if`` tests (over its parameters) they sit under, as lines of
    #: Python that rebuild its result from ``_entry_<n>`` (entry n's value) and ``_Namespace``.
    returns: Tuple[str, ...] = ()

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


def _module_strings(tree: ast.Module) -> Dict[str, str]:
    """The module's top-level names bound once, to a string literal (0.7.2's cake MoE GEMM: ``_OP_PREFIX =
    "flashinfer::cake_moe_grouped_gemm_"``): constants its op names may be built from."""
    stored = [n.id for s in tree.body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return {s.targets[0].id: s.value.value for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name) and stored.count(s.targets[0].id) == 1
            and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)}


def _string(node: Optional[ast.expr], strings: Dict[str, str]) -> Optional[str]:
    """The value of a string literal, a module string constant, or a ``+`` of those; None for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = (_string(node.left, strings), _string(node.right, strings))
        return None if None in parts else parts[0] + parts[1]
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _literal_name(call: ast.Call, strings: Dict[str, str]) -> Tuple[Optional[str], str]:
    argument = call.args[0] if call.args else None
    source = ast.unparse(argument) if argument is not None else ""
    value = _string(argument, strings) or ""
    if value.startswith(PREFIX):
        return value[len(PREFIX):], source
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


class _Unreadable(Exception):
    """What the getter returns cannot be rebuilt from its text; the message says why."""


class _Returned:
    """Reads what a getter returns, in the shapes FlashInfer's getters use: a ``SimpleNamespace`` (or a local name
    bound once to one), a declared function itself, a tuple of those and constants, under ``if`` tests on the
    getter's parameters. Each value becomes an entry; each return a line rebuilding it from the entries."""

    def __init__(self, getter: ast.FunctionDef, declared: Set[str]):
        self.getter, self.declared, self.entries = getter, declared, []
        arguments = getter.args
        self.parameters = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                           arguments.vararg, arguments.kwarg) if a is not None}
        self.assignments = _simple_assignments(getter)
        stored = [n.id for n in _walk_own(getter) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        self.bound = {s.targets[0].id: s.value for s in getter.body if isinstance(s, ast.Assign)
                      and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) and stored.count(s.targets[0].id) == 1}

    def lines(self, body: List[ast.stmt], indent: str = "") -> List[str]:
        found = []
        for statement in body:
            if isinstance(statement, ast.Return):
                value = statement.value if statement.value is not None else ast.Constant(None)
                return found + [f"{indent}return {self.form(value, '')}"]
            if isinstance(statement, ast.If) and _holds_return(statement):
                names = {n.id for n in ast.walk(statement.test) if isinstance(n, ast.Name)}
                if not names <= self.parameters:
                    raise _Unreadable(f"returns under a test on more than its parameters ({ast.unparse(statement.test)})")
                found += [f"{indent}if {ast.unparse(statement.test)}:"]
                found += self.lines(statement.body, indent + "    ") or [f"{indent}    pass"]
                if statement.orelse:
                    found += [f"{indent}else:"] + (self.lines(statement.orelse, indent + "    ") or [f"{indent}    pass"])
            elif _holds_return(statement):
                raise _Unreadable(f"returns inside a `{type(statement).__name__.lower()}` statement")
        return found

    def entry(self, key: str, value: ast.expr) -> str:
        pair = (key, ast.unparse(value))
        if pair not in self.entries:
            self.entries.append(pair)
        return f"_entry_{self.entries.index(pair)}"

    def form(self, node: ast.expr, path: str) -> str:
        """The expression rebuilding ``node`` (the getter's result at accessor ``path``) from the entries."""
        if isinstance(node, ast.Name) and node.id in self.declared:
            return self.entry(path, node)
        if isinstance(node, ast.Name) and node.id in self.bound:
            return self.form(self.bound[node.id], path)
        if isinstance(node, ast.Constant):
            return repr(node.value)
        if isinstance(node, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in node.elts):
            items = [self.form(element, f"{path}[{i}]") for i, element in enumerate(node.elts)]
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "SimpleNamespace":
            return self.namespace(node, path)
        raise _Unreadable(f"returns {ast.unparse(node)}, which is not a namespace, a declared function or a tuple")

    def namespace(self, call: ast.Call, path: str) -> str:
        items = []
        for keyword in call.keywords:
            if keyword.arg is not None:
                items.append((repr(keyword.arg), self.entry(f"{path}.{keyword.arg}" if path else keyword.arg,
                                                            keyword.value)))
            elif isinstance(keyword.value, ast.Dict):  # SimpleNamespace(**{fname: fn})
                for key, value in zip(keyword.value.keys, keyword.value.values):
                    literal = isinstance(key, ast.Constant) and isinstance(key.value, str)
                    if not literal and path:
                        raise _Unreadable(f"returns a namespace with a computed key inside {path}")
                    computed = "=" + _inline(key, self.assignments)
                    items.append((computed[1:] if not literal else repr(key.value),
                                  self.entry(key.value if literal else computed, value)))
            else:
                raise _Unreadable(f"returns SimpleNamespace(**{ast.unparse(keyword.value)})")
        return "_Namespace({" + ", ".join(f"{key}: {value}" for key, value in items) + "})"


def _holds_return(statement: ast.stmt) -> bool:
    return any(isinstance(node, ast.Return) for node in _walk_own(ast.Module([statement], [])))


def _namespace(getter: ast.FunctionDef, module: str, declared: Set[str]) -> Namespace:
    returned = _Returned(getter, declared)
    try:
        lines = returned.lines(getter.body)
    except _Unreadable as problem:
        return Namespace(module, getter.name, (), f"{getter.name} {problem}")
    return Namespace(module, getter.name, tuple(returned.entries), returns=tuple(lines))


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
    strings = _module_strings(tree)
    found, namespaces = [], []
    for scope, body, enclosing in _scopes(tree):
        defs = [node for statement in body for node in _direct_definitions(statement)
                if isinstance(node, ast.FunctionDef)]
        fakes = {}
        for node in defs:
            for decorator in node.decorator_list:
                marked = _decorator(decorator)
                if marked and marked[0] == FAKE:
                    fakes[_literal_name(marked[1], strings)[1]] = Fake(node.name, node.lineno, _without_decorators(node))
        getter = enclosing is not None and len(scope) == 1
        declared_here = set()
        for node in defs:
            for decorator in node.decorator_list:
                marked = _decorator(decorator)
                if not marked or marked[0] != CUSTOM:
                    continue
                name, name_source = _literal_name(marked[1], strings)
                declared_here.add(node.name)
                found.append(Declaration(
                    module, node.name, node.lineno, name, name_source, _mutates(marked[1]), scope,
                    ast.unparse(node.args), ast.unparse(node.returns) if node.returns is not None else None,
                    fakes.get(name_source), ast.unparse(enclosing.args) if getter else None,
                    tuple(ast.unparse(r.value) for r in _walk_own(node) if isinstance(r, ast.Return) and r.value),
                ))
        if getter and declared_here:
            namespaces.append(dataclasses.replace(_namespace(enclosing, module, declared_here),
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
