"""FlashInfer's stateful attention wrappers under tracing: ``run()`` reaches the JIT module ``plan()`` built and
cached on the wrapper (``self._cached_module``), with the plan's int list (``self._plan_info``).

``plan()`` stays eager and FlashInfer's; what it leaves reaches the op as arguments:

* **The module.** ``plan()`` builds it through a cached getter, outside the compiled region, so the getter's
  polyfill never sees the call. When ``plan()`` stores its plan, the module it cached is looked up in that getter's
  cache (the getter's arguments are its key) and each of its run functions gets a polyfill: the caller the getter's
  polyfill returns for those arguments, which calls the op built from the attention table (``build.getter``). One
  op per run function for every module; its getter arguments are constants of the graph, as for single decode.
* **The plan.** A list of ints read from the wrapper would be a guard per value: every new batch would recompile.
  The wrapper classes get a ``_plan_info`` property: its setter keeps FlashInfer's value where FlashInfer's code
  reads it, plus a CPU int64 tensor of the same values; under tracing the getter returns the tensor, which reaches
  the op (``declared_rules.PLAN_TENSOR``) and becomes a list again in the kernel. Dynamo guards its shape only: a
  plan of another length recompiles (once, then automatic dynamic shapes take it), new values do not.

Eager ``run()`` is FlashInfer's function; it reads ``_plan_info`` through the property (one Python call), and
``plan()`` pays one small tensor. ``revert()`` removes the properties and the polyfills (instances keep their
values); a plan stored under an earlier application is not used: compiling asks for ``plan()`` again.
"""

from __future__ import annotations

import gc
import itertools
import sys
from typing import Dict, Optional

import torch

from . import polyfill
from . import rules as declared_rules
from .. import switches
from ..errors import NotExpressibleError

PLAN = "_plan_info"
_applications = itertools.count()


def _cached_arguments(getter, module) -> Optional[tuple]:
    """The arguments ``getter`` (a ``functools.cache``) was called with to return ``module``, or None. The cache
    has no public listing: its dict is what the cache object's garbage-collector traversal reaches (CPython's
    ``functools`` keeps the arguments tuple as the key, or the argument itself when it is one int or str)."""
    for referent in gc.get_referents(getter):
        if type(referent) is dict:
            for key, value in referent.items():
                if value is module:
                    return key if type(key) is tuple else (key,)
    return None


def _carried(value):
    """The plan as the op takes it: a CPU int64 tensor of an int list; anything else (None, a backend's plan of
    tensors) as it is, for FlashInfer's code to read under tracing as it does eagerly."""
    try:
        values = list(value)
    except TypeError:
        return value
    return torch.tensor(values, dtype=torch.int64) if all(type(v) is int for v in values) else value


def _wrapped_getters(layer) -> Dict[str, set]:
    """Entry point -> the names of the getters whose ops are registered and which its wrapper's plan() calls."""
    registered = {getattr(getter, "__name__", None) for getter in layer.getters}
    found: Dict[str, set] = {}
    for entry_point in declared_rules.ATTENTION_WRAPPED:
        for getter in declared_rules.attention_wrapped_getters(layer.flashinfer, entry_point) & registered:
            found.setdefault(entry_point, set()).add(getter)
    return found


def install(layer, served) -> None:
    """Give each wrapper class whose getters' ops are registered the ``_plan_info`` property; its polyfill goes
    through ``layer.pending`` with the outcomes it ``served``."""
    carried = f"_fp4_dynamo_shim_plan_{next(_applications)}"
    twins: Dict[int, object] = {}  # id -> FlashInfer's module, kept alive so that an id is never reused

    def twin(module) -> None:
        """Polyfill the run functions of a module a getter cached, with its getter's polyfill for those arguments."""
        if module is None or id(module) in twins or layer.state != "registered":
            return
        twins[id(module)] = module
        for getter, (traced_getter, keys) in layer.getters.items():
            arguments = _cached_arguments(getter, module)
            if arguments is None:
                continue
            try:
                traced = traced_getter(*arguments)
                for key in (k for k in keys if not k.startswith("=")):
                    layer.undo.append(polyfill.install(getattr(module, key), getattr(traced, key)))
            except Exception as error:  # the run stays FlashInfer's: compiling it fails as without the shim
                switches.warn(f"fp4_dynamo_shim: {getter.__name__}{arguments}'s run functions stay untraceable "
                              f"({type(error).__name__}: {error})")
            return

    def get(self):
        try:
            return self.__dict__[PLAN]
        except KeyError:
            raise AttributeError(PLAN) from None

    def put(self, value):
        self.__dict__[PLAN] = value
        self.__dict__[carried] = _carried(value)
        twin(self.__dict__.get("_cached_module"))

    def forget(self):
        self.__dict__.pop(PLAN, None)
        self.__dict__.pop(carried, None)

    def traced(self):
        if not hasattr(self, carried):
            raise NotExpressibleError(
                f"fp4_dynamo_shim: this {type(self).__name__} was planned before the shim applied: call plan() "
                "again before compiling run()")
        return getattr(self, carried)

    installed = False
    for entry_point in _wrapped_getters(layer):
        module_name, class_name = declared_rules.ATTENTION_WRAPPED[entry_point]
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is None or PLAN in vars(cls):  # a release without the class, or one that defines it itself
            continue
        setattr(cls, PLAN, property(get, put, forget))
        layer.undo.append(lambda cls=cls: delattr(cls, PLAN))
        layer.helpers.append(f"{module_name}.{class_name}.{PLAN}")
        installed = True
    if installed:
        layer.pending.append((get, traced, served, "the attention wrappers' plan"))
