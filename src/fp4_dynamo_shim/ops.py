"""The ``fp4_dynamo_shim::fp4_quantize`` custom op: schema, fake, CPU and CUDA kernels.

Output allocation, the column-major transpose and the scale-factor view are one
function (:func:`quantize`) shared by the fake and both kernels, so the fake's
shapes, dtypes and strides are the real ones by construction; only the
``launch`` step differs (nothing for the fake, the reference on CPU, the
preloaded JIT module on CUDA).

Registered with ``Library.define`` + ``impl`` + ``register_fake`` rather than
``torch.library.custom_op``: the latter's Python wrapper cost 1.1-1.8x the
original FlashInfer call per eager call on an H200. Eager calls skip the
dispatcher altogether (see ``wrapper.py``); the op is what Dynamo records.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import layout, reference
from .errors import ShimError
from .targets import Target

NAMESPACE = "fp4_dynamo_shim"
OP_NAME = "fp4_quantize"
SCHEMA = (
    "fp4_quantize(Tensor input, Tensor? global_scale, int sf_vec_size, bool sf_use_ue8m0, "
    "bool is_sf_swizzled_layout, bool is_sf_8x4_layout, bool is_global_scale_inversed, "
    "bool? enable_pdl, int nvfp4_4over6_code) -> (Tensor, Tensor)"
)
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)

#: Set by apply(): the release's target row and a launch function per CUDA device index.
_target: Optional[Target] = None
_cuda_launchers: dict = {}


def configure(target: Optional[Target], cuda_launchers: dict) -> None:
    global _target, _cuda_launchers
    _target = target
    _cuda_launchers = cuda_launchers


def active_target() -> Target:
    if _target is None:
        raise ShimError("fp4_dynamo_shim is not applied: call fp4_dynamo_shim.apply() first")
    return _target


def _check_arguments(input, global_scale, sf_vec_size, sf_use_ue8m0, nvfp4_4over6_code, target) -> None:
    """Reject what the kernel would reject (or silently misread), before anything is allocated."""
    if input.dtype not in INPUT_DTYPES:
        raise NotImplementedError(
            f"fp4_quantize only supports input tensor with dtypes fp16/bf16/e4m3, got {input.dtype}"
        )
    if sf_use_ue8m0 and sf_vec_size != 32:
        raise ValueError(f"sf_vec_size can only be 32 when sf_use_ue8m0 is true, got {sf_vec_size}")
    if not sf_use_ue8m0:
        if sf_vec_size != 16:
            raise ValueError(f"sf_vec_size can only be 16 when sf_use_ue8m0 is false, got {sf_vec_size}")
        if global_scale is None:
            raise ValueError("global_scale is required when sf_use_ue8m0 is false (NVFP4)")
    if input.shape[-1] % sf_vec_size != 0:
        raise ValueError(
            f"fp4_quantize: the last dimension ({input.shape[-1]}) must be a multiple of sf_vec_size ({sf_vec_size})"
        )
    if not input.is_contiguous():
        raise ValueError(
            f"fp4_quantize: input must be contiguous row-major or column-major, got shape "
            f"{tuple(input.shape)} with strides {input.stride()}"
        )
    if global_scale is not None:
        if not target.converts_global_scale:
            if global_scale.dtype != torch.float32:
                raise TypeError(f"fp4_quantize: global_scale must be float32, got {global_scale.dtype}")
            if global_scale.device != input.device:
                raise ValueError(
                    f"fp4_quantize: global_scale is on {global_scale.device} but input is on {input.device}"
                )
        rows = input.numel() // input.shape[-1]
        allowed = "1 or one per row" if target.row_wise_global_scale else "1"
        if global_scale.numel() != 1 and not (target.row_wise_global_scale and global_scale.numel() == rows):
            raise ValueError(
                f"fp4_quantize: global_scale must have {allowed} element(s), got shape {tuple(global_scale.shape)}"
            )
    if nvfp4_4over6_code != 0 and (sf_use_ue8m0 or input.dtype == torch.float8_e4m3fn):
        raise ValueError("nvfp4_4over6 applies to NVFP4 (sf_vec_size=16) with fp16 or bf16 input only")


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
    """FlashInfer's ``fp4_quantize`` minus the module lookup: shape logic here, arithmetic in ``launch``."""
    target = active_target()
    if sf_vec_size != 16 and sf_vec_size != 32:
        raise NotImplementedError("sf_vec_size can only be 16 or 32")
    if input.dim() < 2:
        raise ValueError(f"fp4_quantize: input must have at least 2 dimensions, got shape {tuple(input.shape)}")
    is_column_major = input.stride(-2) == 1
    if is_column_major:
        input = input.transpose(-2, -1)
    _check_arguments(input, global_scale, sf_vec_size, sf_use_ue8m0, nvfp4_4over6_code, target)
    if target.converts_global_scale and global_scale is not None:
        global_scale = global_scale.to(device=input.device, dtype=torch.float32)

    columns = input.shape[-1]
    rows = input.numel() // columns
    sf_columns = columns // sf_vec_size
    out_val = input.new_empty((*input.shape[:-1], columns // 2), dtype=torch.uint8)
    if is_sf_swizzled_layout:
        padded_rows, padded_columns = layout.swizzled_sf_shape(rows, sf_columns, is_sf_8x4_layout)
        sf_size = capacity = padded_rows * padded_columns
        view_columns = padded_columns if target.swizzled_sf_padded_columns else sf_columns
    else:
        sf_size = rows * sf_columns
        capacity = layout.round_up(rows, target.linear_sf_row_alignment) * sf_columns
        view_columns = sf_columns
    out_sf = input.new_empty((capacity,), dtype=torch.uint8)
    if launch is not None:
        launch(
            input, global_scale, out_val, out_sf, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout,
            is_sf_8x4_layout, is_global_scale_inversed, enable_pdl, nvfp4_4over6_code,
        )
    sf = out_sf[:sf_size].reshape((-1, view_columns))
    if is_column_major:
        return out_val.transpose(-2, -1), sf.transpose(-2, -1)
    return out_val, sf


def launch_reference(
    input, global_scale, out_val, out_sf, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout,
    is_sf_8x4_layout, is_global_scale_inversed, enable_pdl, nvfp4_4over6_code,
) -> None:
    """Fill the output buffers with the reference quantizer's bytes, zeros in all padding."""
    if nvfp4_4over6_code != 0:
        raise NotImplementedError("fp4_dynamo_shim's reference quantizer does not implement the NVFP4 4over6 recipe")
    columns = input.shape[-1]
    packed, sf = reference.quantize(
        input.reshape(-1, columns), global_scale, sf_vec_size, sf_use_ue8m0, is_global_scale_inversed
    )
    out_val.view(-1, columns // 2).copy_(packed)
    if is_sf_swizzled_layout:
        out_sf.copy_(layout.swizzle(sf, is_sf_8x4_layout))
    else:
        out_sf.zero_()
        out_sf[: sf.numel()].copy_(sf.reshape(-1))


def launch_on_cuda(input, *args) -> None:
    try:
        launcher = _cuda_launchers[input.device.index]
    except KeyError:
        raise ShimError(
            f"fp4_dynamo_shim: no FP4 kernel was loaded for {input.device}; it was not visible when the shim "
            "was applied"
        ) from None
    launcher(input, *args)


def launch_for(input: torch.Tensor) -> Callable:
    if input.is_cuda:
        return launch_on_cuda
    if input.device.type == "cpu":
        return launch_reference
    raise ShimError(f"fp4_dynamo_shim: fp4_quantize runs on CUDA or CPU tensors, got {input.device}")


def _fake(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
          is_global_scale_inversed, enable_pdl, nvfp4_4over6_code):
    return quantize(
        input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
        is_global_scale_inversed, enable_pdl, nvfp4_4over6_code, launch=None,
    )


def _kernel(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
            is_global_scale_inversed, enable_pdl, nvfp4_4over6_code):
    return quantize(
        input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
        is_global_scale_inversed, enable_pdl, nvfp4_4over6_code, launch=launch_for(input),
    )


# Kept alive for the life of the process: dropping the Library object would unregister the op.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIBRARY.define(SCHEMA)
_LIBRARY.impl(OP_NAME, _kernel, "CPU")
_LIBRARY.impl(OP_NAME, _kernel, "CUDA")
torch.library.register_fake(f"{NAMESPACE}::{OP_NAME}", _fake, lib=_LIBRARY)

fp4_quantize_op = getattr(getattr(torch.ops, NAMESPACE), OP_NAME).default
