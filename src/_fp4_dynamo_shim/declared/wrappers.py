"""FlashInfer's stateful attention wrappers under tracing: ``run()`` reaches the JIT module ``plan()`` built and
cached on the wrapper (``self._cached_module``), with the plan's int list (``self._plan_info``).

``plan()`` stays eager and FlashInfer's; what it leaves reaches the op as arguments:

* **The module.** ``plan()`` builds it through a cached getter, outside the compiled region, so the getter's
  polyfill never sees the call. When ``plan()`` stores its plan, the module it cached is looked up in that getter's
  cache (the getter's arguments are its key) and each of its run functions gets a polyfill: the caller the getter's
  polyfill returns for those arguments, which calls the op built from the attention table (``build.getter``). One
  op per run function for every module; its getter arguments are constants of the graph, as for single decode.
  Where the getter returns the built module itself (MLA's, ``built_modules``), its run is a C++ function object, which
  takes no polyfill: the wrapper class gets a ``_cached_module`` property instead, carrying that namespace.
* **The plan.** Python values read from the wrapper are guards on their values: every new batch would recompile.
  The wrapper classes get a property for ``_plan_info`` and each of :data:`LENGTHS`: its setter keeps FlashInfer's value
  where FlashInfer's code reads it, plus the value as compiled code takes it; under tracing the getter returns
  the latter. The plan's int list becomes a CPU int64 tensor, which reaches the op (``rules.PLAN_TENSOR``) and
  becomes a list again in the kernel: Dynamo guards its shape only, so a plan of another length recompiles (once,
  then automatic dynamic shapes take it) and new values do not. The batch's sizes become ``DynamicInt``: symbols,
  not constants, under every ``dynamic=`` setting.

Eager ``run()`` is FlashInfer's function; it reads these attributes through the properties: one Python call each,
which reads a copy the setter keeps under an attribute name written in its code (a specialised attribute load);
a wrapper planned before apply, or while reverted, gets that copy at its first read.
What compiled code takes is made only once Dynamo needs it: until Dynamo first traces a wrapper's ``run()`` after
apply, ``plan()`` stores FlashInfer's values and remembers the wrapper (all an eager program pays); that trace
makes the carried values of every wrapper planned so far, and from then on each ``plan()`` makes them as it stores
(a small tensor per new plan, a ``DynamicInt`` per size). ``revert()`` removes the properties and the polyfills
(instances keep their values); a plan stored under an earlier application is not used: compiling asks for
``plan()`` again.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import sys
import weakref
from typing import Dict, Optional

import torch

from . import codegen
from . import polyfill
from . import rules
from .. import oplib
from .. import switches
from ..errors import NotExpressibleError

#: What plan() leaves that run() reads and compiled code must not take as a constant, and how it crosses: the
#: plan's int list as a tensor; the batch's sizes (handed to the kernel, or compared with q's rows) as symbols.
PLAN = "_plan_info"
#: Where plan() caches the module: carried itself by a wrapper whose getter returns the built module, whose run (a
#: C++ function object) Dynamo cannot substitute.
MODULE = "_cached_module"
LENGTHS = ("_batch_size", "_max_q_len", "_max_kv_len", "_qo_indptr_last")
try:
    from torch.fx.experimental.sym_node import DynamicInt
except ImportError:  # torch before 2.10 cannot mark an int dynamic: the sizes stay guards
    DynamicInt = None
_applications = itertools.count()


@dataclasses.dataclass
class _Application:
    """What the properties of one application read: its layer, the prefix of the instance attributes its carried
    values go by (new per application: a value left by an earlier one is never read), and the modules already
    polyfilled (kept alive, so that an id is never reused)."""

    layer: object
    carried: str = dataclasses.field(default_factory=lambda: f"_fp4_dynamo_shim_{next(_applications)}")
    twins: Dict[int, object] = dataclasses.field(default_factory=dict)
    #: id of a built module -> (the module, kept alive; what compiled code reaches in its place).
    built: Dict[int, tuple] = dataclasses.field(default_factory=dict)
    #: Whether Dynamo has traced a wrapper's run since: until then plan() only stores and remembers the wrapper.
    compiling: bool = False
    #: The wrappers planned before that, to carry at the first compile.
    planned: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)
    #: Each property's (name, setter): the catch-up stores a remembered wrapper's values again through them.
    setters: list = dataclasses.field(default_factory=list)


#: The application in force (one layer is applied at a time); None once reverted.
_current: Optional[_Application] = None


def _cached_arguments(getter, module) -> Optional[tuple]:
    """The arguments ``getter`` (a ``functools.cache``) was called with to return ``module``, or None. The cache
    has no public listing: its dict is what the cache object's garbage-collector traversal reaches (CPython's
    ``functools`` keys it by the arguments tuple; the attention getters all take several arguments)."""
    for referent in gc.get_referents(getter):
        if type(referent) is dict:
            for key, value in referent.items():
                if value is module:
                    return key
    return None


#: One CPU int64 tensor per distinct plan, shared: nothing writes it (the kernel reads it back as a list), and a
#: hit costs plan() a tenth of making one. Cleared when full (plans repeat: a serving loop has few distinct ones).
_plan_tensors: Dict[tuple, torch.Tensor] = {}
#: One DynamicInt per size value, shared (an int is immutable, and Dynamo makes one symbol per attribute it reads,
#: not per object), for the same reason: four per plan.
_dynamic_ints: Dict[int, object] = {}
_CACHED = 4096


def _plan_tensor(value):
    """The plan as the op takes it: a CPU int64 tensor of an int list; anything else (None, a backend's plan of
    tensors) as it is, for FlashInfer's code to read under tracing as it does eagerly. Only a list whose sum is an
    int is looked up (a float or a tensor in it makes the sum one: a float plan never meets an equal int plan's
    tensor), and only one of ints alone is stored. FlashInfer 0.6's plan is a tvm-ffi ``Array``: one slice reads it
    (a list), where iterating it makes foreign calls per element: 13.5 us for a plan of 15 against 4.8 us for the
    whole of this function, on a 2-core CPU machine."""
    try:
        values = tuple(value[:])
        if type(sum(values)) is not int:
            return value
    except TypeError:
        return value
    tensor = _plan_tensors.get(values)
    if tensor is None:
        if not set(map(type, values)) <= {int}:
            return value
        if len(_plan_tensors) >= _CACHED:
            _plan_tensors.clear()
        tensor = _plan_tensors[values] = torch.tensor(values, dtype=torch.int64)
    return tensor


def _symbol(value):
    """A size as compiled code takes it: an int as a DynamicInt (a symbol, not a constant); anything else as it is."""
    if type(value) is not int:
        return value
    symbol = _dynamic_ints.get(value)
    if symbol is None:
        if len(_dynamic_ints) >= _CACHED:
            _dynamic_ints.clear()
        symbol = _dynamic_ints[value] = DynamicInt(value)
    return symbol


def _twin(application: _Application, module) -> None:
    """Polyfill the run functions of a module a getter cached, with its getter's polyfill for those arguments."""
    if module is None or id(module) in application.twins:
        return
    application.twins[id(module)] = module
    found = _cached_by(application.layer, module)
    if found is None:
        return
    getter, traced_getter, keys, arguments = found
    try:
        traced = traced_getter(*arguments)
        for key in keys:
            application.layer.undo.push(polyfill.install(getattr(module, key), getattr(traced, key)))
    except Exception as error:  # the run stays FlashInfer's: compiling it fails as without the shim
        _untraceable(getter, arguments, error)


def _cached_by(layer, module) -> Optional[tuple]:
    """(getter, its traced getter, the run functions' keys, the arguments it cached ``module`` under) for the
    registered getter that cached ``module``, or None."""
    for getter, (traced_getter, keys) in layer.getters.items():
        arguments = _cached_arguments(getter, module)
        if arguments is not None:
            return getter, traced_getter, keys, arguments
    return None


def _untraceable(getter, arguments, error) -> None:
    switches.warn(f"fp4_dynamo_shim: {getter.__name__}{arguments}'s run functions stay untraceable "
                  f"({type(error).__name__}: {error})")


def _refusing(message: str):
    def refuse(*args, **kwargs):
        raise NotExpressibleError(message)

    return refuse


def _traced_module(module):
    """A built module as compiled code reaches it: the traced getter's namespace for the arguments its getter cached
    it under, whose functions call the ops; made once per module. Where the traced getter refuses those arguments,
    a namespace whose functions raise its reason when compiled; where no registered getter cached the module (the
    MLA wrapper's cutlass backend), FlashInfer's module, as without the shim."""
    known = _current.built.get(id(module))
    if known is not None:
        return known[1]
    traced, found = module, _cached_by(_current.layer, module)
    if found is not None:
        getter, traced_getter, keys, arguments = found
        try:
            traced = traced_getter(*arguments)
        except NotExpressibleError as refusal:
            traced = codegen.Namespace({key: _refusing(str(refusal)) for key in keys})
        except Exception as error:  # the run stays FlashInfer's: compiling it fails as without the shim
            _untraceable(getter, arguments, error)
    _current.built[id(module)] = (module, traced)
    return traced


def _stored(wrapper, name: str, eager: str):
    """FlashInfer's value of ``name`` where no setter of this application stored it (before apply, while
    reverted): the instance's own attribute, copied to ``eager`` for the reads after this one (each read that
    raised and caught its way here cost about 1.4 us), or the error reading it would raise without the shim."""
    state = wrapper.__dict__
    try:
        value = state[eager] = state[name]
    except KeyError:
        raise AttributeError(f"{type(wrapper).__name__!r} object has no attribute {name!r}") from None
    return value


#: The eager getter of a carried attribute: it reads the copy the setter keeps under ``eager``, an instance
#: attribute named in the code itself, which CPython loads by a specialised instruction; with
#: ``wrapper.__dict__[name]`` a property read cost 76 ns against 32 (a plain attribute: 10) on CPython 3.12, and
#: FlashInfer's paged prefill run reads six per call.
_EAGER_GETTER = """
def get(wrapper):
    try:
        return wrapper.{eager}
    except AttributeError:
        return _stored(wrapper, {name!r}, {eager!r})
"""


def _eager_getter(name: str, eager: str):
    return oplib.run_source(_EAGER_GETTER.format(eager=eager, name=name), f"<fp4_dynamo_shim: {name}>",
                            {"_stored": _stored})["get"]


def _property(name: str, carry, after_store=None, refuse_stale: bool = False):
    """The property for wrapper attribute ``name``, and its traced getter: eagerly FlashInfer's value where
    FlashInfer's plan() left it; under tracing ``carry(value)``, stored beside it by the setter. A value stored
    before this application is read as it is (a guard, as without the shim), or with ``refuse_stale`` refused:
    a plan stored then has a module without polyfills."""
    application = _current
    carried = application.carried + name  # made once: plan() stores through this setter on every call
    eager = f"{application.carried}_flashinfer{name}"
    get = _eager_getter(name, eager)

    def put(wrapper, value) -> None:
        state = wrapper.__dict__
        state[name] = state[eager] = value
        if not application.compiling:  # remembered once per wrapper, by the plan's store (every plan() makes one)
            # The marker in the instance, not a lookup in the WeakSet: plan() stores on every call and this is cheaper.
            if name == PLAN and application.carried not in state:
                state[application.carried] = True
                application.planned.add(wrapper)
            return
        state[carried] = carry(value)
        if after_store is not None:
            after_store(wrapper)

    application.setters.append((name, put))

    def traced(wrapper):
        _carry_planned_now()  # run for real while tracing (assume_constant_result), not traced
        if not hasattr(wrapper, carried):
            if not refuse_stale:
                return get(wrapper)
            raise NotExpressibleError(
                f"fp4_dynamo_shim: this {type(wrapper).__name__} was planned before the shim applied: call plan() "
                "again before compiling run()")
        return getattr(wrapper, carried)

    return property(get, put), get, traced


def _carry_planned_now() -> bool:
    """Dynamo traces a wrapper's run: carry what plan() stored in every wrapper planned until now, and from now on
    carry as plan() stores. Marked ``assume_constant_result`` by :func:`install`, so Dynamo calls it for real at
    trace time (before it reads the carried values) and puts nothing of it in the graph, and no guard on it."""
    application = _current
    if application is None or application.compiling:
        return True
    application.compiling = True
    for wrapper in list(application.planned):
        state = wrapper.__dict__
        for name, put in application.setters:
            ours = getattr(type(wrapper), name, None)  # the property of this wrapper's class, not another's
            if name in state and isinstance(ours, property) and ours.fset is put:
                put(wrapper, state[name])
    application.planned.clear()
    return True


def _planned(wrapper) -> None:
    """FlashInfer's plan() storing its plan: the module it cached gets its polyfills."""
    _twin(_current, wrapper.__dict__.get("_cached_module"))


def _wrapped_classes(layer) -> list:
    """(entry point, module, class) of each wrapper whose plan() calls a getter whose ops are registered."""
    registered = {getter.__name__ for getter in layer.getters}
    return [(entry_point, *rules.ATTENTION_WRAPPED[entry_point]) for entry_point in rules.ATTENTION_WRAPPED
            if rules.attention_wrapped_getters(layer.flashinfer, entry_point) & registered]


def _carried(built_module: bool) -> list:
    """(attribute, how compiled code takes it, what its store does next, whether a value stored before is refused)
    for a wrapper class. One whose getter returns its built module carries that module's traced twin itself; the
    others polyfill the cached module's run functions when the plan is stored, and carry the batch's sizes."""
    if built_module:
        return [(PLAN, _plan_tensor, None, True), (MODULE, _traced_module, None, True)]
    return [(PLAN, _plan_tensor, _planned, True)] + [(name, _symbol, None, False) for name in LENGTHS if DynamicInt]


def _forget() -> None:
    global _current
    _current = None


def install(layer, served) -> None:
    """Give each wrapper class whose getters' ops are registered a property per carried attribute (one the class
    defines itself is left alone); their polyfills go through ``layer.pending`` with the outcomes they ``served``."""
    global _current
    built = rules.attention_built_modules(layer.flashinfer)
    classes = [(entry_point in built, module_name, class_name, getattr(sys.modules[module_name], class_name))
               for entry_point, module_name, class_name in _wrapped_classes(layer)]
    if not classes:
        return
    torch._dynamo.assume_constant_result(_carry_planned_now)
    _current = _Application(layer)
    layer.undo.push(_forget)
    for built_module in sorted({c[0] for c in classes}):
        for name, carry, after_store, refuse_stale in _carried(built_module):
            prop, get, traced = _property(name, carry, after_store, refuse_stale)
            for _, module_name, class_name, cls in (c for c in classes if c[0] == built_module):
                if name not in vars(cls):
                    setattr(cls, name, prop)
                    layer.undo.push(lambda cls=cls, name=name: delattr(cls, name))
                    layer.helpers.append(f"{module_name}.{class_name}.{name}")
            layer.pending.append((get, traced, served, f"the attention wrappers' {name}"))
    if DynamicInt is None:
        layer.helpers.append(f"the attention wrappers' {', '.join(LENGTHS)} stay guards: torch {torch.__version__} "
                             "has no DynamicInt (a new batch size recompiles)")
