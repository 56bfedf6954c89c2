"""apply / revert / status: the shim's lifecycle, as one transaction.

``apply()`` is the one gate every route goes through (the import, the hook, sitecustomize, the SGLang
plugin): it alone reads the kill switch, strict mode and the other settings. It either does everything
(CUDA version, preloaded modules, rebound ``fp4_quantize`` and family, FlashInfer's own op repaired) or
leaves FlashInfer exactly as it was and says why. ``revert()`` undoes all of it. Both are idempotent and
serialised by one lock.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import os
import threading
from typing import Callable, List, Optional

import torch

from . import cuda_version, rebind, release_parts, switches, versions
from .declared import declared_layer
from .errors import ApplyError
from .fp4 import fp4_layer
from .fp4 import fp4_parts
from .fp4 import fp4_releases
from .activation import site_files
from .settings import Settings
from .sglang import sglang_releases

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree

FLASHINFER_DISTRIBUTION = "flashinfer-python"
CPP_EXT = "flashinfer.jit.cpp_ext"


@dataclasses.dataclass
class _Applied:
    settings: Settings
    #: How the shim came to be applied: "import", "pth", "install-hook", "sitecustomize", "plugin", "apply()".
    route: str
    #: The installed release, and for an untested one which of its parts match the newest tested release.
    release: release_parts.Judgement
    cuda: cuda_version.CudaLayer
    fp4: fp4_layer.Fp4Layer
    declared: declared_layer.DeclaredLayer

    @property
    def layers(self) -> list:
        """In the order they were applied (revert() undoes them newest first)."""
        return [self.cuda, self.fp4, self.declared]

    @property
    def bindings(self) -> List[rebind.Binding]:
        return self.cuda.swaps.bindings + self.fp4.swaps.bindings


_lock = threading.RLock()
_applied: Optional[_Applied] = None
_last_problem: Optional[str] = "not applied in this process (apply() has not run)"
#: Whether ``export_for_children()`` set FP4_DYNAMO_SHIM=1 itself (revert() then withdraws it), and the
#: value it replaced (one the hook does not understand), which revert() puts back.
_exported = False
_replaced_value: Optional[str] = None


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


def apply(route: str = "apply()") -> bool:
    """Patch FlashInfer; True when the shim is active afterwards. Safe to call any number of times.

    Returns False, with ``status()["problem"]`` saying why and one warning, when the shim cannot apply
    (``FP4_DYNAMO_SHIM_DISABLE=1`` is not a warning: it was asked for). With ``FP4_DYNAMO_SHIM_STRICT=1``
    every refusal and every variable value it does not understand raises :class:`ApplyError` instead, unless
    the kill switch is on too: switched off, nothing raises (values it does not understand are still warned).
    ``route`` is recorded in ``status()["activated_by"]``.
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
            _apply(judgement, settings, route)
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


def _apply(judgement: release_parts.Judgement, settings: Settings, route: str) -> None:
    """The layers in order: the CUDA version FlashInfer's JIT sees (building the FP4 kernels asks it), the FP4
    layer, FlashInfer's declared ops. A part of an untested release that differs from the newest tested one
    stays FlashInfer's. A failure undoes the layers already applied, newest first."""
    global _applied, _last_problem
    target, left = fp4_releases.target_for(judgement.row), judgement.left
    try:
        module = None if fp4_parts.JIT_GETTER in left else importlib.import_module(target.module)
        cpp_ext = None if cuda_version.PART.name in left else importlib.import_module(CPP_EXT)
    except Exception as error:  # e.g. 0.6.8-0.6.18 query the GPU at import and fail with a CPU-only torch
        raise ApplyError(f"importing flashinfer failed ({type(error).__name__}: {error})") from error
    _warn_left_parts(judgement)
    applied = []
    try:
        if cpp_ext is None:
            applied.append(cuda_version.left_alone(left[cuda_version.PART.name]))
        else:
            applied.append(cuda_version.apply(settings.cuda_version, cpp_ext))
        if applied[0].resolved.problem:
            if settings.strict:
                raise ApplyError(applied[0].resolved.problem)
            switches.warn(applied[0].resolved.problem)
        applied.append(fp4_layer.apply(judgement.row, target, module, settings.fallback, left))
        applied.append(declared_layer.DeclaredLayer(settings.flashinfer_ops, judgement.version, settings.strict))
    except BaseException:
        for layer in reversed(applied):
            layer.undo()
        raise
    _applied = _Applied(settings, route, judgement, *applied)
    _last_problem = None
    resolved = _applied.cuda.resolved
    logger.info(
        "fp4_dynamo_shim applied to flashinfer %s (by %s): %d names rebound, CUDA %s (%s), %d GPU(s)",
        judgement.version, route, len(_applied.bindings), resolved.version, resolved.source, len(_applied.fp4.devices),
    )
    if not judgement.tested:
        logger.info("fp4_dynamo_shim: %s", judgement.line())


def export_for_children() -> None:
    """Set FP4_DYNAMO_SHIM=1 for child processes (what ``import fp4_dynamo_shim`` promises), unless the user
    set the variable to a value the hook understands, and warn once if no start-up route would act on it in
    a child. A value it does not understand would leave every child without the shim: it is replaced, and
    the warning names it."""
    global _exported, _replaced_value
    value = os.environ.get(switches.HOOK, "")
    if not value.strip() or switches.read(switches.HOOK)[1]:
        os.environ[switches.HOOK] = "1"
        _exported, _replaced_value = True, value if value.strip() else None
        if _replaced_value is not None:
            switches.warn(f"import fp4_dynamo_shim set {switches.HOOK}=1 for child processes in place of "
                       f"{value!r}, which the import hook does not understand (children would run without "
                       "the shim); revert() puts it back")
    routes = site_files.installed_routes()
    if not (routes["pth"] or routes["hook_pth"] or routes["sitecustomize"]):
        plugin = sglang_releases.plugin_entry_point()
        switches.warn(
            f"import fp4_dynamo_shim exports {switches.HOOK}=1 for child processes, but no import hook is installed "
            f"where they start (no {site_files.PACKAGE_PTH} or {site_files.HOOK_PTH} in {', '.join(map(str, site_files.site_dirs())) or 'any site directory'}"
            + (f"; {routes['sitecustomize_shadowed_by']} shadows the sitecustomize block" if routes["sitecustomize_shadowed_by"] else "")
            + "), so spawned workers such as SGLang's schedulers will not apply the shim"
            + (" (the SGLang plugin still does, on SGLang >= 0.5.11)" if plugin else "")
            + ". Install the package with pip (a wheel or -e), or run `fp4-dynamo-shim install-hook`; "
            "`python -m fp4_dynamo_shim.verify` checks a spawned worker."
        )


def user_environment() -> dict:
    """``os.environ`` as the user set it: without what ``export_for_children()`` changed here."""
    environment = dict(os.environ)
    if _exported and environment.get(switches.HOOK) == "1":
        if _replaced_value is None:
            del environment[switches.HOOK]
        else:
            environment[switches.HOOK] = _replaced_value
    return environment


def revert() -> bool:
    """Put every rebound name back to FlashInfer's original object and restore FlashInfer's own op
    registrations; withdraw the FP4_DYNAMO_SHIM=1 that ``import fp4_dynamo_shim`` set for children.
    Returns True if the shim was applied (and is now reverted), False if there was nothing to revert.

    The custom op stays registered and configured: graphs already compiled or captured with it keep
    working. Functions compiled through a rebound global recompile on their next call (Dynamo guards
    on that global) and then trace FlashInfer's original again.
    """
    global _applied, _last_problem, _exported, _replaced_value
    with _lock:
        if _exported and os.environ.get(switches.HOOK) == "1":
            if _replaced_value is None:
                del os.environ[switches.HOOK]
            else:
                os.environ[switches.HOOK] = _replaced_value
        _exported, _replaced_value = False, None
        if _applied is None:
            return False
        for layer in reversed(_applied.layers):
            layer.undo()
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
        return _applied.cuda.swaps.rebind(modules) + _applied.fp4.swaps.rebind(modules)


def original_function(name: str = "fp4_quantize") -> Optional[Callable]:
    """FlashInfer's own function behind a replacement (``fp4_quantize`` by default)."""
    with _lock:
        if _applied is None:
            return None
        return _applied.fp4.original(name)


#: The keys of ``status()``, always all present (None where not applicable).
STATUS_KEYS = (
    "applied", "problem", "disabled", "activated_by", "flashinfer", "supported_flashinfer", "torch", "torch_cuda",
    "sglang", "fallback", "strict", "warnings", "routes", "children", "target", "op", "family", "rebound",
    "cuda_version", "devices", "skipped", "flashinfer_ops",
)


def _release_unapplied() -> dict:
    """status()'s "flashinfer" where the shim is not applied: its parts are compared only when it applies."""
    version = flashinfer_version()
    tested = None if version is None else fp4_releases.target_for(version) is not None
    return {"version": version, "tested": tested, "matched_row": version if tested else None, "parts": None}


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
            "flashinfer": applied.release.describe() if applied is not None else _release_unapplied(),
            "supported_flashinfer": versions.SUPPORTED_RANGE,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "sglang": sglang_releases.describe(),
            "fallback": settings.fallback,
            "strict": settings.strict,
            "warnings": list(settings.problems),
            "routes": {**site_files.installed_routes(), "plugin": sglang_releases.plugin_entry_point()},
            "children": {switches.HOOK: os.environ.get(switches.HOOK), "exported_by_import": _exported},
            "target": None, "op": None, "family": None, "rebound": None, "cuda_version": None, "devices": None,
            "skipped": None, "flashinfer_ops": None,
        }
        if applied is None:
            return report
        # Each layer describes its part; "skipped" collects theirs, the FP4 layer's first, and "warnings" adds theirs.
        parts = [applied.fp4.describe(), applied.cuda.describe(), applied.declared.describe()]
        report.update({key: value for part in parts for key, value in part.items() if key not in ("skipped", "warnings")})
        report["skipped"] = [line for part in parts for line in part["skipped"]]
        report["warnings"] += [line for part in parts for line in part.get("warnings", [])]
        report["rebound"] = [str(binding) for binding in applied.bindings]
        return report
