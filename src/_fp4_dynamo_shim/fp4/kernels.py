"""Build and load FlashInfer's FP4 JIT module for every visible GPU at apply time.

Doing it here moves the nvcc build, the file lock and ``os.stat`` calls out of
the traced forward. We go through FlashInfer's own
``get_fp4_quantization_module(backend)`` so the architecture choice (including
the ``120f`` family variant) and the build are exactly FlashInfer's, then take
the raw JIT module out of the closure it returns: calling that module directly
is what makes the eager path cheaper than FlashInfer's.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, List, Optional

import torch

from .. import oplib, switches
from ..errors import NoFp4KernelError
from .quantize_op import LAUNCH_SCALARS
from .fp4_releases import QUANTIZE_CLOSURE, Target

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree

#: The FP4 quantize kernel body is compiled only for ``__CUDA_ARCH__ >= 1000``.
FIRST_FP4_MAJOR = 10


@dataclasses.dataclass(frozen=True)
class LoadedDevice:
    index: int
    name: str
    capability: tuple
    #: FlashInfer's backend key for this GPU ("100", "120", "90", ...).
    backend: str
    has_fp4_kernel: bool
    enable_pdl: bool
    #: "kernel", "reference", "error" or "launch" (the empty kernel, on request): FP4_DYNAMO_SHIM_FALLBACK's
    #: word where the GPU has no FP4 kernel, "kernel" where it has one.
    mode: str
    load_seconds: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Gpu:
    """Everything ``load`` found for one GPU: what status() shows, and what the hot paths call
    (``devices.configure`` derives their lookups from these records, in one place)."""

    device: LoadedDevice
    #: ``fp4_quantize``'s launcher: the kernel with the release's arguments, the reference, or a refusal.
    launch: Callable
    #: (FlashInfer's JIT entry, default ``enable_pdl``) where the launcher calls the kernel: the replacement's
    #: direct path calls it with the same arguments, without the launcher's frame.
    direct: Optional[tuple]
    #: FlashInfer's FP4 module namespace (the family's kernels), or None where it has none for this GPU.
    namespace: object


def visible_device_count() -> int:
    """GPUs visible to torch, without initialising CUDA when there are none."""
    if not torch.backends.cuda.is_built():
        return 0
    return torch.cuda.device_count()


def jit_module_of(namespace) -> object:
    """The raw JIT module captured by ``get_fp4_quantization_module``'s closures."""
    function = getattr(namespace, QUANTIZE_CLOSURE)
    cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
    return cells["module"].cell_contents


def kernel_call(target: Target, values: Optional[dict] = None) -> str:
    """The JIT entry's call with the release's argument order (``target.kernel_args``), each scalar spelled as
    ``values`` says (its own name by default): the one template both generated callers use."""
    values = values or {}
    return (f"kernel(input, global_scale, out_val, out_sf, "
            f"{', '.join(values.get(name, name) for name in target.kernel_args)})")


def make_kernel_launcher(kernel: Callable, target: Target, enable_pdl_default: bool) -> Callable:
    """A launcher calling ``module.fp4_quantize`` with the release's argument order.

    Generated from the table row rather than reordered per call: this sits on the eager hot path.
    """
    source = (
        f"def launch(input, global_scale, out_val, out_sf, {', '.join(LAUNCH_SCALARS)}):\n"
        "    if enable_pdl is None:\n"
        "        enable_pdl = enable_pdl_default\n"
        f"    {kernel_call(target)}\n"
    )
    namespace = {"kernel": kernel, "enable_pdl_default": enable_pdl_default}
    oplib.run_source(source, f"<fp4_dynamo_shim launcher for flashinfer {target.versions}>", namespace)
    return namespace["launch"]


def make_refusal(device: LoadedDevice) -> Callable:
    def refuse(input, *args):
        raise NoFp4KernelError(
            f"fp4_quantize: {device.name} ({input.device}) is SM{device.backend}; FlashInfer's FP4 quantize kernel is "
            f"compiled only for SM{FIRST_FP4_MAJOR}0 and newer, and on this GPU it writes nothing (the outputs would "
            "be uninitialized memory). Set FP4_DYNAMO_SHIM_FALLBACK=reference to run fp4_dynamo_shim's reference "
            "quantizer on the GPU instead (slow; for testing and development)."
        )

    return refuse


def load(get_fp4_quantization_module: Callable, target: Target, fallback: str, reference_launch: Callable) -> List[Gpu]:
    """Load every visible GPU's module; returns one :class:`Gpu` record per GPU.

    The module is built for every GPU FlashInfer has an FP4 module for, SM90 included (its interleave and
    host-side helpers work there), whatever happens to fp4_quantize on it. A build or load failure
    propagates, so that apply() can leave FlashInfer untouched.
    """
    gpus = []
    for index in range(visible_device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        backend = f"{major}{minor}"
        has_fp4_kernel = major >= FIRST_FP4_MAJOR
        started = time.perf_counter()
        try:
            namespace = get_fp4_quantization_module(backend)
        except ValueError as error:  # "Invalid backend": FlashInfer has no FP4 module for this GPU at all
            logger.info("fp4_dynamo_shim: no FlashInfer FP4 module for SM%s (%s)", backend, error)
            namespace = None
        seconds = time.perf_counter() - started if namespace is not None else None
        mode = "kernel" if has_fp4_kernel else fallback
        if mode == "launch" and namespace is None:
            mode = "error"
        device = LoadedDevice(index, torch.cuda.get_device_name(index), (major, minor), backend, has_fp4_kernel,
                              enable_pdl=major >= 9, mode=mode, load_seconds=seconds)
        if seconds is not None:
            logger.info("fp4_dynamo_shim: FP4 module for %s (SM%s) built/loaded in %.2f s", device.name, backend, seconds)
        direct = None
        if mode in ("kernel", "launch"):
            kernel = getattr(jit_module_of(namespace), "fp4_quantize", None)
            if kernel is None:  # a JIT cache built from other sources, or a release that renamed the entry
                raise RuntimeError(f"FlashInfer's FP4 JIT module for SM{backend} has no fp4_quantize entry "
                                   f"(its functions: {', '.join(n for n in dir(jit_module_of(namespace)) if not n.startswith('_'))})")
            launch, direct = make_kernel_launcher(kernel, target, device.enable_pdl), (kernel, device.enable_pdl)
            if mode == "launch":
                switches.warn(
                    f"fp4_dynamo_shim: FP4_DYNAMO_SHIM_FALLBACK=launch: launching FlashInfer's FP4 kernel on SM{backend}, "
                    "where it writes nothing; outputs are uninitialized. Use this for benchmarks only."
                )
        elif mode == "reference":
            launch = reference_launch
        else:
            launch = make_refusal(device)
        gpus.append(Gpu(device, launch, direct, namespace))
    return gpus
