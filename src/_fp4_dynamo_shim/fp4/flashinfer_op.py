"""FlashInfer's own ``torch.ops.flashinfer.fp4_quantize`` (0.6.12+), repaired while the shim is applied.

FlashInfer documents that op as its route for torch.compile, but it has three faults (read off the wheels,
measured on CPU and on the H200):

* from 0.6.12 to 0.7.0.post1 its body calls ``fp4_quantize`` positionally, so its 7th argument
  ``enable_pdl`` lands in ``is_global_scale_inversed``: ``enable_pdl=True`` inverts the global scale
  silently, ``None`` is a TypeError in the JIT entry (0.7.1 forwards by keyword);
* its fake returns contiguous outputs for column-major input, where the function returns transposed
  views, so ``torch.compile(fullgraph=True)`` fails on such input (every release up to 0.7.4);
* ``torch.library.custom_op``'s Python autograd layer costs more per call than the whole shim path.

The repair registers, in a ``Library`` fragment of FlashInfer's namespace, kernels for CPU and CUDA that
run the shim's path with the op's own schema, the shim's exact fake, and a fallthrough on the autograd
keys: custom_op's Python autograd layer is skipped (FP4 quantization has no gradient, and the layer costs
more than the shim's path), and the dispatcher goes on to the next key, so fake tensors reach the fake
and real ones the kernel. An autograd kernel that ran the shim's path itself would hand fake tensors
straight to FlashInfer's JIT entry under torch.compile ("Cannot access data pointer of Tensor"); with
the CPU reference, which computes on fake tensors, that went unseen. Destroying the fragment puts
FlashInfer's registrations back exactly as they were; ``revert()`` does that.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from .. import oplib
from . import quantize_op

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree

NAME = "fp4_quantize"
QUALIFIED = f"flashinfer::{NAME}"
#: Kernels registered over FlashInfer's (the shim's path).
KERNEL_KEYS = ("CPU", "CUDA")
#: Keys where custom_op put its Python autograd layer, registered as fallthrough: never a kernel of their own.
FALLTHROUGH_KEYS = ("AutogradCPU", "AutogradCUDA")
PARAMETERS = ("input", "global_scale", "sf_vec_size", "sf_use_ue8m0", "is_sf_swizzled_layout", "is_sf_8x4_layout",
              "enable_pdl", "nvfp4_4over6_code")
DEFAULTS = {"global_scale": None, "sf_vec_size": 16, "sf_use_ue8m0": False, "is_sf_swizzled_layout": True,
            "is_sf_8x4_layout": False, "enable_pdl": None, "nvfp4_4over6_code": -1}


def flashinfer_has_op() -> bool:
    try:
        torch.ops.flashinfer.fp4_quantize.default
    except (AttributeError, RuntimeError):
        return False
    return True


def _arguments(args, kwargs) -> dict:
    values = dict(DEFAULTS)
    values.update(zip(PARAMETERS, args))
    values.update(kwargs)
    return values


def _make_kernel(module, recipe) -> Callable:
    """The op's kernel: FlashInfer's function semantics for the op's own arguments, through the shim."""
    from_code = getattr(module, "nvfp4_4over6_from_code", None)

    def kernel(*args, **kwargs):
        a = _arguments(args, kwargs)
        code = 0
        if recipe is not None:  # 0.7.1+: the op carries a 4over6 code; -1 reads the environment, as FlashInfer does
            setting = from_code(a["nvfp4_4over6_code"]) if from_code else recipe.unset
            code = recipe.code(setting, a["input"], a["sf_vec_size"], a["sf_use_ue8m0"], compiling=False)
        return quantize_op.quantize(a["input"], a["global_scale"], a["sf_vec_size"], a["sf_use_ue8m0"],
                            a["is_sf_swizzled_layout"], a["is_sf_8x4_layout"], False, a["enable_pdl"], code,
                            quantize_op.launch_for(a["input"]))

    return kernel


def _fake(*args, **kwargs):
    a = _arguments(args, kwargs)
    return quantize_op.quantize(a["input"], a["global_scale"], a["sf_vec_size"], a["sf_use_ue8m0"],
                        a["is_sf_swizzled_layout"], a["is_sf_8x4_layout"], False, a["enable_pdl"], 0, launch=None)


def repair(target, module, recipe) -> Optional[Callable]:
    """Repair FlashInfer's op where the release has one (the targets table says which); returns the
    function that restores FlashInfer's registrations, or None when there is nothing to repair."""
    if target.flashinfer_op is None or not flashinfer_has_op():
        return None
    library = oplib.library("flashinfer")
    try:
        kernel = _make_kernel(module, recipe)
        kernels = {**{key: kernel for key in KERNEL_KEYS},
                   **{key: torch.library.fallthrough_kernel for key in FALLTHROUGH_KEYS}}
        oplib.implement(library, NAME, kernels, _fake, override=True)
    except BaseException:
        library._destroy()
        raise
    logger.info("fp4_dynamo_shim: torch.ops.%s repaired (%s body, contiguous fake)", QUALIFIED, target.flashinfer_op)
    return library._destroy


def describe(target) -> Optional[str]:
    """What the shim does with FlashInfer's op in this release, for status()."""
    if target.flashinfer_op is None or not flashinfer_has_op():
        return None
    fault = ("its body passes enable_pdl as is_global_scale_inversed; " if target.flashinfer_op == "positional"
             else "")
    return f"repaired while applied ({fault}its fake gives contiguous strides for column-major input)"
