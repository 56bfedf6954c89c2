"""Custom ops for FlashInfer's FP4 kernels that ``fp4_quantize``'s op does not cover.

Each op has a fake, a pure-PyTorch reference (its CPU kernel, and the GPU fallback below SM100) and a
CUDA kernel that calls FlashInfer's own closure from the preloaded ``get_fp4_quantization_module``
namespace, so the JIT entry receives exactly FlashInfer's arguments and nothing is loaded at call time.
``family.py`` maps FlashInfer's public functions onto these ops.

What a GPU below SM100 does differs by kernel, and is a column of the table (``without_fp4``):
``"refuse"`` — the quantize kernels launch and write nothing there, so the shim raises (or runs the
reference with ``FP4_DYNAMO_SHIM_FALLBACK=reference``); ``"flashinfer"`` — ``mm_fp4`` picks its own
backend and raises its own error there, which comes through unchanged (the reference runs instead with
the fallback); ``"runs"`` — the interleave kernel and the host helpers work on any GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable

import torch

from .. import oplib
from . import layout
from . import reference
from _fp4_dynamo_shim.errors import InvalidArgumentError, NoFp4KernelError, ShimError
from .devices import STATE
from .quantize_op import NAMESPACE, check_devices, current_recipe


@dataclasses.dataclass(frozen=True)
class FamilyOp:
    name: str
    schema: str
    fake: Callable
    #: Pure-PyTorch kernel (CPU, and the GPU fallback).
    reference: Callable
    #: Calls FlashInfer: ``(namespace, *op_args) -> outputs``.
    via_flashinfer: Callable
    #: On a GPU without FP4 kernels (SM < 100): "refuse", "flashinfer" or "runs" (module docstring).
    without_fp4: str
    #: FlashInfer runs it on the host through cuda:0's module (dequantize helpers): CPU output.
    host: bool = False


@functools.lru_cache(maxsize=None)
def _accepts(function: Callable, parameter: str) -> bool:
    """Whether FlashInfer's closure takes ``parameter`` in this release (asked once per closure, not per call)."""
    return parameter in inspect.signature(function).parameters


def _rows_padded(rows, tile=128):
    return layout.round_up(rows, tile)


# block_scale_interleave ------------------------------------------------------------------------------

def _check_interleave(sf):
    if sf.dim() not in (2, 3):
        raise InvalidArgumentError(f"block_scale_interleave: expected a 2-D or 3-D tensor, got shape {tuple(sf.shape)}")
    if sf.dtype not in (torch.uint8, torch.bfloat16):
        raise InvalidArgumentError(f"block_scale_interleave only supports uint8 and bfloat16, got {sf.dtype}")
    if not sf.is_contiguous():
        raise InvalidArgumentError("block_scale_interleave: the input must be contiguous")


def _interleave_fake(sf):
    _check_interleave(sf)
    experts = sf.shape[0] if sf.dim() == 3 else 1
    return sf.new_empty((experts * _rows_padded(sf.shape[-2]) * layout.round_up(sf.shape[-1], 4),))


def _interleave_reference(sf):
    _check_interleave(sf)
    return reference.block_scale_interleave(sf)


def _interleave_flashinfer(namespace, sf):
    _check_interleave(sf)
    return namespace.block_scale_interleave_sm100(sf)


# e2m1_and_ufp8sf_scale_to_float / mxfp4_dequantize_host (host ops) ------------------------------------

def _check_dequantize(e2m1, sf, global_scale, sf_vec_size, ufp8_type):
    if e2m1.dim() != 2 or e2m1.dtype != torch.uint8:
        raise InvalidArgumentError(f"e2m1 values must be a 2-D uint8 tensor, got {tuple(e2m1.shape)} {e2m1.dtype}")
    if not e2m1.is_contiguous():
        raise InvalidArgumentError("e2m1 values must be contiguous")
    if sf.dtype != torch.uint8:
        raise InvalidArgumentError(f"scale factors must be uint8, got {sf.dtype}")
    if sf_vec_size <= 0 or (e2m1.shape[1] * 2) % sf_vec_size:
        raise InvalidArgumentError(f"sf_vec_size {sf_vec_size} must divide the row length {e2m1.shape[1] * 2}")


def _dequantize_fake(e2m1, sf, global_scale, sf_vec_size, ufp8_type, swizzled, is_8x4):
    _check_dequantize(e2m1, sf, global_scale, sf_vec_size, ufp8_type)
    # Host output; a fake tensor's device is the real one's, and real meta inputs get a meta output, not memory.
    return torch.empty((e2m1.shape[0], e2m1.shape[1] * 2), dtype=torch.float32,
                       device="meta" if e2m1.is_meta else "cpu")


def _dequantize_reference(e2m1, sf, global_scale, sf_vec_size, ufp8_type, swizzled, is_8x4):
    _check_dequantize(e2m1, sf, global_scale, sf_vec_size, ufp8_type)
    return reference.e2m1_and_ufp8sf_scale_to_float(e2m1.cpu(), sf.cpu(), global_scale.cpu(), sf_vec_size,
                                                    ufp8_type, swizzled, is_8x4)


def _dequantize_flashinfer(namespace, e2m1, sf, global_scale, sf_vec_size, ufp8_type, swizzled, is_8x4):
    _check_dequantize(e2m1, sf, global_scale, sf_vec_size, ufp8_type)
    closure = namespace.e2m1_and_ufp8sf_scale_to_float_sm100
    extra = (is_8x4,) if _accepts(closure, "is_sf_8x4_layout") else ()
    return closure(e2m1, sf, global_scale, sf_vec_size, ufp8_type, swizzled, *extra)


def _check_dequantize_host(weight, scale, group_size):
    if weight.dtype != torch.uint8 or scale.dtype != torch.uint8 or weight.dim() != 2 or scale.dim() != 2:
        raise InvalidArgumentError("mxfp4_dequantize_host: weight and scale must be 2-D uint8 tensors")
    if weight.numel() == 0 or weight.shape[0] != scale.shape[0] or weight.shape[1] * 2 != scale.shape[1] * group_size:
        raise InvalidArgumentError(
            f"mxfp4_dequantize_host: weight {tuple(weight.shape)} and scale {tuple(scale.shape)} do not match "
            f"group_size {group_size}")


def _dequantize_host_fake(weight, scale, group_size):
    _check_dequantize_host(weight, scale, group_size)
    return weight.new_empty((weight.shape[0], weight.shape[1] * 2), dtype=torch.float32)


def _dequantize_host_reference(weight, scale, group_size):
    _check_dequantize_host(weight, scale, group_size)
    return reference.mxfp4_dequantize_host(weight, scale, group_size)


def _dequantize_host_flashinfer(namespace, weight, scale, group_size):
    _check_dequantize_host(weight, scale, group_size)
    return namespace.mxfp4_dequantize_host(weight, scale, group_size)


# fp4_batched_quantize ---------------------------------------------------------------------------------

def _check_quantize_input(input, global_scale, columns, sf_vec_size, dtypes, name):
    if input.dtype not in dtypes:
        raise InvalidArgumentError(f"{name} only supports input dtypes {', '.join(map(str, dtypes))}, got {input.dtype}")
    if columns % sf_vec_size:
        raise InvalidArgumentError(f"{name}: the last dimension ({columns}) must be a multiple of {sf_vec_size}")
    if not input.is_contiguous():
        raise InvalidArgumentError(f"{name}: input must be contiguous")
    if global_scale.dtype != torch.float32:
        raise InvalidArgumentError(f"{name}: global scale must be float32, got {global_scale.dtype}")


def _check_batched(input, global_scale, sf_vec_size, code):
    if input.dim() != 3:
        raise InvalidArgumentError(f"nvfp4_batched_quantize: input should be a 3-D tensor, got {tuple(input.shape)}")
    if sf_vec_size != 16:
        raise InvalidArgumentError(f"nvfp4_batched_quantize: sf_vec_size can only be 16, got {sf_vec_size}")
    _check_quantize_input(input, global_scale, input.shape[-1], 16,
                          (torch.float16, torch.bfloat16, torch.float8_e4m3fn), "nvfp4_batched_quantize")
    if global_scale.numel() != 1 and global_scale.numel() != input.shape[1]:
        raise InvalidArgumentError("nvfp4_batched_quantize: global scale should have shape [1] or [num_tokens]")


def _batched_fake(input, global_scale, sf_vec_size, sf_use_ue8m0, code):
    _check_batched(input, global_scale, sf_vec_size, code)
    batches, rows, columns = input.shape
    return (input.new_empty((batches, rows, columns // 2), dtype=torch.uint8),
            input.new_empty((batches, _rows_padded(rows) * layout.round_up(columns // sf_vec_size, 4)),
                            dtype=torch.uint8))


def _batched_reference(input, global_scale, sf_vec_size, sf_use_ue8m0, code):
    _check_batched(input, global_scale, sf_vec_size, code)
    return reference.batched_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, current_recipe(code))


def _batched_flashinfer(namespace, input, global_scale, sf_vec_size, sf_use_ue8m0, code):
    _check_batched(input, global_scale, sf_vec_size, code)
    closure = namespace.fp4_batched_quantize_sm100
    extra = (code,) if _accepts(closure, "nvfp4_4over6_code") else ()
    return closure(input, global_scale, sf_vec_size, sf_use_ue8m0, *extra)


# fp4_experts_quantize (scaled_fp4_grouped_quantize, silu_and_mul_scaled_nvfp4_experts_quantize) -----

def _experts_columns(input, use_silu_and_mul):
    return input.shape[-1] // 2 if use_silu_and_mul else input.shape[-1]


def _check_experts(input, global_scale, mask, use_silu_and_mul):
    name = "silu_and_mul_scaled_nvfp4_experts_quantize" if use_silu_and_mul else "scaled_fp4_grouped_quantize"
    if input.dim() != 3:
        raise InvalidArgumentError(f"{name}: input should be a 3-D [experts, rows, columns] tensor")
    _check_quantize_input(input, global_scale, _experts_columns(input, use_silu_and_mul), 16,
                          (torch.float16, torch.bfloat16), name)
    if global_scale.dim() != 1 or global_scale.shape[0] != input.shape[0]:
        raise InvalidArgumentError(f"{name}: global scale must have one value per expert ([{input.shape[0]}])")
    if mask.dtype != torch.int32 or mask.dim() != 1 or mask.shape[0] != input.shape[0]:
        raise InvalidArgumentError(f"{name}: mask must be a 1-D int32 tensor with one value per expert")


def _experts_fake(input, global_scale, mask, use_silu_and_mul, code):
    _check_experts(input, global_scale, mask, use_silu_and_mul)
    experts, rows = input.shape[0], input.shape[1]
    columns = _experts_columns(input, use_silu_and_mul)
    return (input.new_empty((experts, rows, columns // 2), dtype=torch.uint8),
            input.new_empty((experts, _rows_padded(rows), layout.round_up(columns // 16, 4) // 4), dtype=torch.int32))


def _experts_reference(input, global_scale, mask, use_silu_and_mul, code):
    _check_experts(input, global_scale, mask, use_silu_and_mul)
    return reference.experts_quantize(input, global_scale, mask, use_silu_and_mul, current_recipe(code))


#: The inverse of FlashInfer's ``permute(3, 4, 1, 5, 2, 0)`` on the scale-factor view.
_EXPERT_SF_UNPERMUTE = (5, 2, 4, 0, 1, 3)


def _experts_flashinfer(namespace, input, global_scale, mask, use_silu_and_mul, code):
    _check_experts(input, global_scale, mask, use_silu_and_mul)
    if use_silu_and_mul:
        closure = namespace.silu_and_mul_scaled_nvfp4_experts_quantize_sm100
        arguments = (input, mask, global_scale)
    else:
        closure = namespace.scaled_fp4_grouped_quant_sm100
        arguments = (input, global_scale, mask)
    extra = (code,) if _accepts(closure, "nvfp4_4over6_code") else ()
    values, scales = closure(*arguments, *extra)
    # FlashInfer returns permuted views of two fresh buffers; the op returns the buffers themselves.
    experts, rows = input.shape[0], input.shape[1]
    return (values.permute(2, 0, 1),
            scales.permute(*_EXPERT_SF_UNPERMUTE).reshape(experts, _rows_padded(rows), -1).view(torch.int32))


def experts_views(values, scales):
    """FlashInfer's returned views of the op's buffers: ``(M, K/2, L)`` uint8 and the 6-D e4m3 scale view."""
    experts, padded_rows, packed_columns = scales.shape
    padded_k = packed_columns * 4
    view = scales.view(torch.float8_e4m3fn).view(experts, padded_rows // 128, padded_k // 4, 32, 4, 4)
    return values.permute(1, 2, 0), view.permute(3, 4, 1, 5, 2, 0)


# mm_fp4 -----------------------------------------------------------------------------------------------

def _mm_fp4_fake(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend, use_nvfp4,
                 enable_pdl):
    if a.dim() != 2 or b.dim() != 2:
        raise InvalidArgumentError(f"mm_fp4: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise InvalidArgumentError(f"mm_fp4: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply "
                                   "(b is the transpose of an [N, K/2] packed weight)")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _mm_fp4_reference(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend,
                      use_nvfp4, enable_pdl):
    _mm_fp4_fake(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend, use_nvfp4,
                 enable_pdl)
    return reference.mm_fp4(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, use_nvfp4)


def _mm_fp4_flashinfer(namespace, a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout,
                       backend, use_nvfp4, enable_pdl):
    original = STATE.mm_fp4
    if original is None:
        raise ShimError("fp4_dynamo_shim: mm_fp4 is not available (the shim is not applied)")
    keywords = dict(alpha=alpha, out_dtype=out_dtype, block_size=block_size, use_8x4_sf_layout=use_8x4_sf_layout,
                    backend=backend, use_nvfp4=use_nvfp4)
    if enable_pdl is not None and _accepts(original, "enable_pdl"):
        keywords["enable_pdl"] = enable_pdl
    return original(a, b, a_descale, b_descale, **keywords)


OPS = (
    FamilyOp("block_scale_interleave", "block_scale_interleave(Tensor unswizzled_sf) -> Tensor",
             _interleave_fake, _interleave_reference, _interleave_flashinfer, without_fp4="runs"),
    FamilyOp("e2m1_and_ufp8sf_scale_to_float",
             "e2m1_and_ufp8sf_scale_to_float(Tensor e2m1, Tensor sf, Tensor global_scale, int sf_vec_size, "
             "int ufp8_type, bool is_sf_swizzled_layout, bool is_sf_8x4_layout) -> Tensor",
             _dequantize_fake, _dequantize_reference, _dequantize_flashinfer, without_fp4="runs", host=True),
    FamilyOp("mxfp4_dequantize_host", "mxfp4_dequantize_host(Tensor weight, Tensor scale, int group_size) -> Tensor",
             _dequantize_host_fake, _dequantize_host_reference, _dequantize_host_flashinfer, without_fp4="runs",
             host=True),
    FamilyOp("fp4_batched_quantize",
             "fp4_batched_quantize(Tensor input, Tensor global_scale, int sf_vec_size, bool sf_use_ue8m0, "
             "int nvfp4_4over6_code) -> (Tensor, Tensor)",
             _batched_fake, _batched_reference, _batched_flashinfer, without_fp4="refuse"),
    FamilyOp("fp4_experts_quantize",
             "fp4_experts_quantize(Tensor input, Tensor global_scale, Tensor mask, bool use_silu_and_mul, "
             "int nvfp4_4over6_code) -> (Tensor, Tensor)",
             _experts_fake, _experts_reference, _experts_flashinfer, without_fp4="refuse"),
    FamilyOp("mm_fp4",
             "mm_fp4(Tensor a, Tensor b, Tensor a_descale, Tensor b_descale, Tensor? alpha, ScalarType out_dtype, "
             "int block_size, bool use_8x4_sf_layout, str backend, bool use_nvfp4, bool? enable_pdl) -> Tensor",
             _mm_fp4_fake, _mm_fp4_reference, _mm_fp4_flashinfer, without_fp4="flashinfer"),
)


def _first_loaded_namespace():
    for namespace, _ in STATE.family_modules.values():
        if namespace is not None:
            return namespace
    return None


def _screened(op: FamilyOp, implementation: Callable, fake: bool) -> Callable:
    """``implementation`` behind the device screen for the op's tensor arguments (they come first in every
    schema): all on one device (host ops: meta only with meta), before anything is allocated.

    The dispatcher picks the kernel of the highest device among the tensors: any meta tensor sends the call
    to the fake (real tensors alongside included), so the fake gets the full screen; the CPU kernel only
    ever sees CPU tensors and needs none; the CUDA kernel sees CUDA and CPU tensors, which ``get_device()``
    tells apart (-1 for CPU, the index for each GPU) for a third of the cost of comparing ``Tensor.device``
    objects: it runs on every eager call on a GPU."""
    schema = torch._C.parse_schema(op.schema).arguments
    count = next((i for i, a in enumerate(schema) if str(a.type) not in ("Tensor", "Optional[Tensor]")), len(schema))
    names, name, host = tuple(a.name for a in schema[:count]), f"{NAMESPACE}::{op.name}", op.host

    if fake:
        def screened(*arguments):
            check_devices(name, names, arguments[:count], host)
            return implementation(*arguments)
    else:
        def screened(*arguments):
            index = arguments[0].get_device()
            for position in range(1, count):
                tensor = arguments[position]
                if tensor is not None and tensor.get_device() != index:
                    check_devices(name, names, arguments[:count])  # raises, naming the argument
            return implementation(*arguments)
    return functools.wraps(implementation)(screened)


def _make_kernel(op: FamilyOp) -> Callable:
    def kernel(*arguments):
        if op.host:  # FlashInfer's host code through cuda:0's module when there is one, else the reference
            namespace = _first_loaded_namespace()
            return op.reference(*arguments) if namespace is None else op.via_flashinfer(namespace, *arguments)
        device = arguments[0].device
        if device.type == "cpu":
            return op.reference(*arguments)
        namespace, mode = STATE.family_modules.get(device.index, (None, None))
        if op.without_fp4 != "runs" and mode == "reference":
            return op.reference(*arguments)
        if op.without_fp4 == "refuse" and mode == "error":
            raise NoFp4KernelError(
                f"{op.name}: {device} has no FP4 kernel below SM100 (its outputs would be uninitialized memory); "
                "set FP4_DYNAMO_SHIM_FALLBACK=reference to run the reference quantizer instead")
        if namespace is None and op.without_fp4 != "flashinfer":
            raise ShimError(f"fp4_dynamo_shim: FlashInfer has no FP4 module loaded for {device}")
        return op.via_flashinfer(namespace, *arguments)

    return kernel


# Kept alive for the life of the process: dropping the Library object would unregister the ops.
_LIBRARY = oplib.library(NAMESPACE)
for _op in OPS:
    # FlashInfer copies a host op's inputs to the CPU itself: any mix of CPU and GPU tensors is its input.
    oplib.define(_LIBRARY, _op.schema, {
        "CPU": _make_kernel(_op),
        "CUDA": _make_kernel(_op) if _op.host else _screened(_op, _make_kernel(_op), fake=False),
    }, _screened(_op, _op.fake, fake=True))


def op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name).default
