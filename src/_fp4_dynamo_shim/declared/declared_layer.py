"""FlashInfer's own declarations, turned on while the shim is applied: every ``register_custom_op`` FlashInfer
wrote becomes a real op, and Dynamo traces that op wherever it meets FlashInfer's function.

* Found by reading FlashInfer's sources (``declared``), not at decoration time.
* Registered under the shim's namespace ``fp4_dynamo_shim_flashinfer::<name>`` (FlashInfer's own name after
  ``flashinfer::``), with ``Library.define`` + ``impl`` + ``register_fake``: never ``flashinfer::<name>``,
  which a FlashInfer build that turns its decorators on (a fork's ``FLASHINFER_USE_TORCH_CUSTOM_OPS=1``, PR
  #2734) would define itself, in a getter that runs after the shim applied, and fail on. A name FlashInfer
  did register is left alone.
* Eager calls are FlashInfer's own: no function is rebound. Dynamo is told, through ``polyfill``, to trace the
  generated caller instead of FlashInfer's function (or instead of the getter whose namespace holds it), so
  FlashInfer's eager cost is unchanged and no dispatcher is on the eager path. The batch attention wrappers'
  classes get a ``_plan_info`` property (``wrappers``), for the plan their run reads, and ``SegmentGEMMWrapper.run``
  a thin method through which Dynamo reaches its polyfill (``segment_gemm``): the two additions.
* All of it happens when ``torch._dynamo`` is imported (at once if it is): nothing traces before, and a
  program that never compiles pays nothing at start-up (importing Dynamo itself costs about a second).
* The gate ``FP4_DYNAMO_SHIM_FLASHINFER_OPS`` picks which declarations: what SGLang's traced paths call raw
  (``rules.SGLANG``), plus under ``proven`` what a GPU run proved for the installed release
  (``proven.PROVEN``), or all of them; everything not registered is listed with the reason. :func:`revert`
  removes the polyfills and destroys the fragment.
"""

from __future__ import annotations

import logging
import operator
import sys
import time
import types
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import scan
from . import build
from . import built_modules
from . import rules
from . import inductor
from . import polyfill
from . import proven
from . import segment_gemm
from . import wrappers
from .build import NAMESPACE, Layer, Outcome
from .codegen import NotExpressible
from .. import switches
from ..errors import ApplyError
from ..layers import Context

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree
DEFAULT = switches.VARIABLES[switches.FLASHINFER_OPS].default

__all__ = ["NAMESPACE", "Layer", "Outcome", "apply", "start", "revert", "describe"]
#: (major, minor) per visible GPU, read at apply: what FlashInfer's get_compute_capability returns under
#: tracing (Dynamo cannot trace the device query itself).
CAPABILITIES: Dict[int, tuple] = {}
#: FlashInfer's cached device queries on the paths to declared ops: (module, function, what it takes).
#: Dynamo traces a lookup in CAPABILITIES instead (the function itself is untouched).
HELPERS = (
    ("flashinfer.utils", "get_compute_capability", "device"),
    ("flashinfer.sampling", "_blackwell_softmax_capability", "index"),  # 0.7.x: torch.cuda.get_device_capability
    ("flashinfer.utils", "_get_cache_alibi_slopes_buf", "cached buffer"),
)


def _group(declaration: scan.Declaration, record: Optional[dict]) -> str:
    """Which gate value turns the declaration on first: "sglang", "proven" or "all"."""
    if (declaration.module, declaration.name) in rules.SGLANG:
        return "sglang"
    return "proven" if record and declaration.key in record["declarations"] else "all"


def _scan(package: Path, gate: str, record: Optional[dict], release: Optional[str]) -> tuple:
    if gate == "all":
        scanned = built_modules.extended(scan.scan(package), package, release, lambda key: True)
        return scanned, "every file of the package"
    # A narrower gate reads only the files of the declarations it can turn on: a full scan costs 0.1-0.8 s.
    modules = {module for module, _ in rules.SGLANG}
    if gate == "proven" and record:
        modules |= {entry["module"] for entry in record["declarations"].values()}
    paths = [package.parent.joinpath(*m.split(".")) for m in sorted(modules)]
    files = [p / "__init__.py" if p.is_dir() else p.with_suffix(".py") for p in paths]
    scanned = scan.scan_files(package, [f for f in files if f.exists()])
    proven_keys = record["declarations"] if gate == "proven" and record else {}
    scanned = built_modules.extended(scanned, package, release, lambda key: key in proven_keys)
    return scanned, f"the {gate} gate's modules: " + ", ".join(sorted(modules))


def _capability_of_device(device):
    if device.type != "cuda":
        raise ValueError("device must be a cuda device")
    return CAPABILITIES[device.index if device.index is not None else torch.cuda.current_device()]


def _capability_of_index(device_index):
    return CAPABILITIES[device_index]


def _cached_alibi_slopes(num_qo_heads, device):
    """FlashInfer's per-process buffer of ALiBi slopes, fetched eagerly while tracing (Dynamo calls a function
    marked ``assume_constant_result`` and keeps what it returns): traced, the cache lookup would be a guard on the
    cache's keys, and the first run's fill a recompile. Compiled code holds FlashInfer's buffer itself."""
    return sys.modules["flashinfer.utils"]._get_cache_alibi_slopes_buf(num_qo_heads, device)


#: FlashInfer's lookup as a function object of its own (its code, its globals): Dynamo traces it as it traced
#: FlashInfer's before the polyfill, where the buffer cannot be made while tracing.
_traced_lookup: Optional[types.FunctionType] = None


def _alibi_slopes(num_qo_heads, device):
    if device.type == "cuda" and not torch.cuda.is_available():
        # Tracing for a GPU this process has none of (fake tensors, verify's trace checks): no buffer can be
        # made now, so FlashInfer's lookup is traced, a guard on the cache as without the shim.
        return _traced_lookup(num_qo_heads, device)
    # Under dynamic shapes q's head count is a symbol; operator.index makes Dynamo specialise it (a model's head
    # count does not change), which int() does not.
    return _cached_alibi_slopes(operator.index(num_qo_heads), device)


_TRACED_HELPERS = {"device": _capability_of_device, "index": _capability_of_index, "cached buffer": _alibi_slopes}


#: FlashInfer's log-once methods, called on paths to declared ops (the trtllm MoE's "the single torch.Tensor return
#: type is deprecated"). Dynamo refuses every ``logging.Logger`` method in traced code but those in its
#: ``ignore_logging_functions``, which it drops: compiled code skips the line, an eager call still logs it.
LOG_ONCE = ("flashinfer.jit.core", "FlashInferJITLogger", ("debug_once", "info_once", "warning_once"))


def _queue_helpers(layer: Layer) -> None:
    served = [outcome for outcome in layer.outcomes if outcome.op]
    global _traced_lookup
    torch._dynamo.assume_constant_result(_cached_alibi_slopes)
    for module_name, name, takes in HELPERS:
        function = getattr(sys.modules.get(module_name), name, None)
        if function is None:
            continue
        original = getattr(function, "__wrapped__", function)
        if takes == "cached buffer":
            _traced_lookup = types.FunctionType(original.__code__, original.__globals__, name, original.__defaults__,
                                                original.__closure__)
        layer.pending.append((original, _TRACED_HELPERS[takes], served, f"{module_name}.{name}"))
        layer.helpers.append(f"{module_name}.{name}")
    module_name, class_name, methods = LOG_ONCE
    ignored = torch._dynamo.config.ignore_logging_functions
    for name in methods:
        method = getattr(getattr(sys.modules.get(module_name), class_name, None), name, None)
        if method is not None and method not in ignored:
            ignored.add(method)
            layer.undo.push(lambda method=method: ignored.discard(method))
            layer.helpers.append(f"{module_name}.{class_name}.{name} (skipped in compiled code)")


def _install_polyfills(layer: Layer) -> List[str]:
    """Hand the traceables to Dynamo. A polyfill that cannot be installed leaves the ops it serves
    unreachable: they are listed as failed."""
    if torch.cuda.is_available():
        CAPABILITIES.update({i: torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    failures = []
    for original, traceable, outcomes, what in layer.pending:
        try:
            layer.undo.push(polyfill.install(original, traceable))
        except Exception as error:  # e.g. another library already substitutes this function
            failures.append(what)
            for outcome in outcomes:
                outcome.fail(error, f"polyfill for {what}: ")
    layer.pending.clear()
    return failures


def _register(layer: Layer) -> None:
    """Read the declarations, register what the gate selects and install the polyfills; the work of
    :func:`start`, done once torch._dynamo is imported. One op's failure is recorded in its outcome (one
    warning; STRICT raises :class:`ApplyError`); anything else raises after undoing the layer."""
    if layer.state != "waiting for torch._dynamo to be imported":
        return  # reverted before Dynamo came
    started = time.perf_counter()
    import flashinfer

    layer.proven = proven.PROVEN.get(layer.flashinfer)
    package = Path(flashinfer.__file__).parent
    try:
        found, layer.scanned = _scan(package, layer.gate, layer.proven, layer.flashinfer)
        registrar = build.Registrar(layer, found.declarations)
        by_getter: Dict[tuple, list] = {}
        for declaration in found.declarations:
            outcome = Outcome(declaration.key, declaration.module, declaration.name_source,
                              _group(declaration, layer.proven))
            layer.outcomes.append(outcome)
            refused = _reason_before_building(declaration, layer, outcome.group)
            if refused is not None:
                outcome.refuse(*refused)
                continue
            try:
                module = build.module_named(declaration.module)
                if declaration.getter is not None:
                    by_getter.setdefault((declaration.module, declaration.getter), []).append((declaration, outcome))
                    continue
                build.module_level(layer, registrar, declaration, module, outcome)
            except NotExpressible as fact:
                outcome.refuse(str(fact))
            except Exception as error:  # registration itself went wrong: listed, STRICT raises
                outcome.fail(error)
        for (module_name, getter), members in by_getter.items():
            try:
                build.getter(layer, registrar, members, sys.modules[module_name],
                                      found.namespaces[(module_name, getter)])
            except Exception as error:  # the getter's polyfill went wrong: its ops are not reachable
                for _, outcome in members:
                    if outcome.kind in (None, rules.REGISTERED):
                        outcome.fail(error, f"{getter}'s polyfill: ")
        segment_gemm.install(layer, registrar)
        if any(outcome.op for outcome in layer.outcomes) or layer.getters:
            layer.undo.push(inductor.install_lowering(layer.compiler))
            registrar.cache_key.add(inductor.WHAT)
        if any(outcome.op for outcome in layer.outcomes):
            _queue_helpers(layer)
            wrappers.install(layer, [outcome for outcome in layer.outcomes if outcome.op])
        # A wrapper with no row is said not covered under the gate that would have covered it, as a gated-off
        # declaration is listed only where the gate reads its module.
        layer.helpers += built_modules.not_covered(package, layer.flashinfer, {g.__name__ for g in layer.getters},
                                                   rowless=layer.gate == "all")
        _install_polyfills(layer)
    except BaseException:
        revert(layer)
        raise
    layer.state, layer.seconds = "registered", time.perf_counter() - started
    failed = [outcome for outcome in layer.outcomes if outcome.failed]
    if failed:
        message = (f"fp4_dynamo_shim: {len(failed)} of FlashInfer's declared ops failed to register and stay "
                   "untraceable (status()['flashinfer_ops']['failed']): "
                   + "; ".join(f"{o.key}: {o.reason}" for o in failed))
        switches.warn(message)
        if layer.strict:
            revert(layer)  # nothing of a refused layer stays: no op, no polyfill
            raise ApplyError(message)


def _on_dynamo_imported(layer: Layer) -> None:
    """Run from the import of torch._dynamo: a failure there is reported, not raised, unless STRICT (the
    user's program is importing torch._dynamo, typically in torch.compile)."""
    try:
        _register(layer)
    except Exception as error:
        layer.state = f"failed: {type(error).__name__}: {error}"
        switches.warn(f"fp4_dynamo_shim: FlashInfer's declared ops were not registered: {layer.state}")
        if layer.strict:
            raise


def start(gate: str, flashinfer_version: str, strict: bool = False) -> Layer:
    """The layer ``gate`` selects for the installed release ``flashinfer_version`` (``revert`` takes it back).
    Its work waits for torch._dynamo to be imported, at once when it is: a program that never compiles pays
    nothing at start-up (reading the declarations costs 20-50 ms for the default gate; ``all`` imports every
    declaring module, seconds on 0.7.4)."""
    layer = Layer(gate, "nothing (the gate is off)" if gate == "off" else "not yet", strict=strict,
                  flashinfer=flashinfer_version)
    if gate == "off":
        layer.state = "off"
        return layer
    layer.state = "waiting for torch._dynamo to be imported"
    if "torch._dynamo" in sys.modules:
        _register(layer)
    else:
        import wrapt

        wrapt.register_post_import_hook(lambda module: _on_dynamo_imported(layer), "torch._dynamo")
    return layer


#: The gates, narrowest first: each turns on its own group and every narrower one.
GATES = ("off", "sglang", "proven", "all")


def _reason_before_building(declaration: scan.Declaration, layer: Layer, group: str) -> Optional[tuple]:
    """(reason, kind) for a declaration that is not built at all, or None."""
    if GATES.index(group) > GATES.index(layer.gate):
        return _gated_off(layer), rules.GATED_OFF
    rule = rules.excluded(declaration.module, declaration.getter, declaration.name)
    if rule is not None:
        return rule[1], rule[0]
    if build.already_an_op(declaration.name):
        return (f"flashinfer::{declaration.name} is already a registered op in this process (FlashInfer's own)",
                rules.FLASHINFER_OWN)
    if declaration.scope and declaration.getter is None:
        return f"declared inside {'.'.join(declaration.scope)}, which no module-level getter returns", \
            rules.NOT_EXPRESSIBLE
    if declaration.name is None and declaration.getter is None:
        return f"op name computed at run time ({declaration.name_source})", rules.NOT_EXPRESSIBLE
    if declaration.mutates is None:
        return "mutates_args is not a literal", rules.NOT_EXPRESSIBLE
    return None


def _gated_off(layer: Layer) -> str:
    """Why the gate leaves a declaration off; under ``proven``, what the GPU record says of it."""
    words = [f"off under {switches.FLASHINFER_OPS}={layer.gate}" + (" (the default)" if layer.gate == DEFAULT else "")]
    if layer.gate == "proven" and layer.proven:
        words.append("not proven on a GPU for this release (the shim's GPU record)")
    elif layer.gate == "proven":
        words.append(f"the shim has no GPU record for FlashInfer {layer.flashinfer}")
    return ": ".join(words + ["set it to all"])


def revert(layer: Optional[Layer]) -> None:
    """Take the polyfills back and destroy the fragment, newest first (a layer still waiting for
    torch._dynamo stays unregistered: its import hook finds it reverted)."""
    if layer is None:
        return
    layer.pending.clear()
    layer.state = "reverted"
    layer.undo.undo_all()


def _counts(outcomes) -> dict:
    return {"declared": len(outcomes), **{kind: sum(o.kind == kind for o in outcomes) for kind in rules.KINDS}}


def describe(layer: Optional[Layer]) -> Optional[dict]:
    """The layer's part of ``status()`` (JSON-serialisable), or None when the shim is not applied."""
    if layer is None:
        return None
    registered = {o.key: o.op for o in layer.outcomes if o.op}
    fakes = {o.key: o.fake for o in layer.outcomes if o.op and o.fake != "FlashInfer's"}
    not_registered = {o.key: {"kind": o.kind, "reason": o.reason} for o in layer.outcomes if not o.op}
    return {
        "gate": layer.gate, "scanned": layer.scanned, "registered": registered, "not_registered": not_registered,
        "fakes_not_flashinfers_own": fakes,
        "failed": sorted(o.key for o in layer.outcomes if o.failed), "helpers": list(layer.helpers),
        "compiler": list(layer.compiler),
        # Registered under "all" only: neither SGLang's calls nor in the release's GPU record.
        "unproven": sorted(o.key for o in layer.outcomes if o.op and o.group == "all"),
        "state": layer.state,
        "counts": _counts(layer.outcomes),
        "by_module": {module: _counts([o for o in layer.outcomes if o.module == module])
                      for module in sorted({o.module for o in layer.outcomes})},
        "seconds": round(layer.seconds, 3),
        "proven": None if layer.proven is None else {
            "flashinfer": layer.flashinfer, **{field: layer.proven[field] for field in proven.MEASURED},
            "declarations": len(layer.proven["declarations"]),
            "functions": sorted({f for entry in layer.proven["declarations"].values() for f in entry["functions"]})},
    }


class DeclaredLayer:
    """The layer as the lifecycle holds it: undo and describe, the shape every layer has (``layers``)."""

    def __init__(self, layer: Layer):
        self.layer = layer

    def undo(self) -> None:
        revert(self.layer)

    def describe(self) -> dict:
        return {"flashinfer_ops": describe(self.layer), "skipped": []}


def apply(context: Context) -> DeclaredLayer:
    """The layer's step: the declarations ``FP4_DYNAMO_SHIM_FLASHINFER_OPS`` selects for the installed release."""
    return DeclaredLayer(start(context.settings.flashinfer_ops, context.version, context.settings.strict))
