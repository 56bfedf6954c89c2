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
  the op (``rules.PLAN_TENSOR``) and becomes a list again in the kernel. Dynamo guards its shape only: a
  plan of another length recompiles (once, then automatic dynamic shapes take it), new values do not.

Eager ``run()`` is FlashInfer's function; it reads ``_plan_info`` through the property (one Python call), and
``plan()`` pays one small tensor. ``revert()`` removes the properties and the polyfills (instances keep their
values); a plan stored under an earlier application is not used: compiling asks for ``plan()`` again.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import sys
from typing import Dict, Optional

import torch

from . import polyfill
from . import rules
from .. import switches
from ..errors import NotExpressibleError

PLAN = "_plan_info"
_applications = itertools.count()


@dataclasses.dataclass
class _Application:
    """What the properties of one application read: its layer, the instance attribute its plan tensor goes by
    (new per application: a tensor left by an earlier one is never read), and the modules already polyfilled
    (kept alive, so that an id is never reused)."""

    layer: object
    carried: str = dataclasses.field(default_factory=lambda: f"_fp4_dynamo_shim_plan_{next(_applications)}")
    twins: Dict[int, object] = dataclasses.field(default_factory=dict)


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


def _carried(value):
    """The plan as the op takes it: a CPU int64 tensor of an int list; anything else (None, a backend's plan of
    tensors) as it is, for FlashInfer's code to read under tracing as it does eagerly."""
    try:
        values = list(value)
    except TypeError:
        return value
    return torch.tensor(values, dtype=torch.int64) if all(type(v) is int for v in values) else value


def _twin(application: _Application, module) -> None:
    """Polyfill the run functions of a module a getter cached, with its getter's polyfill for those arguments."""
    if module is None or id(module) in application.twins:
        return
    application.twins[id(module)] = module
    layer = application.layer
    for getter, (traced_getter, keys) in layer.getters.items():
        arguments = _cached_arguments(getter, module)
        if arguments is None:
            continue
        try:
            traced = traced_getter(*arguments)
            for key in keys:
                layer.undo.push(polyfill.install(getattr(module, key), getattr(traced, key)))
        except Exception as error:  # the run stays FlashInfer's: compiling it fails as without the shim
            switches.warn(f"fp4_dynamo_shim: {getter.__name__}{arguments}'s run functions stay untraceable "
                          f"({type(error).__name__}: {error})")
        return


def _get(wrapper):
    """Eagerly: FlashInfer's value, where FlashInfer's plan() left it."""
    try:
        return wrapper.__dict__[PLAN]
    except KeyError:
        raise AttributeError(f"{type(wrapper).__name__!r} object has no attribute {PLAN!r}") from None


def _put(wrapper, value) -> None:
    """FlashInfer's plan() storing its plan: FlashInfer's value, the tensor beside it, the module polyfilled."""
    wrapper.__dict__[PLAN] = value
    wrapper.__dict__[_current.carried] = _carried(value)
    _twin(_current, wrapper.__dict__.get("_cached_module"))


def _traced(wrapper):
    """Under tracing (the polyfill of ``_get``): the tensor ``_put`` left."""
    if not hasattr(wrapper, _current.carried):
        raise NotExpressibleError(
            f"fp4_dynamo_shim: this {type(wrapper).__name__} was planned before the shim applied: call plan() "
            "again before compiling run()")
    return getattr(wrapper, _current.carried)


def _wrapped_classes(layer) -> list:
    """(module, class) of each wrapper whose plan() calls a getter whose ops are registered."""
    registered = {getter.__name__ for getter in layer.getters}
    return [rules.ATTENTION_WRAPPED[entry_point] for entry_point in rules.ATTENTION_WRAPPED
            if rules.attention_wrapped_getters(layer.flashinfer, entry_point) & registered]


def _forget() -> None:
    global _current
    _current = None


def install(layer, served) -> None:
    """Give each wrapper class whose getters' ops are registered the ``_plan_info`` property; its polyfill goes
    through ``layer.pending`` with the outcomes it ``served``."""
    global _current
    classes = [(module_name, class_name, getattr(sys.modules[module_name], class_name))
               for module_name, class_name in _wrapped_classes(layer)]
    if not classes:
        return
    _current = _Application(layer)
    layer.undo.push(_forget)
    for module_name, class_name, cls in classes:
        setattr(cls, PLAN, property(_get, _put))
        layer.undo.push(lambda cls=cls: delattr(cls, PLAN))
        layer.helpers.append(f"{module_name}.{class_name}.{PLAN}")
    layer.pending.append((_get, _traced, served, "the attention wrappers' plan"))
