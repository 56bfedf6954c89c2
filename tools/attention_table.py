"""Write src/_fp4_dynamo_shim/declared/attention_table.json: per FlashInfer release, what each attention entry point
passes to its JIT module's run functions, read from the release's own sources (Python and the C++ bindings).

Each ``<module>.run/paged_run/ragged_run(...)`` call of an entry point (a public function or a wrapper's ``run``)
is followed to the getter that built the module (called there, or assigned to ``self._cached_module`` by a
method of the wrapper, ``plan`` among them). Recorded: the getter's parameters (those of the ``gen_*``/``get_*_uri``
function it forwards ``*args`` to); the run function's, in order, ``name:kind`` (r: a tensor read, w: a tensor
written in place, l: an int list, s: a scalar), from the def FlashInfer declared in the getter or, for a getter
that returns the built module, the C++ function's, whose types say more: ``?`` after r or w for an optional
tensor, and each scalar by its type (i: an integer, f: a floating-point number, b: a bool; s: another). A ``t``
after a def's kind: only its ``if backend == "trtllm-gen":`` branch reads the parameter, which defaults to None. A tensor is written when FlashInfer's ``mutates_args`` names
it or a backend's C++ function writes it (hands it to the kernel as ``params.o``/``lse``, or it is a workspace
buffer: ``*workspace*``, ``tmp``). Per backend (fa2; fa3: the ``_sm90`` binding), the C++ function exported.

    python tools/attention_table.py PACKAGE_DIR...   # each an installed or unpacked ``flashinfer`` directory
"""

from __future__ import annotations

import ast, json, re, sys  # noqa: E401
from pathlib import Path
from typing import Optional

from _fp4_dynamo_shim.declared.attention_table import FILE, RELEASES, ROWS

OUT = FILE  # what this tool writes

#: Entry point -> (the module files it was in across releases, the function or "Class.method").
ENTRIES = {
    "single_decode": (("decode",), "single_decode_with_kv_cache"),
    "single_prefill": (("prefill",), "single_prefill_with_kv_cache"),
    "batch_decode_paged": (("decode",), "BatchDecodeWithPagedKVCacheWrapper.run"),
    "batch_prefill_paged": (("prefill",), "BatchPrefillWithPagedKVCacheWrapper.run"),
    "batch_prefill_ragged": (("prefill",), "BatchPrefillWithRaggedKVCacheWrapper.run"),
    "mla_paged": (("mla/_core", "mla"), "BatchMLAPagedAttentionWrapper.run"),
}
RUNS = ("run", "paged_run", "ragged_run")
#: A C++ run's scalar parameters by type: what an op's schema needs where no Python def declares the run.
CPP_SCALARS = {"int64_t": "i", "int": "i", "double": "f", "float": "f", "bool": "b"}
OUTPUT_FIELD = re.compile(r"^\s*params\.(?:final_)?(?:o|lse)(?:_ptr)?\s*=")


class Package:
    def __init__(self, root: Path):
        self.root, self.texts, self._parsed = root, {}, {}
        for path in sorted(root.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "def get_" in text or "def gen_" in text or "Wrapper" in text:
                self.texts[path.relative_to(root).with_suffix("").as_posix()] = text
        meta = "".join(p.read_text() for p in (root / "_build_meta.py", root / "version.py") if p.exists())
        self.version = re.search(r"""__version__\s*=\s*["']([^"']+)""", meta).group(1)
        self.sources = {p.name: p.read_text() for p in sorted((root / "data" / "csrc").glob("*.cu*")) if p.is_file()}

    def defs(self, stem: str) -> dict:
        """name (``Class.method`` for a method) -> def, of one module, parsed when first asked for (a release has
        hundreds of modules, and parsing them all cost 12 s of the tool's 16)."""
        if stem not in self._parsed:
            defs = self._parsed[stem] = {}
            for node in ast.parse(self.texts[stem]).body if stem in self.texts else ():
                if isinstance(node, ast.FunctionDef):  # the last def of a name wins: @overload stubs come first
                    defs[node.name] = node
                elif isinstance(node, ast.ClassDef):
                    defs.update({f"{node.name}.{m.name}": m for m in node.body if isinstance(m, ast.FunctionDef)})
        return self._parsed[stem]

    def named(self, name: str) -> Optional[ast.FunctionDef]:
        """The module-level def of ``name`` (a getter or generator), wherever it is; the last module's in path order."""
        found = None
        for stem, text in self.texts.items():
            if f"def {name}(" in text:
                found = self.defs(stem).get(name, found)
        return found

    def cpp(self, stem: str, entry: str) -> dict:
        """Backend -> (the C++ function exported as ``entry`` by the bindings of ``stem``, its parameters)."""
        found = {}
        for backend, name in ((b, f"{stem}{infix}{jit}_binding.cu") for b, infix in (("fa2", ""), ("fa3", "_sm90"))
                              for jit in ("_jit", "")):
            exports = dict(re.findall(r"EXPORT_TYPED_FUNC\((\w+),\s*(\w+)\)", self.sources.get(name, "")))
            found.update({backend: (exports[entry], self._parameters(exports[entry]))} if entry in exports else {})
        return found

    def _parameters(self, function: str) -> str:
        for text in self.sources.values():
            match = re.search(rf"\bvoid\s+{function}\s*\(([^)]*)\)\s*\{{", text)
            if match:
                depth, end = 1, match.end()
                while depth:
                    depth, end = depth + {"{": 1, "}": -1}.get(text[end], 0), end + 1
                return _cpp_parameters(match.group(1), text[match.end():end])
        raise SystemExit(f"flashinfer {self.version}: no definition of {function} in data/csrc")


def _cpp_parameters(arguments: str, body: str) -> str:
    """``name:kind`` of a C++ run function; written: what a statement hands the kernel as its output."""
    written = {name for statement in body.split(";") if OUTPUT_FIELD.match(statement)
               for name in re.findall(r"\b(\w+)\s*(?:\.value\(\))?\s*\.data_ptr", statement)}
    declared = [d.strip().rsplit(" ", 1) for d in re.sub(r"\s+", " ", arguments.replace(
        "ADDITIONAL_FUNC_PARAMS", "")).split(",")]
    def kind_of(cpp_type: str, name: str) -> str:
        if "TensorView" in cpp_type:
            written_here = name in written or "workspace" in name or name == "tmp"
            return ("w" if written_here else "r") + ("?" if "Optional" in cpp_type else "")
        return "l" if "Array" in cpp_type else CPP_SCALARS.get(cpp_type.removeprefix("const "), "s")

    return " ".join(f"{name}:{kind_of(kind, name)}" for kind, name in declared)


def _getters(function: ast.FunctionDef, methods: list) -> list:
    """(getter, entry) per run call, through locals and the getters any method assigns ``self._cached_module``."""
    assigned = {ast.unparse(n.targets[0]): n.value for n in ast.walk(function) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call) and ast.unparse(n.targets[0]) != "self._cached_module"}
    cached = [ast.unparse(n.value.func) for method in methods for n in ast.walk(method) if isinstance(n, ast.Assign)
              and ast.unparse(n.targets[0]) == "self._cached_module" and isinstance(n.value, ast.Call)]
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RUNS:
            owner = assigned.get(ast.unparse(node.func.value), node.func.value)
            if isinstance(owner, ast.Call):
                found.add((ast.unparse(owner.func), node.func.attr))
            elif ast.unparse(owner) == "self._cached_module":
                found.update((getter, node.func.attr) for getter in cached)
    return sorted(found)


def _getter_parameters(package: Package, node: ast.FunctionDef) -> str:
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call) and node.args.vararg):  # gen_x(backend, *args)
        starred = [i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)]
        target = package.named(ast.unparse(call.func)) if starred else None
        if target is not None and target.args.vararg is None:
            given = [ast.unparse(a) for a in call.args[:starred[0]]]
            named, defaults = target.args.args, target.args.defaults
            spelled = [ast.unparse(a) + (f" = {ast.unparse(d)}" if d else "") for a, d in
                       zip(named, [None] * (len(named) - len(defaults)) + defaults)]
            own = [spelled[given.index(a.arg)] if a.arg in given else ast.unparse(a) for a in node.args.args]
            return ", ".join(own + spelled[starred[0]:])
    return ast.unparse(node.args)


def _row(package: Package, getter: str, entry: str):
    node = package.named(getter)
    cpp = package.cpp(getter.removeprefix("get_").removesuffix("_module"), entry)
    returned = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)]
    namespace = next((r for r in returned if ast.unparse(r.func) == "SimpleNamespace"), None)
    value = next((k.value for k in (namespace.keywords if namespace else ()) if k.arg == entry), None)
    if (value is None) if namespace is not None else not cpp:
        return None  # the wrapper calls this entry only on another getter's modules
    row = {"getter": getter, "entry": entry, "run": None, "mutates": None,
           "getter_parameters": _getter_parameters(package, node),
           "backends": {backend: function for backend, (function, _) in cpp.items()}}
    run = {n.name: n for n in ast.walk(node) if isinstance(n, ast.FunctionDef)}.get(getattr(value, "id", None))
    if run is None:  # the getter returns the built module: the C++ function's parameters are the run's
        return {**row, "parameters": cpp["fa2"][1]}
    mutates = [ast.literal_eval(k.value) for d in run.decorator_list for k in getattr(d, "keywords", ())
               if k.arg == "mutates_args"]
    written = set(mutates[0] if mutates else ()) | {name for _, params in cpp.values() for name, kind in
                                                     (p.split(":") for p in params.split()) if kind.startswith("w")}
    kinds, trtllm_gen_only = [], set(_read_only_under_trtllm_gen(run)) - written
    for argument in run.args.posonlyargs + run.args.args + run.args.kwonlyargs:
        text = ast.unparse(argument.annotation) if argument.annotation is not None else ""
        kind = ("w" if argument.arg in written else "r") if "Tensor" in text else "l" if text.lower().startswith(
            "list[int]") else "s"
        kinds.append(f"{argument.arg}:{kind}" + ("t" if argument.arg in trtllm_gen_only else ""))
    return {**row, "run": run.name, "mutates": " ".join(mutates[0]) if mutates else "",
            "parameters": " ".join(kinds + (["*args"] if run.args.vararg else []))}


def _read_only_under_trtllm_gen(run: ast.FunctionDef) -> list:
    """The run's parameters that default to None and that only its ``if backend == "trtllm-gen":`` branch reads:
    under another backend FlashInfer never reads what a caller passes there (the row leaves out those it writes:
    an op declares those whatever the backend)."""
    branches = [n for n in ast.walk(run) if isinstance(n, ast.If) and ast.unparse(n.test) in (
        "backend == 'trtllm-gen'", "'trtllm-gen' == backend")]
    inside = {n.id for branch in branches for statement in branch.body for n in ast.walk(statement)
              if isinstance(n, ast.Name)}
    inside_ids = {id(n) for branch in branches for statement in branch.body for n in ast.walk(statement)}
    outside = {n.id for statement in run.body for n in ast.walk(statement)
               if isinstance(n, ast.Name) and id(n) not in inside_ids}
    arguments = run.args.posonlyargs + run.args.args
    defaults = dict(zip([a.arg for a in arguments][len(arguments) - len(run.args.defaults):], run.args.defaults))
    return [a.arg for a in arguments if a.arg in inside and a.arg not in outside
            and isinstance(defaults.get(a.arg), ast.Constant) and defaults[a.arg].value is None]


def read(root: Path) -> tuple:
    """(release, its rows) for one ``flashinfer`` package directory; each row names the entry points reaching it."""
    package, rows = Package(Path(root)), {}
    for entry_point, (stems, qualified) in ENTRIES.items():
        stem = next((s for s in stems if qualified in package.defs(s)), None)
        owner = qualified.split(".")[0] + "." if "." in qualified else None
        methods = [node for name, node in package.defs(stem).items() if owner and name.startswith(owner)] if stem else []
        for getter, entry in _getters(package.defs(stem)[qualified], methods) if stem else ():
            row = _row(package, getter, entry) if package.named(getter) is not None else None
            if row is not None:
                rows.setdefault((getter, entry), {"entry_points": (), **row})["entry_points"] += (entry_point,)
    return package.version, list(rows.values())


def render(releases: dict) -> str:
    """Rows shared by releases are written once ("rows"); each release lists its rows' keys ("releases"). One row
    and one release a line, so that a new release reads as a diff of lines."""
    rows, listed = {}, {}
    for version in sorted(releases, key=lambda v: [int(p) if p.isdigit() else p for p in v.split(".")]):
        for row in releases[version]:
            stem = f"{row['getter'].removeprefix('get_').removesuffix('_module')}.{row['entry']}/"
            rows[next((k for k, known in rows.items() if known == row), None) or
                 f"{stem}{sum(k.startswith(stem) for k in rows) + 1}"] = row
        listed[version] = [k for row in releases[version] for k, v in rows.items() if v == row]
    lines = lambda table: ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())  # noqa: E731
    return ('{"generated": "by tools/attention_table.py (its docstring says what each field is): do not edit",\n'
            f' "rows": {{\n{lines(rows)}\n }},\n "releases": {{\n{lines(listed)}\n }}\n}}\n')


def committed() -> dict:
    """Release -> entry point -> its rows, as the committed file held them when this process read it."""
    return {version: [ROWS[k] for k in keys] for version, keys in RELEASES.items()}


if __name__ == "__main__":
    releases = committed()
    for version, table in map(read, map(Path, sys.argv[1:])):
        releases[version] = table
        print(f"flashinfer {version}: " + ", ".join(sorted({e for row in table for e in row["entry_points"]})))
    OUT.write_text(render(releases))
