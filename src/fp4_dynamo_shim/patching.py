"""apply / revert / status: the shim's lifecycle, as one transaction.

``apply()`` either does everything (CUDA version, preloaded modules, rebound
``fp4_quantize``) or leaves FlashInfer exactly as it was and says why.
``revert()`` puts every rebound name back to the identical original object.
Both are idempotent and serialised by one lock.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import threading
from typing import Callable, List, Optional

import torch

from . import cuda_version, family, family_ops, ops, preload, rebind, sglang_releases, targets, wrapper
from .config import Settings
from .errors import ApplyError

logger = logging.getLogger(__name__)

FLASHINFER_DISTRIBUTION = "flashinfer-python"
CPP_EXT = "flashinfer.jit.cpp_ext"


@dataclasses.dataclass
class _Applied:
    flashinfer_version: str
    target: targets.Target
    #: (original, replacement) pairs, in the order they were swapped.
    swaps: List[tuple]
    bindings: List[rebind.Binding]
    cuda: cuda_version.CudaVersion
    devices: List[preload.LoadedDevice]
    settings: Settings
    #: FP4 family function -> what the shim did with it in this release.
    family: dict


_lock = threading.RLock()
_applied: Optional[_Applied] = None
_last_problem: Optional[str] = "apply() has not run"
_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def flashinfer_version() -> Optional[str]:
    try:
        return importlib.metadata.version(FLASHINFER_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _refuse(message: str, settings: Optional[Settings], *, warn: bool = True, cause: BaseException = None) -> bool:
    """Record why the shim is not applied, warn once, and raise in strict mode."""
    global _last_problem
    _last_problem = message
    if settings is not None and settings.strict:
        raise ApplyError(message) from cause
    if warn:
        _warn_once(f"fp4_dynamo_shim not applied: {message}")
    return False


def apply() -> bool:
    """Patch FlashInfer; True when the shim is active afterwards. Safe to call any number of times."""
    with _lock:
        if _applied is not None:
            return True
        try:
            settings = Settings.from_environment()
        except ValueError as error:
            return _refuse(str(error), None)
        version = flashinfer_version()
        if version is None:
            return _refuse("flashinfer-python is not installed", settings, warn=False)
        target = targets.target_for(version)
        if target is None:
            return _refuse(
                f"flashinfer-python {version} is not supported (supported: {targets.SUPPORTED_RANGE}); "
                "FlashInfer was left untouched", settings,
            )
        try:
            _apply(version, target, settings)
        except Exception as error:  # anything at all: FlashInfer has already been restored
            return _refuse(f"{type(error).__name__}: {error}; FlashInfer was left untouched", settings, cause=error)
        return True


def _apply(version: str, target: targets.Target, settings: Settings) -> None:
    global _applied, _last_problem
    try:
        module = importlib.import_module(target.module)
        cpp_ext = importlib.import_module(CPP_EXT)
    except Exception as error:  # e.g. 0.6.8-0.6.18 query the GPU at import and fail with a CPU-only torch
        raise ApplyError(f"importing flashinfer failed ({type(error).__name__}: {error})") from error
    original = module.fp4_quantize
    if wrapper.is_shim(original):
        raise ApplyError(f"{target.module}.fp4_quantize is already a fp4_dynamo_shim replacement")
    resolved = cuda_version.resolve(settings.cuda_version)
    new_get, new_at_least = cuda_version.make_replacements(resolved, cpp_ext.get_cuda_version)
    recipe = wrapper.recipe_for(original, module)
    replacement = wrapper.build(original, module, recipe)
    family_replaced, family_report = family.build_replacements(version, module, replacement, recipe)

    swaps, bindings = [], []

    def swap(old, new) -> None:
        swaps.append((old, new))
        bindings.extend(rebind.swap(old, new))

    try:
        swap(cpp_ext.is_cuda_version_at_least, new_at_least)
        original_get = cpp_ext.get_cuda_version
        swap(original_get, new_get)
        if hasattr(original_get, "cache_clear"):
            original_get.cache_clear()
        launchers, devices, namespaces = preload.load(
            module.get_fp4_quantization_module, target, settings.fallback, ops.launch_reference
        )
        ops.configure(target, launchers)
        family_ops.configure(namespaces, mm_fp4=family_replaced.get("mm_fp4", (None,))[0])
        swap(original, replacement)
        for family_original, family_replacement in family_replaced.values():
            swap(family_original, family_replacement)
    except BaseException:
        _undo(swaps)
        raise
    _applied = _Applied(version, target, swaps, bindings, resolved, devices, settings, family_report)
    _last_problem = None
    logger.info(
        "fp4_dynamo_shim applied to flashinfer %s: %d names rebound, CUDA %s (%s), %d GPU(s)",
        version, len(bindings), resolved.version, resolved.source, len(devices),
    )


def _undo(swaps) -> None:
    for old, new in reversed(swaps):
        rebind.swap(new, old)


def revert() -> bool:
    """Put every rebound name back to FlashInfer's original object. True if something was reverted.

    The custom op stays registered and configured: graphs already compiled or captured with it keep
    working. Functions compiled through a rebound global recompile on their next call (Dynamo guards
    on that global) and then trace FlashInfer's original again.
    """
    global _applied, _last_problem
    with _lock:
        if _applied is None:
            return False
        _undo(_applied.swaps)
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
        found = []
        for old, new in _applied.swaps:
            found.extend(rebind.swap(old, new, modules))
        _applied.bindings.extend(found)
        return found


def original_function(name: str = "fp4_quantize") -> Optional[Callable]:
    """FlashInfer's own function behind a replacement (``fp4_quantize`` by default)."""
    with _lock:
        if _applied is None:
            return None
        for old, new in _applied.swaps:
            if getattr(old, "__name__", None) == name and wrapper.is_shim(new):
                return old
        return None


def status() -> dict:
    """What is patched and where, versions, GPUs, and why anything was skipped. JSON-serialisable."""
    with _lock:
        applied = _applied
        report = {
            "applied": applied is not None,
            "problem": _last_problem,
            "flashinfer": flashinfer_version(),
            "supported_flashinfer": targets.SUPPORTED_RANGE,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "sglang": sglang_releases.describe(),
        }
        if applied is None:
            return report
        target = applied.target
        report.update(
            target={
                "versions": str(target.versions),
                "module": target.module,
                "kernel_args": list(target.kernel_args),
                "swizzled_sf_padded_columns": target.swizzled_sf_padded_columns,
                "linear_sf_row_alignment": target.linear_sf_row_alignment,
                "converts_global_scale": target.converts_global_scale,
                "row_wise_global_scale": target.row_wise_global_scale,
            },
            op=f"{ops.NAMESPACE}::{ops.OP_NAME}",
            family=dict(applied.family),
            rebound=[str(binding) for binding in applied.bindings],
            cuda_version={
                "value": str(applied.cuda.version) if applied.cuda.version else None,
                "source": applied.cuda.source,
                "nvcc": str(applied.cuda.nvcc) if applied.cuda.nvcc else None,
                "nvcc_path": applied.cuda.nvcc_path,
            },
            devices=[dataclasses.asdict(device) for device in applied.devices],
            skipped=_skipped(applied),
            fallback=applied.settings.fallback,
            strict=applied.settings.strict,
        )
        return report


def _skipped(applied: _Applied) -> List[str]:
    """Things the shim deliberately does not do here, with the reason."""
    skipped = []
    if not applied.devices:
        skipped.append("JIT build/load: no GPU visible (CPU tensors use the reference quantizer)")
    for device in applied.devices:
        if device.mode == "refuse":
            skipped.append(
                f"cuda:{device.index} {device.name} SM{device.backend}: no FP4 kernel below SM100, calls raise "
                "(FP4_DYNAMO_SHIM_FALLBACK=reference runs the reference quantizer there)"
            )
        elif device.mode == "reference":
            skipped.append(f"cuda:{device.index} SM{device.backend}: FlashInfer kernel not used, reference quantizer runs")
    if applied.cuda.version is None:
        skipped.append("CUDA version: neither torch nor nvcc reports one; FlashInfer's own lookup is kept")
    return skipped
