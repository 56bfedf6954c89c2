"""The replacement ``fp4_quantize``: the installed release's exact signature, two paths behind it.

* Eager (not compiling): validate and call the preloaded kernel directly, no
  dispatcher, no module lookup, no capability query.
* Compiling: call ``torch.ops.fp4_dynamo_shim.fp4_quantize`` so Dynamo records
  one opaque node with an exact fake.

Arguments the op cannot carry (``backend="cute-dsl"``, ``batch_invariant=True``)
go to the original function in eager mode and raise :class:`NotExpressibleError`
inside a compiled region.

The signature differs between releases (new parameters, a keyword-only one, a
sentinel default), so the function is generated from ``inspect.signature`` of
the original, like ``dataclasses`` generates ``__init__``: positional and
keyword calls then bind exactly as they would on the original, at no per-call cost.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch

from . import arithmetic
from . import quantize_op
from .. import oplib
from .devices import STATE
from ..errors import NotExpressibleError
from .kernels import kernel_call
from .fp4_releases import Target

#: Parameters the core understands, in its positional order, with the value used when a release lacks one.
CORE_PARAMETERS = {
    "input": inspect.Parameter.empty,
    "global_scale": inspect.Parameter.empty,
    "sf_vec_size": inspect.Parameter.empty,
    "sf_use_ue8m0": inspect.Parameter.empty,
    "is_sf_swizzled_layout": inspect.Parameter.empty,
    "is_sf_8x4_layout": inspect.Parameter.empty,
    "is_global_scale_inversed": False,
    "enable_pdl": inspect.Parameter.empty,
    "backend": "cuda",
    "nvfp4_4over6": None,
    "batch_invariant": False,
}
#: ``backend`` values that mean FlashInfer's CUDA kernel, i.e. what the op runs.
OP_BACKENDS = ("cuda", "auto")
MARKER = "__fp4_dynamo_shim__"


class Recipe:
    """NVFP4 4over6 handling for releases that have the ``nvfp4_4over6`` parameter (0.7.1+).

    Eager calls resolve through FlashInfer's own functions (which read ``FLASHINFER_NVFP4_4OVER6*`` on
    every call, as FlashInfer does). A compiled region passes the kernel's own "read the environment"
    code (-1) when the caller left the parameter out, so the choice is made when the graph runs, by the
    kernel (or the reference, which reads the same variables), as FlashInfer's kernel would make it.
    """

    def __init__(self, module, unset):
        self.unset = unset
        self.resolve = module.resolve_nvfp4_4over6
        self.code_of = module.nvfp4_4over6_code

    def code(self, setting, input, sf_vec_size, sf_use_ue8m0, compiling: bool) -> int:
        is_mxfp4 = sf_vec_size != 16 or sf_use_ue8m0
        if setting is self.unset:
            if is_mxfp4 or input.dtype == torch.float8_e4m3fn:
                # FlashInfer: MXFP4 never reads the environment; FP8 kernels ignore an environment recipe.
                return 0
            return arithmetic.CODE_FROM_ENVIRONMENT if compiling else self.code_of(self.resolve(setting))
        if setting is None:
            return 0
        if is_mxfp4:
            raise ValueError(
                "nvfp4_4over6 applies to NVFP4 only (sf_vec_size=16, sf_use_ue8m0=False); got "
                f"sf_vec_size={sf_vec_size}, sf_use_ue8m0={sf_use_ue8m0}."
            )
        if input.dtype == torch.float8_e4m3fn:
            raise ValueError(f"NVFP4 4over6 requires fp16 or bf16 input, got {input.dtype}.")
        return self.code_of(self.resolve(setting))


def make_core(original: Callable, parameter_names, recipe: Optional[Recipe]) -> Callable:
    """The function every generated signature forwards to, with all parameters in ``CORE_PARAMETERS`` order."""
    present = tuple(name for name in CORE_PARAMETERS if name in parameter_names)
    op = quantize_op.fp4_quantize_op
    is_compiling = torch.compiler.is_compiling
    quantize, launch_for = quantize_op.quantize, quantize_op.launch_for

    def call_original(*arguments):
        values = dict(zip(CORE_PARAMETERS, arguments))
        return original(**{name: values[name] for name in present})

    def core(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
             is_global_scale_inversed, enable_pdl, backend, nvfp4_4over6, batch_invariant):
        compiling = is_compiling()
        if backend not in OP_BACKENDS or batch_invariant:
            if compiling:
                raise NotExpressibleError(
                    f"fp4_dynamo_shim: fp4_quantize(backend={backend!r}, batch_invariant={batch_invariant!r}) "
                    "cannot run inside torch.compile; only FlashInfer's CUDA kernel (backend='cuda'/'auto', "
                    "batch_invariant=False) is behind the custom op. Call it outside the compiled region."
                )
            return call_original(
                input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                is_global_scale_inversed, enable_pdl, backend, nvfp4_4over6, batch_invariant,
            )
        if not isinstance(input, torch.Tensor):
            raise quantize_op.not_a_tensor("input", input)
        if global_scale is not None and not isinstance(global_scale, torch.Tensor):
            raise quantize_op.not_a_tensor("global_scale", global_scale)
        code = 0 if recipe is None else recipe.code(nvfp4_4over6, input, sf_vec_size, sf_use_ue8m0, compiling)
        if compiling:
            return op(
                input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                is_global_scale_inversed, enable_pdl, code,
            )
        launch = STATE.launchers.get(input.get_device()) if (input.is_cuda or input.is_cpu) else None
        return quantize(
            input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
            is_global_scale_inversed, enable_pdl, code, launch or launch_for(input),
        )

    return core


def recipe_for(original: Callable, module) -> Optional[Recipe]:
    """The 4over6 recipe handling for releases whose fp4_quantize has ``nvfp4_4over6`` (0.7.1+), else None."""
    parameters = inspect.signature(original).parameters
    if "nvfp4_4over6" not in parameters:
        return None
    return Recipe(module, parameters["nvfp4_4over6"].default)


def build(original: Callable, module, recipe: Optional[Recipe] = None, target: Optional[Target] = None) -> Callable:
    """Generate the replacement for ``original`` (defined in ``module``) with its exact signature; with the
    release's ``target`` row it also gets the direct path for the common call (see ``_direct_path``)."""
    signature = inspect.signature(original)
    unknown = [name for name in signature.parameters if name not in CORE_PARAMETERS]
    if unknown:
        raise TypeError(f"fp4_quantize has parameters the shim does not know: {', '.join(unknown)}")
    if recipe is None:
        recipe = recipe_for(original, module)
    core = make_core(original, signature.parameters, recipe)

    namespace = {"_core": core, "_is_compiling": torch.compiler.is_compiling, "_quantize": quantize_op.quantize,
                 "_ops": quantize_op, "_state": STATE, "_launch_for": quantize_op.launch_for, "_OP_BACKENDS": OP_BACKENDS,
                 "_INPUT_DTYPES": quantize_op.INPUT_DTYPES, "_FLOAT32": torch.float32, "_UINT8": torch.uint8}
    declared = oplib.declare(signature, namespace)
    forwarded = []
    for name, absent_value in CORE_PARAMETERS.items():
        if name in signature.parameters:
            forwarded.append(name)
        else:
            namespace[f"_absent_{name}"] = absent_value
            forwarded.append(f"_absent_{name}")
    # The common eager call (CUDA backend, no 4over6 recipe) goes straight to the kernel path; anything
    # else, and every call under torch.compile, goes through _core. One frame less is measurable in P1.
    needs_core = ["_is_compiling()"] + [
        condition for name, condition in (
            ("backend", "backend not in _OP_BACKENDS"),
            ("batch_invariant", "batch_invariant"),
            ("nvfp4_4over6", "nvfp4_4over6 is not None"),
        ) if name in signature.parameters
    ]
    inversed = "is_global_scale_inversed" if "is_global_scale_inversed" in signature.parameters else "False"
    source = (
        f"def fp4_quantize(_replacement, {declared}):\n"
        f"    if {' or '.join(needs_core)}:\n"
        f"        return _core({', '.join(forwarded)})\n"
        + (_direct_path(target, inversed) if target is not None else "")
        + "    try:\n"
        "        launch = _state.launchers.get(input.get_device()) if input.is_cuda else None\n"
        "    except AttributeError:\n"
        "        raise _ops.not_a_tensor('input', input) from None\n"
        "    return _quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout,\n"
        f"                     is_sf_8x4_layout, {inversed}, enable_pdl, 0, launch or _launch_for(input))\n"
    )
    return _finish(source, namespace, original, "fp4_quantize")


def _direct_path(target: Target, inversed: str) -> str:
    """Generated code for the call SGLang makes on every layer: a 2-D row-major input, NVFP4 with swizzled
    128x4 scale factors, a one-element float32 global scale on the input's device, on a GPU whose FP4
    kernel is loaded. It allocates what ``ops.quantize`` allocates for that case and calls FlashInfer's JIT
    entry with the release's argument order, without the two frames in between (about 1 us per call on
    this project's CPU runner). Anything else, and anything that raises while it looks (a non-tensor, a
    1-D or 3-D input, no kernel for the device), takes the general path, whose checks and errors are the
    ones every call had before. The parity and battery tests run both paths.

    Devices cost no extra check here: kernels are keyed by CUDA device index (>= 0) and a non-CUDA input
    with an index is sent away, so the scale's ``get_device()`` equal to the input's means a CUDA scale on
    the same GPU; a CPU or meta scale (-1 for both) never matches (tests/gpu/test_gpu_battery.py runs the
    meta cases on this path).
    """
    values = dict(sf_vec_size="16", sf_use_ue8m0="False", is_sf_swizzled_layout="True", is_sf_8x4_layout="False",
                  is_global_scale_inversed=inversed, enable_pdl="pdl if enable_pdl is None else enable_pdl",
                  nvfp4_4over6_code="0")
    if target.swizzled_sf_padded_columns:
        sf_columns, columns_check = "(columns // 16 + 3) // 4 * 4", ""
    else:  # these releases view the buffer as (-1, K/16): only K/16 a multiple of 4 has no remainder
        sf_columns, columns_check = "columns // 16", " or columns % 64"
    # ``stride() == (columns, 1)`` is row-major and contiguous in one call; the contiguous tensors it
    # leaves out (a size-1 dimension with another stride) go the general way, as FlashInfer's stride(-2) test.
    return (
        "    try:\n"
        "        device = input.get_device()\n"
        "        kernel, pdl = _state.direct_kernels[device]\n"
        "        rows, columns = input.shape\n"
        "        direct = not (sf_vec_size != 16 or sf_use_ue8m0 or not is_sf_swizzled_layout or is_sf_8x4_layout\n"
        f"                      or columns % 16{columns_check} or not rows or input.stride() != (columns, 1)\n"
        "                      or input.dtype not in _INPUT_DTYPES\n"
        "                      or global_scale.dtype is not _FLOAT32 or global_scale.numel() != 1\n"
        "                      or global_scale.get_device() != device or (not input.is_cuda and device >= 0))\n"
        "    except (AttributeError, KeyError, ValueError):\n"
        "        direct = False\n"
        "    if direct:\n"
        "        out_val = input.new_empty((rows, columns // 2), dtype=_UINT8)\n"
        f"        out_sf = input.new_empty(((rows + 127) // 128 * 128, {sf_columns}), dtype=_UINT8)\n"
        f"        {kernel_call(target, values)}\n"
        "        return out_val, out_sf\n"
    )


class Replacement:
    """What the shim puts where FlashInfer's function was: callable exactly like it (same signature, name,
    docstring; ``__wrapped__`` is the original), but its repr says whose it is. A plain function cannot
    have its own repr, so each replacement is an instance of a one-off subclass whose ``__call__`` is the
    generated function, taking the instance first (Dynamo traces a method ``__call__``, not a staticmethod
    one; the bound-method step costs about 0.1 us per call, measured on CPU)."""

    def __repr__(self):
        original = self.__wrapped__
        return (f"<fp4_dynamo_shim replacement of {original.__module__}.{original.__qualname__} "
                f"(FlashInfer's original: {object.__repr__(original)})>")

    def __reduce__(self):  # pickled by name, like the function it stands for
        return _resolve, (self.__module__, self.__qualname__)


def _resolve(module: str, qualname: str):
    import importlib

    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _finish(source: str, namespace: dict, original: Callable, name: str) -> Callable:
    oplib.run_source(source, f"<fp4_dynamo_shim generated {original.__module__}.{name}>", namespace)
    replacement = type(name, (Replacement,), {"__call__": namespace[name]})()
    functools.update_wrapper(replacement, original)
    replacement.__annotations__ = dict(getattr(original, "__annotations__", {}))
    setattr(replacement, MARKER, True)
    replacement.__fp4_dynamo_shim_source__ = source  # generated code has no file; keep it for debugging
    return replacement


def build_forwarding(original: Callable, dispatch: Callable) -> Callable:
    """A function with ``original``'s exact signature that calls ``dispatch(**arguments)``."""
    signature = inspect.signature(original)
    namespace = {"_dispatch": dispatch}
    name = original.__name__
    source = (f"def {name}(_replacement, {oplib.declare(signature, namespace)}):\n"
              f"    return _dispatch({oplib.keywords(signature)})\n")
    return _finish(source, namespace, original, name)


def is_shim(function) -> bool:
    return getattr(function, MARKER, False) is True
