"""apply / revert / status: the shim's lifecycle, as one transaction over its layers.

``apply()`` is the one gate every route goes through (the import, the hook, sitecustomize, the SGLang
plugin): it alone reads the kill switch, strict mode and the other settings. It applies the layers in order
(``LAYERS``, then those the route adds: the import adds the export to spawned children), each returning a
record with ``undo`` and ``describe`` (``layers``), and pushes each undo on one stack. It either applies all
of them or leaves FlashInfer exactly as it was and says why. ``revert()`` runs the stack newest first. Both
are idempotent and serialised by one lock.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import threading
from typing import Callable, List, Optional, Sequence

import torch

from . import cuda_version, rebind, release_parts, startup_files, switches, versions
from .declared import declared_layer
from .errors import ApplyError
from .fp4 import fp4_layer
from .fp4 import fp4_parts
from .fp4 import fp4_releases
from .layers import Context, UndoStack
from .settings import Settings
from .sglang import sglang_releases

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree

FLASHINFER_DISTRIBUTION = "flashinfer-python"
#: The layers every route applies, in order: the CUDA version FlashInfer's JIT sees (building the FP4 kernels
#: asks it), the FP4 layer, FlashInfer's declared ops.
LAYERS = (cuda_version, fp4_layer, declared_layer)


@dataclasses.dataclass
class _Applied:
    settings: Settings
    #: How the shim came to be applied: "import", "pth", "install-hook", "sitecustomize", "plugin", "apply()".
    route: str
    #: The installed release, and for an untested one which of its parts match the newest tested release.
    release: release_parts.Judgement
    #: Each layer's record, in the order they were applied.
    records: list
    undo: UndoStack

    def record(self, kind: type):
        return next(record for record in self.records if isinstance(record, kind))

    @property
    def swaps(self) -> List[rebind.Swaps]:
        """The rebinding layers' swaps (the CUDA version's lookups, the FP4 functions)."""
        return [record.swaps for record in self.records if isinstance(getattr(record, "swaps", None), rebind.Swaps)]

    @property
    def bindings(self) -> List[rebind.Binding]:
        return [binding for swaps in self.swaps for binding in swaps.bindings]


_lock = threading.RLock()
_applied: Optional[_Applied] = None
_last_problem: Optional[str] = "not applied in this process (apply() has not run)"


def flashinfer_version() -> Optional[str]:
    try:
        return importlib.metadata.version(FLASHINFER_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _refuse(message: str, settings: Settings, *, warn: bool = True, strict: bool = True,
            cause: BaseException = None) -> bool:
    """Record why the shim is not applied, warn once, and raise in strict mode."""
    global _last_problem
    _last_problem = message
    if strict and settings.strict:
        raise ApplyError(message) from cause
    if warn:
        switches.warn(f"fp4_dynamo_shim not applied: {message}")
    return False


def apply(route: str = "apply()", layers: Sequence = ()) -> bool:
    """Patch FlashInfer; True when the shim is active afterwards. Safe to call any number of times.

    Returns False, with ``status()["problem"]`` saying why and one warning, when the shim cannot apply
    (``FP4_DYNAMO_SHIM_DISABLE=1`` is not a warning: it was asked for). With ``FP4_DYNAMO_SHIM_STRICT=1``
    every refusal and every variable value it does not understand raises :class:`ApplyError` instead, unless
    the kill switch is on too: switched off, nothing raises (values it does not understand are still warned).
    ``route`` is recorded in ``status()["activated_by"]``; ``layers`` are applied after ``LAYERS`` and undone
    with them (the import's export to spawned children), only by the call that applies the shim.
    """
    with _lock:
        if _applied is not None:
            return True
        settings = Settings.from_environment()
        for problem in settings.problems:
            if settings.strict and not settings.disabled:  # switched off, the shim raises nothing
                _refuse(problem, settings)
            switches.warn(problem)
        if settings.disabled:
            return _refuse(f"{switches.DISABLE}=1 is set: the shim is switched off on every route", settings,
                           warn=False, strict=False)
        version = flashinfer_version()
        if version is None:
            return _refuse("flashinfer-python is not installed", settings, warn=False)
        judgement = release_parts.judge(version)
        if judgement is None:
            return _refuse(
                f"flashinfer-python {version} is not supported (supported: {versions.SUPPORTED_RANGE}, and newer "
                "releases part by part); FlashInfer was left untouched", settings,
            )
        if not judgement.tested and settings.strict:
            return _refuse(
                f"flashinfer-python {version} is newer than the tested range ({versions.SUPPORTED_RANGE}) and "
                f"{switches.STRICT}=1 accepts only tested releases; FlashInfer was left untouched", settings,
            )
        try:
            _apply(judgement, settings, route, (*LAYERS, *layers))
        except Exception as error:  # anything at all: FlashInfer has already been restored
            return _refuse(f"{type(error).__name__}: {error}; FlashInfer was left untouched", settings, cause=error)
        return True


def _warn_left_parts(judgement: release_parts.Judgement) -> None:
    """One warning per part of an untested release that differs, naming the parts that follow it."""
    for name, words in judgement.differences.items():
        if words:
            following = [part for part, cause in judgement.follows.items() if cause == name]
            switches.warn(
                f"flashinfer-python {judgement.version} is newer than the tested range: its {name} differs from "
                f"{judgement.row}'s ({'; '.join(words)}), so the shim leaves it as FlashInfer's"
                + (f", and with it {', '.join(following)}" if following else "")
                + " (python -m fp4_dynamo_shim.verify lists every part)"
            )


def _apply(judgement: release_parts.Judgement, settings: Settings, route: str, layers: Sequence) -> None:
    """The layers in order, each undo pushed on one stack. A part of an untested release that differs from the
    newest tested one stays FlashInfer's. A failure runs the stack, newest first, and raises."""
    global _applied, _last_problem
    left = judgement.left
    try:
        if fp4_parts.JIT_GETTER not in left:
            importlib.import_module(fp4_releases.target_for(judgement.row).module)
        if cuda_version.PART.name not in left:
            importlib.import_module(cuda_version.CPP_EXT)
    except Exception as error:  # e.g. 0.6.8-0.6.18 query the GPU at import and fail with a CPU-only torch
        raise ApplyError(f"importing flashinfer failed ({type(error).__name__}: {error})") from error
    _warn_left_parts(judgement)
    context = Context(settings, judgement.version, judgement.row, left)
    records, undo = [], UndoStack()
    try:
        for layer in layers:
            record = layer.apply(context)
            records.append(record)
            undo.push(record.undo)
    except BaseException:
        undo.undo_all()
        raise
    _applied = _Applied(settings, route, judgement, records, undo)
    _last_problem = None
    resolved = _applied.record(cuda_version.CudaLayer).resolved
    logger.info(
        "fp4_dynamo_shim applied to flashinfer %s (by %s): %d names rebound, CUDA %s (%s), %d GPU(s)",
        judgement.version, route, len(_applied.bindings), resolved.version, resolved.source,
        len(_applied.record(fp4_layer.Fp4Layer).devices),
    )
    if not judgement.tested:
        logger.info("fp4_dynamo_shim: %s", judgement.line())


def revert() -> bool:
    """Put every rebound name back to FlashInfer's original object, restore FlashInfer's own op registrations,
    and withdraw the FP4_DYNAMO_SHIM=1 that ``import fp4_dynamo_shim`` set for children: every layer's undo,
    newest first. Returns True if the shim was applied (and is now reverted), False if there was nothing to
    revert.

    The custom op stays registered and configured: graphs already compiled or captured with it keep
    working. Functions compiled through a rebound global recompile on their next call (Dynamo guards
    on that global) and then trace FlashInfer's original again.
    """
    global _applied, _last_problem
    with _lock:
        if _applied is None:
            return False
        _applied.undo.undo_all()
        _applied = None
        _last_problem = "revert() was called"
        return True


def rebind_modules(modules=None) -> List[rebind.Binding]:
    """Rebind originals that appeared after apply() (all of sys.modules by default); returns what changed.

    Modules imported after apply() already get the replacements from FlashInfer's patched modules; this is
    for code that kept an original some other way, and is what the SGLang plugin runs in each worker.
    """
    with _lock:
        if _applied is None:
            return []
        modules = list(modules) if modules is not None else None
        return [binding for swaps in _applied.swaps for binding in swaps.rebind(modules)]


def original_function(name: str = "fp4_quantize") -> Optional[Callable]:
    """FlashInfer's own function behind a replacement (``fp4_quantize`` by default)."""
    with _lock:
        if _applied is None:
            return None
        return _applied.record(fp4_layer.Fp4Layer).original(name)


#: The keys of ``status()``, always all present (None where not applicable).
STATUS_KEYS = (
    "applied", "problem", "disabled", "activated_by", "flashinfer", "supported_flashinfer", "torch", "torch_cuda",
    "sglang", "fallback", "strict", "warnings", "routes", "children", "target", "op", "family", "rebound",
    "cuda_version", "devices", "skipped", "flashinfer_ops",
)


def status() -> dict:
    """What is patched and where, versions, GPUs, routes, and why anything was skipped. JSON-serialisable,
    with the keys of ``STATUS_KEYS`` always present (None where not applicable)."""
    with _lock:
        applied = _applied
        settings = applied.settings if applied is not None else Settings.from_environment()
        report = {
            "applied": applied is not None,
            "problem": _last_problem,
            "disabled": settings.disabled,
            "activated_by": applied.route if applied is not None else None,
            "flashinfer": applied.release.describe() if applied is not None else release_parts.unjudged(flashinfer_version()),
            "supported_flashinfer": versions.SUPPORTED_RANGE,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "sglang": sglang_releases.describe(),
            "fallback": settings.fallback,
            "strict": settings.strict,
            "warnings": list(settings.problems),
            "routes": {**startup_files.installed_routes(), "plugin": sglang_releases.plugin_entry_point()},
            "children": startup_files.children(),
            "target": None, "op": None, "family": None, "rebound": None, "cuda_version": None, "devices": None,
            "skipped": None, "flashinfer_ops": None,
        }
        if applied is None:
            return report
        # Each layer describes its part, in the order they applied; "skipped" and "warnings" collect theirs.
        parts = [record.describe() for record in applied.records]
        report.update({key: value for part in parts for key, value in part.items() if key not in ("skipped", "warnings")})
        report["skipped"] = [line for part in parts for line in part.get("skipped", [])]
        report["warnings"] += [line for part in parts for line in part.get("warnings", [])]
        report["rebound"] = [str(binding) for binding in applied.bindings]
        return report
