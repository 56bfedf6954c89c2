"""Building one declared op: FlashInfer's objects for a declaration, its fake, the op in the fragment, and the
traceable that Dynamo will use in place of FlashInfer's function or getter (``declared_ops`` installs it).

Whatever is a fact of the release (no fake, a type no schema holds, a getter whose namespace cannot be
rebuilt) raises :class:`NotExpressible` and becomes the declaration's listed reason; anything else raised here
is a failure to register, listed as such (STRICT raises).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import sys
import typing
from pathlib import Path
from typing import Callable, List, Optional

import torch

from .. import oplib
from ..layers import UndoStack
from . import scan
from . import codegen
from . import rules
from . import inductor
from .codegen import NotExpressible

NAMESPACE = "fp4_dynamo_shim_flashinfer"


@dataclasses.dataclass
class Outcome:
    key: str  # scan.Declaration.key
    module: str  # the declaring module
    declared: str  # FlashInfer's name, as written
    group: str  # the gate group: "sglang" or "all"
    op: Optional[str] = None  # "fp4_dynamo_shim_flashinfer::rmsnorm" when registered
    reason: Optional[str] = None  # why it is not
    kind: Optional[str] = None  # one of rules.KINDS, once decided
    #: Which fake the op has: "FlashInfer's", "FlashInfer's, by keyword (...)", "none needed (returns None)".
    fake: Optional[str] = None

    @property
    def failed(self) -> bool:
        """The reason is an error while registering (STRICT raises), not a fact of the release."""
        return self.kind == rules.FAILED

    def refuse(self, reason: str, kind: str = rules.NOT_EXPRESSIBLE) -> None:
        self.op, self.reason, self.kind = None, reason, kind

    def fail(self, error: BaseException, what: str = "") -> None:
        self.refuse(f"{what}{type(error).__name__}: {error}", rules.FAILED)

    def register(self, op_name: str) -> None:
        self.op, self.reason, self.kind = f"{NAMESPACE}::{op_name}", None, rules.REGISTERED


@dataclasses.dataclass
class Layer:
    gate: str
    scanned: str
    strict: bool = False
    outcomes: List[Outcome] = dataclasses.field(default_factory=list)
    undo: UndoStack = dataclasses.field(default_factory=UndoStack)
    helpers: List[str] = dataclasses.field(default_factory=list)
    #: What the layer changed in torch's compiler while registered (``inductor``).
    compiler: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    #: (FlashInfer's function, the traceable, the outcomes it serves, what it is), before they go to Dynamo.
    pending: List[tuple] = dataclasses.field(default_factory=list)
    #: "waiting for torch._dynamo to be imported", "registered", "off", "reverted" or "failed: ...".
    state: str = "off"
    #: The installed release's GPU record (``proven.PROVEN``), read when the layer registers; None without one.
    proven: Optional[dict] = None
    #: The installed release as the lifecycle resolved it (the distribution's metadata), which picks the record.
    flashinfer: Optional[str] = None
    #: FlashInfer's cached getter -> (its polyfill, the namespace keys whose entries call an op).
    getters: dict = dataclasses.field(default_factory=dict)


def module_named(name: str):
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except Exception as error:  # any import failure is a fact of this environment, listed
        raise NotExpressible(f"{name} does not import here ({type(error).__name__}: {error})") from None


def already_an_op(name: Optional[str]) -> bool:
    if name is None:
        return False
    try:
        getattr(torch.ops.flashinfer, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def signature(function) -> inspect.Signature:
    try:
        return inspect.signature(function, eval_str=True)
    except Exception as error:  # an annotation that does not evaluate, a builtin
        raise NotExpressible(f"signature: {type(error).__name__}: {error}") from None


def _compiled(source: str, module, what: str):
    """A def compiled from FlashInfer's text in its module's globals (the module itself is not touched)."""
    local: dict = {}
    try:
        oplib.run_source(source, getattr(module, "__file__", "<flashinfer>"), module.__dict__, local)
    except Exception as error:  # e.g. a default that names one of the getter's locals
        raise NotExpressible(f"{what} does not compile outside its getter ({type(error).__name__}: {error})") from None
    return next(iter(local.values()))


def _free_names(source: str, module) -> List[str]:
    tree = ast.parse(source).body[0]
    bound = {a.arg for a in ast.walk(tree.args) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(loaded - bound - set(module.__dict__) - set(dir(builtins)))


def _returns_none(function) -> bool:
    return signature(function).return_annotation in (None, type(None))


def _fake(declaration: scan.Declaration, module, function):
    """(FlashInfer's fake or None, the keywords to call it with or None, how) for one declaration.

    FlashInfer's fakes never ran (its decorators are no-ops), and some drifted from their functions: a fake
    whose parameters are a subset of the function's is called by keyword with those; one that names
    parameters the function lacks is dropped where the function returns None (it needs no fake), replaced by
    the shim's where ``rules.DERIVED_FAKES`` has one, and the declaration is not registered otherwise.
    """
    if declaration.fake is None:
        if _returns_none(function):
            return None, None, "none needed (returns None)"
        derived = rules.DERIVED_FAKES.get((declaration.module, declaration.name))
        if derived is not None:
            return derived, list(signature(function).parameters), "derived by the shim (its DERIVED_FAKES rules)"
        raise NotExpressible("returns a value and FlashInfer wrote no fake for it")
    replaced = rules.REPLACED_FAKES.get((declaration.module, declaration.name))
    if replaced is not None and replaced.still_wrong(declaration.fake.source):
        return replaced.fake, list(signature(function).parameters), f"the shim's ({replaced.fault})"
    if not declaration.scope:
        fake = module.__dict__[declaration.fake.function]
    else:
        free = _free_names(declaration.fake.source, module)
        if free:
            raise NotExpressible(f"FlashInfer's fake reads its getter's locals ({', '.join(free)})")
        fake = _compiled(declaration.fake.source, module, f"fake {declaration.fake.function}")
    own, theirs = list(signature(function).parameters), list(signature(fake).parameters)
    if theirs == own:
        return fake, None, "FlashInfer's"
    if set(theirs) <= set(own):
        lacks = ", ".join(n for n in own if n not in theirs)
        return fake, theirs, f"FlashInfer's, by keyword ({f'it lacks {lacks}' if lacks else 'in another order'})"
    stale = ", ".join(n for n in theirs if n not in own)
    if _returns_none(function):
        return None, None, f"none needed (returns None; FlashInfer's fake names parameters it lacks: {stale})"
    derived = rules.DERIVED_FAKES.get((declaration.module, declaration.name))
    if derived is not None:
        return derived, own, f"derived by the shim (FlashInfer's names parameters the function lacks: {stale})"
    raise NotExpressible(f"FlashInfer's fake names parameters the function lacks ({stale})")


def _base_name(declaration: scan.Declaration) -> str:
    return declaration.name if declaration.name is not None else declaration.function.lstrip("_")


def _stub(declaration: scan.Declaration, module):
    returns = f" -> {declaration.returns}" if declaration.returns else ""
    return _compiled(f"def {declaration.function}({declaration.parameters}){returns}: pass", module, declaration.function)


class Registrar:
    """Defines ops in one fragment and keeps the bindings the generated code needs."""

    def __init__(self, layer: Layer, declarations=()):
        self.library = oplib.library(NAMESPACE)
        layer.undo.push(self.library._destroy)
        self.cache_key = inductor.CacheKey()
        layer.undo.push(self.cache_key.undo)
        layer.compiler.append(inductor.CacheKey.WHAT)
        self.names: set = set()
        self.count = 0
        # A name two declarations share (trtllm-gen decode's and batch prefill's ``paged_run``, both computed at run
        # time) is qualified by each one's getter, so that neither takes it by coming first.
        bases = [_base_name(d) for d in declarations]
        self.shared = {base for base in bases if bases.count(base) > 1}

    def name_for(self, declaration: scan.Declaration) -> str:
        base = _base_name(declaration)
        if base in self.shared and declaration.getter is not None:
            base = f"{declaration.getter.strip('_').removeprefix('get_').removesuffix('_module')}_{base}"
        return self.unique(base)

    def unique(self, base: str) -> str:
        """``base``, or ``base_2``, ... where an op of this fragment already has it."""
        name, suffix = base, 2
        while name in self.names:
            name, suffix = f"{base}_{suffix}", suffix + 1
        return name

    def register(self, op: codegen.Op, kernel: Callable, fake: Callable):
        """Define the op; its name is taken from here on (a declaration refused on the way takes none)."""
        return self.define(op.name, op.schema, kernel, fake)

    def define(self, name: str, schema: str, kernel: Callable, fake: Callable):
        """Define ``name`` with ``schema`` ("(arguments) -> returns"), one kernel for every device, and its fake."""
        self.names.add(name)
        self.cache_key.add(name + schema)
        return oplib.define(self.library, name + schema, {device: kernel for device in oplib.DEVICES}, fake)


def _untyped_takes_tvm_tensors(declaration: scan.Declaration, module, own: inspect.Signature) -> None:
    """Refuses, saying why, a function whose parameters typed Any receive tvm-ffi tensors: 0.7.4's MiniMax SM120
    varlen attention callers hand it ``tvm_ffi.from_dlpack`` views of a cached workspace, which no schema holds."""
    untyped = [name for name, parameter in own.parameters.items() if parameter.annotation is typing.Any]
    try:
        text = Path(module.__file__).read_text(encoding="utf-8") if untyped else ""
    except (OSError, TypeError):  # a module without its file: nothing read, the schema's reason stands
        text = ""
    if "tvm_ffi.from_dlpack(" in text:
        raise NotExpressible(f"{declaration.function}'s parameters typed Any ({', '.join(untyped[:3])}, ...) take what "
                             "its caller passes, tvm-ffi tensors (tvm_ffi.from_dlpack of a cached workspace), which "
                             "no op schema holds")


def _build(registrar, declaration, module, getter=None, key=None, getter_signature=None, written=(), carried=()):
    """(op object, Op, its index, which fake) for one declaration; raises NotExpressible for a fact of the
    release, anything else for a failure. ``getter_signature``, ``written`` and ``carried``: what the attention
    table says the getter takes, the function writes and which int lists the op carries as a tensor, where
    FlashInfer's text does not say it."""
    index = registrar.count = registrar.count + 1
    if declaration.mutates == () and not declaration.return_values:
        # A kernel call that returns nothing writes through its arguments: here undeclared (0.5.3's FP4 GEMMs hand
        # `out` to their module), so a functionalized graph would drop the call or keep a copy the kernel never saw.
        raise NotExpressible(f"{declaration.function} returns nothing and declares nothing written (mutates_args "
                             "empty): what it writes through its arguments is undeclared, and as an op "
                             "torch.compile would drop the call as dead code")
    if getter is None:
        function = module.__dict__.get(declaration.function)
        inner = inspect.unwrap(function) if callable(function) else None
        if getattr(getattr(inner, "__code__", None), "co_name", None) != declaration.function:
            raise NotExpressible(f"{declaration.module}.{declaration.function} is not that function at import time")
        own, getter_signature, bindings = signature(function), None, {f"_target_{index}": function}
    else:
        function = _stub(declaration, module)
        own = signature(function)
        getter_signature = getter_signature or signature(getattr(getter, "__wrapped__", getter))
        bindings = {f"_getter_{index}": getter}
    _untyped_takes_tvm_tensors(declaration, module, own)
    bare = [value for value in declaration.return_values if value in own.parameters]
    if bare and (declaration.returns or "").startswith("List["):  # 0.6.1-0.6.3's mxint4 MoE: `return output`
        raise NotExpressible(f"returns its argument {bare[0]} as it is where it declares {declaration.returns}")
    mutates = tuple(declaration.mutates) + tuple(name for name in written if name not in declaration.mutates)
    op = codegen.plan(registrar.name_for(declaration), declaration.function, own, mutates, getter_signature,
                               carried)
    fake, fake_keywords, how = _fake(declaration, module, function)
    target = codegen.target_expression(index, getter_signature, key)
    kernel, fake_function = codegen.kernel_and_fake(op, index, bindings, target, fake, module.__file__,
                                                             fake_keywords)
    return registrar.register(op, kernel, fake_function), op, index, how


def _plan_tensor(value):
    """A carried int list as the op takes it: the wrappers' plan leaves a tensor; a list becomes one (constants);
    None (a plan its kernel does not read) stays None."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.tensor(list(value), dtype=torch.int64)


def _caller_namespace() -> dict:
    return {"_Tensor": torch.Tensor, "_NotExpressible": codegen.NotExpressibleError,
            "_Namespace": codegen.Namespace, "_plan_tensor": _plan_tensor}


def module_level(layer, registrar, declaration, module, outcome):
    op_object, op, index, outcome.fake = _build(registrar, declaration, module)
    namespace = {**_caller_namespace(), f"_op_{index}": op_object}
    oplib.run_source(codegen.caller_source(op, index, namespace), f"<{NAMESPACE} {declaration.key}>",
                     namespace)
    layer.undo.push(lambda: namespace.update({f"_op_{index}": None}))  # compiled frames re-check this global
    layer.pending.append((module.__dict__[declaration.function], namespace[f"_caller_{index}"], [outcome],
                          declaration.key))
    outcome.register(op.name)


def _cached_getter(module, facts: scan.Namespace):
    """What the ops call to reach the namespace: the getter, or where it is not cached itself (0.7.4 builds the
    trtllm MoE namespace from a JIT spec, ``_build_trtllm_moe_namespace(module)``) the one cached function that
    returns it, so that a kernel call reuses the built module as FlashInfer's own calls do."""
    found = module.__dict__.get(facts.getter)
    if found is not None and not hasattr(found, "__wrapped__") and len(facts.built_by) == 1:
        return module.__dict__.get(facts.built_by[0], found)
    return found


def getter(layer, registrar, members, module, namespace_facts: scan.Namespace):
    """One polyfill for a getter: a namespace whose declared entries call the ops, the rest refuse."""
    getter_object = _cached_getter(module, namespace_facts)
    if getter_object is None or namespace_facts.problem:
        reason = namespace_facts.problem or f"{namespace_facts.getter} is not a module attribute"
        for _, outcome in members:
            outcome.refuse(reason)
        return
    getter = getattr(getter_object, "__wrapped__", getter_object)  # Dynamo traces __wrapped__ of a functools.cache
    namespace, entries, built = _caller_namespace(), {}, 0
    tabled = {declaration.function: rules.attention_getter_signature(layer.flashinfer, module,
                                                                         namespace_facts.getter, declaration.function)
              for declaration, _ in members}
    try:
        parameters = next((known for known in tabled.values() if known is not None), None) or signature(getter)
    except NotExpressible as fact:
        for _, outcome in members:
            outcome.refuse(f"{namespace_facts.getter}: {fact}")
        return
    source = []
    for declaration, outcome in members:
        keys = namespace_facts.keys_of(declaration.function)
        if outcome.kind is not None:
            continue
        if not keys:
            outcome.refuse(f"{namespace_facts.getter}'s namespace does not hold {declaration.function}")
            continue
        try:
            op_object, op, index, outcome.fake = _build(
                registrar, declaration, module, getter_object, keys[0], tabled[declaration.function],
                rules.attention_written(layer.flashinfer, namespace_facts.getter, declaration.function),
                rules.attention_carried(layer.flashinfer, namespace_facts.getter, declaration.function))
        except NotExpressible as fact:
            outcome.refuse(str(fact))
            continue
        except Exception as error:  # registration itself went wrong: listed, STRICT raises
            outcome.fail(error)
            continue
        namespace[f"_op_{index}"] = op_object
        source.append(codegen.caller_source(op, index, namespace, indent="    "))
        entries.update({key: f"_caller_{index}" for key in keys})
        outcome.register(op.name)
        built += 1
    if not built:
        return
    # Each built member checked that the getter's parameters are all named (a variadic one refuses it).
    # The callers pack the getter's arguments under names of their own, which their parameters cannot shadow.
    source[:0] = [f"def _getter({oplib.declare(parameters, namespace, 'g')}):\n"] + [
        f"    {codegen.getter_argument(name)} = {name}\n" for name in parameters.parameters]
    for number, (key, value) in enumerate(namespace_facts.entries):
        if key not in entries:
            namespace[f"_unavailable_{number}"] = codegen.unavailable(
                f"{module.__name__}.{namespace_facts.getter}(){codegen.accessor(key)}")
            entries[key] = f"_unavailable_{number}"
        source.append(f"    _entry_{number} = {entries[key]}\n")
    source += [f"    {line}\n" for line in namespace_facts.returns]  # the getter's own returns, rebuilt
    oplib.run_source("".join(source), f"<{NAMESPACE} {module.__name__}.{namespace_facts.getter}>", namespace)
    layer.undo.push(lambda: namespace.update({name: None for name in list(namespace) if name.startswith("_op_")}))
    layer.pending.append((getter, namespace["_getter"], [o for _, o in members if o.op],
                          f"{module.__name__}.{namespace_facts.getter}"))
    # The wrappers reach a namespace their plan() built eagerly: they build its traced twin with this function.
    served = tuple(key for key, value in entries.items() if value.startswith("_caller_"))
    layer.getters[getter_object] = (namespace["_getter"], served)
