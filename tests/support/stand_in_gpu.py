"""The stand-in SM100: FlashInfer's FP4 path and the shim's, on CPU tensors, as on an SM100 GPU.

What it replaces, because there is no GPU here: the built JIT module (a recorder of its ``fp4_quantize``
calls in tests, a no-op in benchmarks; neither computes values: tests that need them use the reference), and
the device queries both sides make, answered as an SM100 machine answers them (one visible GPU, compute
capability 10.0, PDL supported). Everything between is the real code of FlashInfer and the shim. The same
stand-in serves the tests (the ``stand_in_sm100`` fixture) and the CPU benchmarks (``benchmarks/common.py``).
"""

from __future__ import annotations

import sys
from typing import Callable

import flashinfer
import torch

from _fp4_dynamo_shim.fp4 import devices, kernels, quantize_op


class RecordingModule:
    """Stands in for the built JIT module: records every ``fp4_quantize`` call."""

    def __init__(self):
        self.calls = []

    def fp4_quantize(self, *arguments):
        self.calls.append(arguments)


class NoKernel:
    """Stands in for the built JIT module where only the host cost matters: the launch itself costs nothing."""

    def fp4_quantize(self, *arguments):
        pass


class RecordingSpec:
    """What FlashInfer's module generator returns; building it loads the stand-in module."""

    def __init__(self, module):
        self.module = module

    def build_and_load(self):
        return self.module


def fp4_module():
    """FlashInfer's module that defines ``fp4_quantize`` (its place differs between releases)."""
    return sys.modules[flashinfer.fp4_quantize.__module__]


def install_sm100(setattr: Callable, jit_module) -> None:
    """Answer every device query as an SM100 does and build ``jit_module`` as FlashInfer's JIT module.
    ``setattr`` is ``monkeypatch.setattr`` in tests (undone after them) or the builtin in a benchmark process."""
    module = fp4_module()
    setattr(module, "gen_fp4_quantization_sm100_module", lambda: RecordingSpec(jit_module))
    setattr(module, "get_compute_capability", lambda device: (10, 0))
    setattr(module, "device_support_pdl", lambda device: True)
    setattr(kernels, "visible_device_count", lambda: 1)
    setattr(torch.cuda, "get_device_capability", lambda index=None: (10, 0))
    setattr(torch.cuda, "get_device_name", lambda index=None: "stand-in SM100")
    module.get_fp4_quantization_module.cache_clear()


def reference_entry(calls: list) -> Callable:
    """Stands in for the GPU's JIT entry on the replacement's direct path: records ``(input shape, out_val shape,
    out_sf shape)`` and fills the buffers with the reference quantizer's bytes. It takes the installed release's
    argument order, so a scalar the direct path puts in the wrong place shows up as different bytes. Limits:
    the reference's arithmetic and layouts, not the kernel's timing, PDL or stream."""
    target = quantize_op.active_target()

    def entry(input, global_scale, out_val, out_sf, *scalars):
        calls.append((tuple(input.shape), tuple(out_val.shape), tuple(out_sf.shape)))
        values = {"is_global_scale_inversed": False, "nvfp4_4over6_code": 0, **dict(zip(target.kernel_args, scalars))}
        quantize_op.launch_reference(input, global_scale, out_val, out_sf,
                                     *(values[name] for name in kernels.LAUNCH_SCALARS))

    return entry


def direct_path_on_cpu(entry: Callable) -> dict:
    """The per-device fields (for ``devices.overridden``) that send CPU tensors down the direct path to ``entry``.
    The meta cases stay away from it: CPU and meta share ``get_device() == -1``, real kernels sit at CUDA
    indices only (the GPU battery runs the meta cases on the real direct path)."""
    return {"direct_kernels": {**devices.STATE.direct_kernels, -1: (entry, True)}}
