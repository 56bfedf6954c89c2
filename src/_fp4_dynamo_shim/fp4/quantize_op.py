"""The ``fp4_dynamo_shim::fp4_quantize`` custom op: schema, fake, CPU and CUDA kernels.

Output allocation, the column-major transpose and the scale-factor view are one
function (:func:`quantize`) shared by the fake and both kernels, so the fake's
shapes, dtypes and strides are the real ones by construction; only the
``launch`` step differs (nothing for the fake, the reference on CPU, the
preloaded JIT module on CUDA).

Registered through :func:`_fp4_dynamo_shim.oplib.define` (the dispatcher-light way, and why).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import arithmetic
from . import layout
from . import reference
from .devices import STATE
from .. import oplib
from ..errors import InvalidArgumentError, ShimError
from .fp4_releases import Target

NAMESPACE = "fp4_dynamo_shim"
OP_NAME = "fp4_quantize"
#: The op's parameters in order, with their schema types: the schema and the launch scalars (every argument
#: after the two tensors, which launch functions and FlashInfer's JIT entry take after the output buffers) come
#: from here. ``nvfp4_4over6_code`` is the 4over6 recipe resolved at the call (0 before 0.7.1).
PARAMETERS = (
    ("input", "Tensor"), ("global_scale", "Tensor?"), ("sf_vec_size", "int"), ("sf_use_ue8m0", "bool"),
    ("is_sf_swizzled_layout", "bool"), ("is_sf_8x4_layout", "bool"), ("is_global_scale_inversed", "bool"),
    ("enable_pdl", "bool?"), ("nvfp4_4over6_code", "int"),
)
SCHEMA = f"{OP_NAME}({', '.join(f'{kind} {name}' for name, kind in PARAMETERS)}) -> (Tensor, Tensor)"
LAUNCH_SCALARS = tuple(name for name, _ in PARAMETERS[2:])
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
_FLOAT32, _UINT8 = torch.float32, torch.uint8
_QUANTIZE_TENSORS = ("input", "global_scale")

def active_target() -> Target:
    if STATE.target is None:
        raise ShimError("fp4_dynamo_shim is not applied: call fp4_dynamo_shim.apply() first")
    return STATE.target


def not_a_tensor(name: str, value) -> InvalidArgumentError:
    """The error for a non-tensor argument (FlashInfer's own function fails on it with an AttributeError).
    It names the type only: under torch.compile a numpy array is already a tensor, and has no repr."""
    kind = type(value).__name__ if type(value).__module__ == "builtins" else f"{type(value).__module__}.{type(value).__name__}"
    return InvalidArgumentError(
        f"fp4_quantize: {name} must be a torch.Tensor"
        + (" (float32, one element, on the input's device)" if name == "global_scale" else "")
        + f", got {kind}"
    )


def _problem(input, global_scale, sf_vec_size, sf_use_ue8m0, nvfp4_4over6_code, target) -> None:
    """Raise for the first thing the kernel would reject or silently misread; return if all is well.

    Only reached when :func:`quantize`'s one-line screen saw something unusual, so the eager hot path
    pays for a handful of comparisons, not for this.
    """
    if input.dtype not in INPUT_DTYPES:
        raise InvalidArgumentError(
            f"fp4_quantize only supports input tensor with dtypes fp16/bf16/e4m3, got {input.dtype}"
        )
    if sf_use_ue8m0 and sf_vec_size != 32:
        raise InvalidArgumentError(f"sf_vec_size can only be 32 when sf_use_ue8m0 is true, got {sf_vec_size}")
    if not sf_use_ue8m0 and sf_vec_size != 16:
        raise InvalidArgumentError(f"sf_vec_size can only be 16 when sf_use_ue8m0 is false, got {sf_vec_size}")
    if not sf_use_ue8m0 and global_scale is None:
        raise InvalidArgumentError("global_scale is required when sf_use_ue8m0 is false (NVFP4)")
    if input.shape[-1] % sf_vec_size != 0:
        raise InvalidArgumentError(
            f"fp4_quantize: the last dimension ({input.shape[-1]}) must be a multiple of sf_vec_size ({sf_vec_size})"
        )
    if not input.is_contiguous():
        raise InvalidArgumentError(
            f"fp4_quantize: input must be contiguous row-major or column-major, got shape "
            f"{tuple(input.shape)} with strides {input.stride()}"
        )
    if nvfp4_4over6_code != 0 and (sf_use_ue8m0 or input.dtype == torch.float8_e4m3fn):
        raise InvalidArgumentError("nvfp4_4over6 applies to NVFP4 (sf_vec_size=16) with fp16 or bf16 input only")


def check_devices(function: str, names, tensors, host: bool = False) -> None:
    """Raise :class:`InvalidArgumentError` naming the first tensor that is not on the first one's device.

    Devices are compared by type and index: ``Tensor.get_device()`` is -1 for CPU and meta alike, and a
    meta tensor next to a real one sends the call to the op's fake, whose outputs are uninitialized
    memory. ``host`` functions (FlashInfer copies their inputs to the CPU itself) only refuse a meta
    tensor mixed with real ones. ``tensors`` holds a tensor or None per name. Runs on every family op call:
    ``get_device()``/``is_cpu``/``is_meta`` are a third of the cost of comparing ``Tensor.device`` objects.
    """
    first = first_name = None
    for name, tensor in zip(names, tensors):
        if tensor is None:
            continue
        if first is None:
            first, first_name, index, cpu, meta = tensor, name, tensor.get_device(), tensor.is_cpu, tensor.is_meta
            continue
        meta_mixed = tensor.is_meta is not meta
        if meta_mixed or not host and (tensor.get_device() != index or tensor.is_cpu is not cpu):
            raise InvalidArgumentError(
                f"{function}: {name} is on {tensor.device} but {first_name} is on {first.device}; "
                + ("a meta tensor only goes with other meta tensors" if meta_mixed else
                   "every tensor argument must be on the same device")
            )


def _checked_global_scale(global_scale, input, rows, target):
    """The global scale the kernel will read: converted where the release converts, else validated."""
    if not isinstance(global_scale, torch.Tensor):  # a numpy array has a dtype too
        raise not_a_tensor("global_scale", global_scale)
    if global_scale.is_meta is not input.is_meta:  # even a converting release cannot copy out of a meta tensor
        check_devices("fp4_quantize", _QUANTIZE_TENSORS, (input, global_scale))
    if global_scale.numel() != 1 and not (target.row_wise_global_scale and global_scale.numel() == rows):
        allowed = "1 or one per row" if target.row_wise_global_scale else "1"
        raise InvalidArgumentError(
            f"fp4_quantize: global_scale must have {allowed} element(s), got shape {tuple(global_scale.shape)}"
        )
    if target.converts_global_scale:
        return global_scale.to(device=input.device, dtype=torch.float32)
    if global_scale.dtype != torch.float32:
        raise InvalidArgumentError(f"fp4_quantize: global_scale must be float32, got {global_scale.dtype}")
    check_devices("fp4_quantize", _QUANTIZE_TENSORS, (input, global_scale))
    return global_scale


def quantize(
    input: torch.Tensor,
    global_scale: Optional[torch.Tensor],
    sf_vec_size: int,
    sf_use_ue8m0: bool,
    is_sf_swizzled_layout: bool,
    is_sf_8x4_layout: bool,
    is_global_scale_inversed: bool,
    enable_pdl: Optional[bool],
    nvfp4_4over6_code: int,
    launch: Optional[Callable],
):
    """FlashInfer's ``fp4_quantize`` minus the module lookup: shape logic here, arithmetic in ``launch``.

    This is also the eager hot path, hence the terse screens before the detailed checks.
    """
    target = STATE.target
    if target is None:
        active_target()
    if sf_vec_size != 16 and sf_vec_size != 32:
        raise NotImplementedError("sf_vec_size can only be 16 or 32")
    try:
        is_column_major = input.stride(-2) == 1
    except IndexError:
        raise InvalidArgumentError(
            f"fp4_quantize: input must have at least 2 dimensions, got shape {tuple(input.shape)}"
        ) from None
    except (AttributeError, TypeError):
        raise not_a_tensor("input", input) from None
    if is_column_major:
        input = input.transpose(-2, -1)
    shape = input.shape
    columns = shape[-1]
    if (input.dtype not in INPUT_DTYPES or columns % sf_vec_size or not input.is_contiguous()
            or (sf_vec_size != 32 if sf_use_ue8m0 else (sf_vec_size != 16 or global_scale is None))
            or nvfp4_4over6_code):
        _problem(input, global_scale, sf_vec_size, sf_use_ue8m0, nvfp4_4over6_code, target)
    rows = input.numel() // columns
    try:
        # get_device() tells CUDA devices apart but is -1 for CPU and meta alike; is_cpu separates those two.
        unusual_scale = global_scale is not None and (
            global_scale.dtype is not _FLOAT32 or global_scale.get_device() != input.get_device()
            or global_scale.is_cpu is not input.is_cpu or global_scale.numel() != 1
        )
    except AttributeError:
        raise not_a_tensor("global_scale", global_scale) from None
    if unusual_scale:
        global_scale = _checked_global_scale(global_scale, input, rows, target)

    # Outputs are allocated in the shape they are returned in: the kernel reads only their data
    # pointers (every release 0.5.3-0.7.4), and a view per call is measurable on the eager path.
    sf_columns = columns // sf_vec_size
    out_val = input.new_empty((*shape[:-1], columns // 2), dtype=_UINT8)
    if is_sf_swizzled_layout:
        row_tile = layout.ROWS_8X4 if is_sf_8x4_layout else layout.ROWS_128X4
        padded_columns = (sf_columns + 3) // 4 * 4
        capacity = (rows + row_tile - 1) // row_tile * row_tile * padded_columns
        view_columns = padded_columns if target.swizzled_sf_padded_columns else sf_columns
        if capacity % view_columns:  # releases before 0.6.8 fail in their reshape; say it the same way
            raise RuntimeError(f"shape '[-1, {view_columns}]' is invalid for input of size {capacity}")
        out_sf = sf = input.new_empty((capacity // view_columns, view_columns), dtype=_UINT8)
    else:
        alignment = target.linear_sf_row_alignment
        out_sf = input.new_empty(((rows + alignment - 1) // alignment * alignment, sf_columns), dtype=_UINT8)
        sf = out_sf if alignment == 1 else out_sf[:rows]  # padded for the kernel, sliced to M rows
    if launch is not None and rows:  # M=0: FlashInfer launches an empty grid, which leaves a stale CUDA error
        launch(
            input, global_scale, out_val, out_sf, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout,
            is_sf_8x4_layout, is_global_scale_inversed, enable_pdl, nvfp4_4over6_code,
        )
    if is_column_major:
        return out_val.transpose(-2, -1), sf.transpose(-2, -1)
    return out_val, sf


def current_recipe(nvfp4_4over6_code: int) -> arithmetic.Recipe:
    """The recipe the installed kernel would run now: its switches read where and when it reads them
    (every launch), with the 4over6 code the caller passed (-1: from the environment)."""
    return arithmetic.recipe(active_target().arithmetic, nvfp4_4over6_code)


def launch_reference(
    input, global_scale, out_val, out_sf, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout,
    is_sf_8x4_layout, is_global_scale_inversed, enable_pdl, nvfp4_4over6_code,
) -> None:
    """Fill the output buffers with the reference quantizer's bytes, zeros in all padding."""
    columns = input.shape[-1]
    packed, sf = reference.quantize(
        input.reshape(-1, columns), global_scale, sf_vec_size, sf_use_ue8m0, is_global_scale_inversed,
        recipe=current_recipe(nvfp4_4over6_code),
    )
    out_val.view(-1, columns // 2).copy_(packed)
    flat_sf = out_sf.view(-1)
    if is_sf_swizzled_layout:
        flat_sf.copy_(layout.swizzle(sf, is_sf_8x4_layout))
    else:
        flat_sf.zero_()
        flat_sf[: sf.numel()].copy_(sf.reshape(-1))


def launch_for(input: torch.Tensor) -> Optional[Callable]:
    """The launch function for the input's device (the eager path inlines the common case); None for a meta
    input, which gets meta outputs of the right shapes, as from the op itself (and any PyTorch op)."""
    launch = STATE.launchers.get(input.get_device()) if (input.is_cuda or input.is_cpu) else None
    if launch is None and input.is_meta:
        return None
    if launch is None:
        active_target()  # a process that never applied has no launchers: that, not the device, is what to say
        if input.is_cuda:
            raise ShimError(
                f"fp4_dynamo_shim: no FP4 kernel was loaded for {input.device}; it was not visible when the "
                "shim was applied"
            )
        raise ShimError(f"fp4_dynamo_shim: fp4_quantize runs on CUDA or CPU tensors, got {input.device}")
    return launch


def _fake(*arguments):
    """The op's fake: :data:`PARAMETERS` in order, the outputs allocated, nothing launched."""
    return quantize(*arguments, launch=None)


def _kernel(*arguments):
    """The op's CPU and CUDA kernel: :data:`PARAMETERS` in order, launched on the input's device."""
    return quantize(*arguments, launch=launch_for(arguments[0]))


# Kept alive for the life of the process: dropping the Library object would unregister the op.
_LIBRARY = oplib.library(NAMESPACE)
oplib.define(_LIBRARY, SCHEMA, {device: _kernel for device in oplib.DEVICES}, _fake)

fp4_quantize_op = getattr(getattr(torch.ops, NAMESPACE), OP_NAME).default
