"""FlashInfer's own declarations, turned on while the shim is applied: every ``register_custom_op`` FlashInfer
wrote becomes a real op, and Dynamo traces that op wherever it meets FlashInfer's function (issue 20).

* Found by reading FlashInfer's sources (``declared``), not at decoration time.
* Registered under the shim's namespace ``fp4_dynamo_shim_flashinfer::<name>`` (FlashInfer's own name after
  ``flashinfer::``), with ``Library.define`` + ``impl`` + ``register_fake``: never ``flashinfer::<name>``,
  which a FlashInfer build that turns its decorators on (a fork's ``FLASHINFER_USE_TORCH_CUSTOM_OPS=1``, PR
  #2734) would define itself, in a getter that runs after the shim applied, and fail on. A name FlashInfer
  did register is left alone.
* Eager calls are FlashInfer's own: nothing is rebound. Dynamo is told, through ``polyfill``, to trace the
  generated caller instead of FlashInfer's function (or instead of the getter whose namespace holds it), so
  FlashInfer's eager cost is unchanged and no dispatcher is on the eager path. The polyfills go in when
  ``torch._dynamo`` is imported (at once if it is): importing it costs about a second, which start-up does
  not pay for a program that never compiles.
* The gate ``FP4_DYNAMO_SHIM_FLASHINFER_OPS`` (``declared_rules``) picks which declarations; everything not
  registered is listed with the reason. :func:`revert` removes the polyfills and destroys the fragment.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from . import declared, declared_codegen, declared_rules, polyfill
from .declared_codegen import NotExpressible
from .errors import ApplyError

logger = logging.getLogger(__name__)

NAMESPACE = "fp4_dynamo_shim_flashinfer"
#: (major, minor) per visible GPU, read at apply: what FlashInfer's get_compute_capability returns under
#: tracing (Dynamo cannot trace the device query itself).
CAPABILITIES: Dict[int, tuple] = {}
#: FlashInfer's cached device queries on the paths to declared ops: (module, function, what it takes).
#: Dynamo traces a lookup in CAPABILITIES instead (the function itself is untouched).
HELPERS = (
    ("flashinfer.utils", "get_compute_capability", "device"),
    ("flashinfer.sampling", "_blackwell_softmax_capability", "index"),  # 0.7.x: torch.cuda.get_device_capability
)


@dataclasses.dataclass
class Outcome:
    key: str  # declared.Declaration.key
    declared: str  # FlashInfer's name, as written
    group: str  # the gate group: "sglang" or "all"
    op: Optional[str] = None  # "fp4_dynamo_shim_flashinfer::rmsnorm" when registered
    reason: Optional[str] = None  # why it is not
    #: True when the reason is an error while registering (STRICT raises), not a fact of the release.
    failed: bool = False
    #: Which fake the op has: "FlashInfer's", "FlashInfer's, by keyword (...)", "none needed (returns None)".
    fake: Optional[str] = None


@dataclasses.dataclass
class Layer:
    gate: str
    scanned: str
    strict: bool = False
    outcomes: List[Outcome] = dataclasses.field(default_factory=list)
    undo: List[Callable] = dataclasses.field(default_factory=list)
    helpers: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    #: (FlashInfer's function, the traceable, the outcomes it serves, what it is), waiting for torch._dynamo.
    pending: List[tuple] = dataclasses.field(default_factory=list)
    #: "pending" until torch._dynamo is imported, then "installed"; "reverted" after revert().
    polyfills: str = "none"


def _group(declaration: declared.Declaration) -> str:
    return "sglang" if (declaration.module, declaration.name) in declared_rules.SGLANG else "all"


def _scan(package: Path, gate: str) -> tuple:
    if gate == "all":
        return declared.scan(package), "every file of the package"
    # The default gate reads only the files of the declarations it turns on: a full scan costs 0.1-0.8 s.
    modules = {module for module, _ in declared_rules.SGLANG}
    paths = [package.parent.joinpath(*m.split(".")) for m in sorted(modules)]
    files = [p / "__init__.py" if p.is_dir() else p.with_suffix(".py") for p in paths]
    return declared.scan_files(package, [f for f in files if f.exists()]), "the default gate's modules: " + ", ".join(sorted(modules))


def _module(name: str):
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except Exception as error:  # any import failure is a fact of this environment, listed
        raise NotExpressible(f"{name} does not import here ({type(error).__name__}: {error})") from None


def _already_an_op(name: Optional[str]) -> bool:
    if name is None:
        return False
    try:
        getattr(torch.ops.flashinfer, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _signature(function) -> inspect.Signature:
    try:
        return inspect.signature(function, eval_str=True)
    except Exception as error:  # an annotation that does not evaluate, a builtin
        raise NotExpressible(f"signature: {type(error).__name__}: {error}") from None


def _compiled(source: str, module, what: str):
    """A def compiled from FlashInfer's text in its module's globals (the module itself is not touched)."""
    local: dict = {}
    try:
        exec(compile(source, getattr(module, "__file__", "<flashinfer>"), "exec"), module.__dict__, local)
    except Exception as error:  # e.g. a default that names one of the getter's locals
        raise NotExpressible(f"{what} does not compile outside its getter ({type(error).__name__}: {error})") from None
    return next(iter(local.values()))


def _free_names(source: str, module) -> List[str]:
    import ast
    import builtins

    tree = ast.parse(source).body[0]
    bound = {a.arg for a in ast.walk(tree.args) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(loaded - bound - set(module.__dict__) - set(dir(builtins)))


def _returns_none(function) -> bool:
    return _signature(function).return_annotation in (None, type(None))


def _fake(declaration: declared.Declaration, module, function):
    """(FlashInfer's fake or None, the keywords to call it with or None, how) for one declaration.

    FlashInfer's fakes never ran (its decorators are no-ops), and some drifted from their functions: a fake
    whose parameters are a subset of the function's is called by keyword with those; one that names
    parameters the function lacks is dropped where the function returns None (it needs no fake), and the
    declaration is not registered otherwise.
    """
    if declaration.fake is None:
        if _returns_none(function):
            return None, None, "none needed (returns None)"
        raise NotExpressible("returns a value and FlashInfer wrote no fake for it")
    if not declaration.scope:
        fake = module.__dict__[declaration.fake.function]
    else:
        free = _free_names(declaration.fake.source, module)
        if free:
            raise NotExpressible(f"FlashInfer's fake reads its getter's locals ({', '.join(free)})")
        fake = _compiled(declaration.fake.source, module, f"fake {declaration.fake.function}")
    own, theirs = list(_signature(function).parameters), list(_signature(fake).parameters)
    if theirs == own:
        return fake, None, "FlashInfer's"
    if set(theirs) <= set(own):
        return fake, theirs, f"FlashInfer's, by keyword (it lacks {', '.join(n for n in own if n not in theirs)})"
    stale = ", ".join(n for n in theirs if n not in own)
    if _returns_none(function):
        return None, None, f"none needed (returns None; FlashInfer's fake names parameters it lacks: {stale})"
    raise NotExpressible(f"FlashInfer's fake names parameters the function lacks ({stale})")


def _stub(declaration: declared.Declaration, module):
    returns = f" -> {declaration.returns}" if declaration.returns else ""
    return _compiled(f"def {declaration.function}({declaration.parameters}){returns}: pass", module, declaration.function)


class _Registrar:
    """Defines ops in one fragment and keeps the bindings the generated code needs."""

    def __init__(self, layer: Layer):
        self.library = torch.library.Library(NAMESPACE, "FRAGMENT")
        layer.undo.append(self.library._destroy)
        self.names: set = set()
        self.count = 0

    def name_for(self, declaration: declared.Declaration) -> str:
        base = declaration.name if declaration.name is not None else declaration.function.lstrip("_")
        name, suffix = base, 2
        while name in self.names:
            name, suffix = f"{base}_{suffix}", suffix + 1
        self.names.add(name)
        return name

    def register(self, op: declared_codegen.Op, kernel: Callable, fake: Callable):
        self.library.define(op.name + op.schema)
        for key in ("CPU", "CUDA"):
            self.library.impl(op.name, kernel, key)
        torch.library.register_fake(f"{NAMESPACE}::{op.name}", fake, lib=self.library)
        return getattr(getattr(torch.ops, NAMESPACE), op.name).default


def _build(registrar, declaration, module, getter=None, key=None):
    """(op object, Op) for one declaration; raises NotExpressible for a fact, anything else for a failure."""
    index = registrar.count = registrar.count + 1
    if getter is None:
        function = module.__dict__.get(declaration.function)
        inner = inspect.unwrap(function) if callable(function) else None
        if getattr(getattr(inner, "__code__", None), "co_name", None) != declaration.function:
            raise NotExpressible(f"{declaration.module}.{declaration.function} is not that function at import time")
        signature, getter_signature, bindings = _signature(function), None, {f"_target_{index}": function}
    else:
        function = _stub(declaration, module)
        signature, getter_signature = _signature(function), _signature(getattr(getter, "__wrapped__", getter))
        bindings = {f"_getter_{index}": getter}
    op = declared_codegen.plan(registrar.name_for(declaration), declaration.function, signature,
                               declaration.mutates, getter_signature)
    fake, fake_keywords, how = _fake(declaration, module, function)
    target = declared_codegen.target_expression(index, getter_signature, key)
    kernel, fake_function = declared_codegen.kernel_and_fake(op, index, bindings, target, fake, module.__file__,
                                                             fake_keywords)
    return registrar.register(op, kernel, fake_function), op, index, how


def _caller_namespace() -> dict:
    return {"_Tensor": torch.Tensor, "_NotExpressible": declared_codegen.NotExpressibleError,
            "_Namespace": declared_codegen.Namespace}


def _install_module_level(layer, registrar, declaration, module, outcome):
    op_object, op, index, outcome.fake = _build(registrar, declaration, module)
    namespace = {**_caller_namespace(), f"_op_{index}": op_object}
    exec(compile(declared_codegen.caller_source(op, index, namespace), f"<{NAMESPACE} {declaration.key}>", "exec"),
         namespace)
    layer.undo.append(lambda: namespace.update({f"_op_{index}": None}))  # compiled frames re-check this global
    layer.pending.append((module.__dict__[declaration.function], namespace[f"_caller_{index}"], [outcome],
                          declaration.key))
    outcome.op = f"{NAMESPACE}::{op.name}"


def _install_getter(layer, registrar, members, module, namespace_facts: declared.Namespace):
    """One polyfill for a getter: a namespace whose declared entries call the ops, the rest refuse."""
    getter_object = module.__dict__.get(namespace_facts.getter)
    if getter_object is None or namespace_facts.problem:
        reason = namespace_facts.problem or f"{namespace_facts.getter} is not a module attribute"
        for _, outcome in members:
            outcome.reason = reason
        return
    getter = getattr(getter_object, "__wrapped__", getter_object)  # Dynamo traces __wrapped__ of a functools.cache
    namespace, entries, built = _caller_namespace(), {}, 0
    source = [f"def _getter({declared_codegen._declare(_signature(getter), namespace, 'g')}):\n"]
    for declaration, outcome in members:
        keys = namespace_facts.keys_of(declaration.function)
        if outcome.reason is not None:
            continue
        if not keys:
            outcome.reason = f"{namespace_facts.getter}'s namespace does not hold {declaration.function}"
            continue
        try:
            op_object, op, index, outcome.fake = _build(registrar, declaration, module, getter_object, keys[0])
        except NotExpressible as fact:
            outcome.reason = str(fact)
            continue
        except Exception as error:  # registration itself went wrong: listed, STRICT raises
            outcome.reason, outcome.failed = f"{type(error).__name__}: {error}", True
            continue
        namespace[f"_op_{index}"] = op_object
        source.append(declared_codegen.caller_source(op, index, namespace, indent="    "))
        entries.update({key: f"_caller_{index}" for key in keys})
        outcome.op, built = f"{NAMESPACE}::{op.name}", built + 1
    if not built:
        return
    for number, (key, value) in enumerate(namespace_facts.entries):
        if key not in entries:
            namespace[f"_unavailable_{number}"] = declared_codegen.unavailable(
                f"{module.__name__}.{namespace_facts.getter}().{key.lstrip('=')}")
            entries[key] = f"_unavailable_{number}"
    items = ", ".join(f"{key[1:] if key.startswith('=') else repr(key)}: {value}" for key, value in entries.items())
    source.append(f"    return _Namespace({{{items}}})\n")
    exec(compile("".join(source), f"<{NAMESPACE} {module.__name__}.{namespace_facts.getter}>", "exec"), namespace)
    layer.undo.append(lambda: namespace.update({name: None for name in list(namespace) if name.startswith("_op_")}))
    layer.pending.append((getter, namespace["_getter"], [o for _, o in members if o.op],
                          f"{module.__name__}.{namespace_facts.getter}"))


def _capability_of_device(device):
    if device.type != "cuda":
        raise ValueError("device must be a cuda device")
    return CAPABILITIES[device.index if device.index is not None else torch.cuda.current_device()]


def _capability_of_index(device_index):
    return CAPABILITIES[device_index]


_TRACED_HELPERS = {"device": _capability_of_device, "index": _capability_of_index}


def _queue_helpers(layer: Layer) -> None:
    served = [outcome for outcome in layer.outcomes if outcome.op]
    for module_name, name, takes in HELPERS:
        function = getattr(sys.modules.get(module_name), name, None)
        if function is not None:
            layer.pending.append((getattr(function, "__wrapped__", function), _TRACED_HELPERS[takes], served,
                                  f"{module_name}.{name}"))
            layer.helpers.append(f"{module_name}.{name}")


def _install_polyfills(layer: Layer) -> None:
    """Hand the traceables to Dynamo (run once torch._dynamo is imported). A polyfill that cannot be
    installed leaves the ops it serves unreachable: they are listed as failed, and STRICT raises."""
    if layer.polyfills != "pending":
        return
    if torch.cuda.is_available():
        CAPABILITIES.update({i: torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    failures = []
    for original, traceable, outcomes, what in layer.pending:
        try:
            layer.undo.append(polyfill.install(original, traceable))
        except Exception as error:  # e.g. another library already substitutes this function
            failures.append(f"{what}: {type(error).__name__}: {error}")
            for outcome in outcomes:
                outcome.op, outcome.failed = None, True
                outcome.reason = f"polyfill for {what}: {type(error).__name__}: {error}"
    layer.pending.clear()
    layer.polyfills = "installed"
    if failures:
        message = "fp4_dynamo_shim: Dynamo polyfills failed, those ops stay untraceable: " + "; ".join(failures)
        logger.warning(message)
        if layer.strict:
            raise ApplyError(message)


def _when_dynamo_is_imported(layer: Layer) -> None:
    layer.polyfills = "pending"
    if "torch._dynamo" in sys.modules:
        _install_polyfills(layer)
        return
    import wrapt

    wrapt.register_post_import_hook(lambda module: _install_polyfills(layer), "torch._dynamo")


def apply(gate: str, strict: bool = False) -> Layer:
    """Register what ``gate`` selects; returns the layer (``revert`` takes it back). Raises only for a failure
    of the layer as a whole (the caller undoes it); one op's failure is recorded in its outcome."""
    started = time.perf_counter()
    if gate == "off":
        return Layer(gate, "nothing (the gate is off)", strict=strict)
    import flashinfer

    scan, scanned = _scan(Path(flashinfer.__file__).parent, gate)
    layer = Layer(gate, scanned, strict=strict)
    try:
        registrar = _Registrar(layer)
        by_getter: Dict[tuple, list] = {}
        for declaration in scan.declarations:
            outcome = Outcome(declaration.key, declaration.name_source, _group(declaration))
            layer.outcomes.append(outcome)
            outcome.reason = _reason_before_building(declaration, gate, outcome.group)
            if outcome.reason is not None:
                continue
            try:
                module = _module(declaration.module)
                if declaration.getter is not None:
                    by_getter.setdefault((declaration.module, declaration.getter), []).append((declaration, outcome))
                    continue
                _install_module_level(layer, registrar, declaration, module, outcome)
            except NotExpressible as fact:
                outcome.reason = str(fact)
            except Exception as error:  # registration itself went wrong: listed, STRICT raises
                outcome.reason, outcome.failed = f"{type(error).__name__}: {error}", True
        for (module_name, getter), members in by_getter.items():
            try:
                _install_getter(layer, registrar, members, sys.modules[module_name],
                                scan.namespaces[(module_name, getter)])
            except Exception as error:  # the getter's polyfill went wrong: its ops are not reachable
                for _, outcome in members:
                    if outcome.op is not None or outcome.reason is None:
                        outcome.op, outcome.failed = None, True
                        outcome.reason = f"{getter}'s polyfill: {type(error).__name__}: {error}"
        if any(outcome.op for outcome in layer.outcomes):
            _queue_helpers(layer)
            _when_dynamo_is_imported(layer)
    except BaseException:
        revert(layer)
        raise
    layer.seconds = time.perf_counter() - started
    return layer


def _reason_before_building(declaration: declared.Declaration, gate: str, group: str) -> Optional[str]:
    if gate == "sglang" and group != "sglang":
        return f"off under {declared_rules.GATE_VARIABLE}=sglang (the default): set it to all"
    rule = declared_rules.excluded(declaration.module, declaration.getter, declaration.name)
    if rule is not None:
        return rule
    if _already_an_op(declaration.name):
        return f"flashinfer::{declaration.name} is already a registered op in this process (FlashInfer's own)"
    if declaration.scope and declaration.getter is None:
        return f"declared inside {'.'.join(declaration.scope)}, which no module-level getter returns"
    if declaration.name is None and declaration.getter is None:
        return f"op name computed at run time ({declaration.name_source})"
    if declaration.mutates is None:
        return "mutates_args is not a literal"
    return None


def revert(layer: Optional[Layer]) -> None:
    """Take the polyfills back and destroy the fragment, newest first (a polyfill still waiting for
    torch._dynamo is dropped: its import hook finds the layer reverted)."""
    if layer is None:
        return
    layer.pending.clear()
    if layer.polyfills != "none":
        layer.polyfills = "reverted"
    while layer.undo:
        layer.undo.pop()()


def describe(layer: Optional[Layer]) -> Optional[dict]:
    """The layer's part of ``status()`` (JSON-serialisable), or None when the shim is not applied."""
    if layer is None:
        return None
    registered = {o.key: o.op for o in layer.outcomes if o.op}
    fakes = {o.key: o.fake for o in layer.outcomes if o.op and o.fake != "FlashInfer's"}
    not_registered = {o.key: o.reason for o in layer.outcomes if not o.op}
    return {
        "gate": layer.gate, "scanned": layer.scanned, "registered": registered, "not_registered": not_registered,
        "fakes_not_flashinfers_own": fakes,
        "failed": sorted(o.key for o in layer.outcomes if o.failed), "helpers": list(layer.helpers),
        "polyfills": {"pending": "waiting for torch._dynamo to be imported"}.get(layer.polyfills, layer.polyfills),
        "counts": {"declared": len(layer.outcomes), "registered": len(registered), "not_registered": len(not_registered),
                   "failed": sum(o.failed for o in layer.outcomes)},
        "seconds": round(layer.seconds, 3),
    }
