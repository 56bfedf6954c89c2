"""The rest of FlashInfer's FP4 family under fullgraph, declared as data.

Two tables:

* ``OPS``: custom ops in the ``fp4_dynamo_shim`` namespace for the kernels ``fp4_quantize``'s op does not
  cover. Each has a fake, a pure-PyTorch reference (the CPU kernel, and the GPU fallback below SM100)
  where one is reasonable, and a CUDA kernel that calls FlashInfer's own closure from the preloaded
  ``get_fp4_quantization_module`` namespace, so the JIT entry receives exactly FlashInfer's arguments and
  nothing is loaded at call time.
* ``MEMBERS``: one entry per public function and release range. Its ``implement`` maps the caller's
  arguments onto those ops (or onto the shim's ``fp4_quantize``), or says why it cannot
  (:class:`Unsupported`): eager calls then go to FlashInfer's original, compiled ones raise
  :class:`NotExpressibleError`.

Replacements get the installed function's exact signature (``wrapper.signature_source``) and are rebound
by identity, like ``fp4_quantize`` (so ``nvfp4_block_scale_interleave``, which *is*
``block_scale_interleave``, follows automatically).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Callable, Optional

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import layout, reference
from .errors import InvalidArgumentError, NoFp4KernelError, NotExpressibleError, ShimError
from .ops import NAMESPACE

#: Per CUDA device index: FlashInfer's FP4 module namespace and the fp4_quantize mode
#: ("kernel", "refuse", "reference", "launch"). Set by configure() at apply time.
_devices: dict = {}


def configure(devices: dict) -> None:
    global _devices
    _devices = devices


class Unsupported:
    """What ``implement`` returns for arguments no op can carry; ``reason`` names them."""

    def __init__(self, reason: str):
        self.reason = reason


# --- ops ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FamilyOp:
    name: str
    schema: str
    fake: Callable
    #: Pure-PyTorch kernel (CPU, and the GPU fallback), or None where there is none.
    reference: Optional[Callable]
    #: Calls FlashInfer's closure: ``(namespace, *op_args) -> outputs``.
    via_closure: Callable
    #: The CUDA kernel body exists only on SM100+ (then the fp4_quantize mode applies).
    arch_guarded: bool
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
    return torch.empty((e2m1.shape[0], e2m1.shape[1] * 2), dtype=torch.float32, device="cpu")


def _dequantize_reference(e2m1, sf, global_scale, sf_vec_size, ufp8_type, swizzled, is_8x4):
    _check_dequantize(e2m1, sf, global_scale, sf_vec_size, ufp8_type)
    return reference.e2m1_and_ufp8sf_scale_to_float(e2m1.cpu(), sf.cpu(), global_scale.cpu(), sf_vec_size,
                                                    ufp8_type, swizzled, is_8x4)


def _dequantize_closure(namespace, e2m1, sf, global_scale, sf_vec_size, ufp8_type, swizzled, is_8x4):
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


def _dequantize_host_closure(namespace, weight, scale, group_size):
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
    _no_recipe(code)
    return reference.batched_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0)


def _batched_closure(namespace, input, global_scale, sf_vec_size, sf_use_ue8m0, code):
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
    _no_recipe(code)
    return reference.experts_quantize(input, global_scale, mask, use_silu_and_mul)


#: The inverse of FlashInfer's ``permute(3, 4, 1, 5, 2, 0)`` on the scale-factor view.
_EXPERT_SF_UNPERMUTE = (5, 2, 4, 0, 1, 3)


def _experts_closure(namespace, input, global_scale, mask, use_silu_and_mul, code):
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


def _no_recipe(code):
    if code != 0:
        raise NotImplementedError("fp4_dynamo_shim's reference quantizer does not implement the NVFP4 4over6 recipe")


# mm_fp4 -----------------------------------------------------------------------------------------------

def _mm_fp4_fake(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend, use_nvfp4,
                 enable_pdl):
    if a.dim() != 2 or b.dim() != 2:
        raise InvalidArgumentError(f"mm_fp4: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _mm_fp4_reference(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend,
                      use_nvfp4, enable_pdl):
    _mm_fp4_fake(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend, use_nvfp4,
                 enable_pdl)
    return reference.mm_fp4(a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, use_nvfp4)


def _mm_fp4_closure(namespace, a, b, a_descale, b_descale, alpha, out_dtype, block_size, use_8x4_sf_layout, backend,
                    use_nvfp4, enable_pdl):
    original = _mm_fp4_original
    if original is None:
        raise ShimError("fp4_dynamo_shim: mm_fp4 is not available")
    keywords = dict(alpha=alpha, out_dtype=out_dtype, block_size=block_size, use_8x4_sf_layout=use_8x4_sf_layout,
                    backend=backend, use_nvfp4=use_nvfp4)
    if enable_pdl is not None and _accepts(original, "enable_pdl"):
        keywords["enable_pdl"] = enable_pdl
    return original(a, b, a_descale, b_descale, **keywords)


#: FlashInfer's mm_fp4 (a black box: backend choice, autotuning, cuDNN graphs), set at apply time.
_mm_fp4_original: Optional[Callable] = None

OPS = (
    FamilyOp("block_scale_interleave", "block_scale_interleave(Tensor unswizzled_sf) -> Tensor",
             _interleave_fake, _interleave_reference,
             lambda namespace, sf: namespace.block_scale_interleave_sm100(sf), arch_guarded=False),
    FamilyOp("e2m1_and_ufp8sf_scale_to_float",
             "e2m1_and_ufp8sf_scale_to_float(Tensor e2m1, Tensor sf, Tensor global_scale, int sf_vec_size, "
             "int ufp8_type, bool is_sf_swizzled_layout, bool is_sf_8x4_layout) -> Tensor",
             _dequantize_fake, _dequantize_reference, _dequantize_closure, arch_guarded=False, host=True),
    FamilyOp("mxfp4_dequantize_host", "mxfp4_dequantize_host(Tensor weight, Tensor scale, int group_size) -> Tensor",
             _dequantize_host_fake, _dequantize_host_reference, _dequantize_host_closure, arch_guarded=False,
             host=True),
    FamilyOp("fp4_batched_quantize",
             "fp4_batched_quantize(Tensor input, Tensor global_scale, int sf_vec_size, bool sf_use_ue8m0, "
             "int nvfp4_4over6_code) -> (Tensor, Tensor)",
             _batched_fake, _batched_reference, _batched_closure, arch_guarded=True),
    FamilyOp("fp4_experts_quantize",
             "fp4_experts_quantize(Tensor input, Tensor global_scale, Tensor mask, bool use_silu_and_mul, "
             "int nvfp4_4over6_code) -> (Tensor, Tensor)",
             _experts_fake, _experts_reference, _experts_closure, arch_guarded=True),
    FamilyOp("mm_fp4",
             "mm_fp4(Tensor a, Tensor b, Tensor a_descale, Tensor b_descale, Tensor? alpha, ScalarType out_dtype, "
             "int block_size, bool use_8x4_sf_layout, str backend, bool use_nvfp4, bool? enable_pdl) -> Tensor",
             _mm_fp4_fake, _mm_fp4_reference, _mm_fp4_closure, arch_guarded=False),
)


def _first_loaded_namespace():
    for entry in _devices.values():
        if entry[0] is not None:
            return entry[0]
    return None


def _make_kernel(op: FamilyOp) -> Callable:
    def kernel(*arguments):
        if op.host:  # FlashInfer's host code through cuda:0's module when there is one, else the reference
            namespace = _first_loaded_namespace()
            return op.reference(*arguments) if namespace is None else op.via_closure(namespace, *arguments)
        first = arguments[0]
        if first.device.type == "cpu":
            if op.reference is None:
                raise NotImplementedError(f"fp4_dynamo_shim: {op.name} has no CPU implementation; it needs a GPU")
            return op.reference(*arguments)
        namespace, mode = _devices.get(first.device.index, (None, None))
        if op.arch_guarded and mode == "reference":
            return op.reference(*arguments)
        if op.arch_guarded and mode == "refuse":
            raise NoFp4KernelError(
                f"{op.name}: {first.device} has no FP4 kernel below SM100 (its outputs would be uninitialized "
                "memory); set FP4_DYNAMO_SHIM_FALLBACK=reference to run the reference quantizer instead")
        if namespace is None and op.name != "mm_fp4":
            raise ShimError(f"fp4_dynamo_shim: FlashInfer has no FP4 module loaded for {first.device}")
        return op.via_closure(namespace, *arguments)

    return kernel


# Kept alive for the life of the process: dropping the Library object would unregister the ops.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
for _op in OPS:
    _LIBRARY.define(_op.schema)
    _LIBRARY.impl(_op.name, _make_kernel(_op), "CPU")
    _LIBRARY.impl(_op.name, _make_kernel(_op), "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{_op.name}", _op.fake, lib=_LIBRARY)


def op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name).default


# --- members: public functions x release ranges ------------------------------------------------------


class Context:
    """What ``implement`` functions need from the installed FlashInfer, resolved at apply time."""

    def __init__(self, fp4_module, fp4_quantize, recipe):
        self.fp4_quantize = fp4_quantize  # the shim's replacement (op under compile, fast path in eager)
        self.SfLayout = getattr(fp4_module, "SfLayout", None)
        self.recipe = recipe  # wrapper.Recipe for releases with nvfp4_4over6, else None
        self.cuda = torch.cuda.is_available()


def _recipe_code(context, arguments, input):
    if "nvfp4_4over6" not in arguments or context.recipe is None:
        return 0
    return context.recipe.code(arguments["nvfp4_4over6"], input, 16, False, torch.compiler.is_compiling())


def _to_cuda(context, tensor):
    # FlashInfer moves these inputs to the current CUDA device; with no GPU the shim keeps them where they are.
    return tensor.cuda() if context.cuda else tensor


def _unsupported_options(arguments, **unsupported_values):
    for name, allowed in unsupported_values.items():
        if name in arguments and arguments[name] not in allowed and arguments[name] is not None:
            return Unsupported(f"{name}={arguments[name]!r}")
    return None


def _nvfp4_quantize(linear_layout_honoured: bool):
    def implement(context, arguments):
        blocked = _unsupported_options(arguments, backend=("cuda", "auto"), do_shuffle=(False,),
                                       per_token_activation=(False,), batch_invariant=(False,))
        if blocked is None and (arguments.get("out_scale") is not None
                                or arguments.get("expanded_idx_to_permuted_idx") is not None):
            blocked = Unsupported("per-token arguments")
        if blocked is not None:
            return blocked
        sf_layout = arguments["sfLayout"]
        swizzled = sf_layout != context.SfLayout.layout_linear if linear_layout_honoured else True
        keywords = {}
        if "nvfp4_4over6" in arguments:
            keywords["nvfp4_4over6"] = arguments["nvfp4_4over6"]
        return context.fp4_quantize(
            _to_cuda(context, arguments["a"]), _to_cuda(context, arguments["a_global_sf"]), arguments["sf_vec_size"],
            sf_use_ue8m0=False, is_sf_swizzled_layout=swizzled,
            is_sf_8x4_layout=sf_layout == context.SfLayout.layout_8x4, enable_pdl=arguments["enable_pdl"], **keywords,
        )

    return implement


def _mxfp4_quantize(with_dead_global_scale: bool):
    def implement(context, arguments):
        blocked = _unsupported_options(arguments, backend=("cuda", "auto"), batch_invariant=(False,))
        if blocked is not None:
            return blocked
        a = arguments["a"]
        if with_dead_global_scale:  # computed and passed as FlashInfer does; the UE8M0 kernel never reads it
            global_scale = (448 * 6) / a.float().abs().nan_to_num().max()
            return context.fp4_quantize(_to_cuda(context, a), _to_cuda(context, global_scale), 32, True, True)
        sf_layout = context.SfLayout(arguments["sfLayout"])
        return context.fp4_quantize(
            _to_cuda(context, a), global_scale=None, sf_vec_size=32, sf_use_ue8m0=True,
            is_sf_swizzled_layout=sf_layout != context.SfLayout.layout_linear,
            is_sf_8x4_layout=sf_layout == context.SfLayout.layout_8x4,
        )

    return implement


def _block_scale_interleave(dtypes):
    def implement(context, arguments):
        if arguments.get("out") is not None:
            return Unsupported("out=...")
        sf = arguments["unswizzled_sf"]
        if sf.dtype not in dtypes:
            raise InvalidArgumentError(f"block_scale_interleave: input dtype must be {' or '.join(map(str, dtypes))}, "
                                       f"got {sf.dtype}")
        return op("block_scale_interleave")(sf)

    return implement


def _e2m1_and_ufp8sf_scale_to_float(context, arguments):
    global_scale = arguments["global_scale_tensor"]
    if global_scale is None:
        raise InvalidArgumentError("e2m1_and_ufp8sf_scale_to_float: global_scale_tensor is required")
    return op("e2m1_and_ufp8sf_scale_to_float")(
        arguments["e2m1_tensor"], arguments["ufp8_scale_tensor"], global_scale, arguments["sf_vec_size"],
        arguments["ufp8_type"], arguments["is_sf_swizzled_layout"], arguments.get("is_sf_8x4_layout", False))


def _mxfp4_dequantize(context, arguments):
    a_fp4, a_sf = arguments["a_fp4"], arguments["a_sf"]
    if "sfLayout" in arguments:
        sf_layout = context.SfLayout(arguments["sfLayout"])
        swizzled = sf_layout != context.SfLayout.layout_linear
        is_8x4 = sf_layout == context.SfLayout.layout_8x4
    else:
        swizzled, is_8x4 = True, False
    return op("e2m1_and_ufp8sf_scale_to_float")(
        a_fp4.cpu().view(torch.uint8), a_sf.cpu().view(torch.uint8).reshape(-1),
        torch.ones(1, dtype=torch.float32), 32, 0, swizzled, is_8x4)


def _mxfp4_dequantize_host(context, arguments):
    return op("mxfp4_dequantize_host")(arguments["weight"], arguments["scale"], arguments["group_size"])


def _nvfp4_batched_quantize(per_row_global_scale: bool):
    def implement(context, arguments):
        a, global_scale = arguments["a"], arguments["a_global_sf"]
        if not per_row_global_scale and global_scale.numel() != 1:
            raise InvalidArgumentError("nvfp4_batched_quantize: global scale must have one element in this release")
        return op("fp4_batched_quantize")(a, global_scale, arguments["sf_vec_size"], False,
                                          _recipe_code(context, arguments, a))

    return implement


def _experts(use_silu_and_mul: bool):
    def implement(context, arguments):
        a = arguments["a"]
        values, scales = op("fp4_experts_quantize")(a, arguments["a_global_sf"], arguments["mask"], use_silu_and_mul,
                                                    _recipe_code(context, arguments, a))
        return experts_views(values, scales)

    return implement


def _mm_fp4(context, arguments):
    blocked = _unsupported_options(arguments, batch_invariant=(False,))
    if blocked is None and arguments.get("out") is not None:
        blocked = Unsupported("out=...")
    if blocked is not None:
        return blocked
    return op("mm_fp4")(arguments["a"], arguments["b"], arguments["a_descale"], arguments["b_descale"],
                        arguments["alpha"], arguments["out_dtype"], arguments["block_size"],
                        arguments["use_8x4_sf_layout"], arguments["backend"], arguments["use_nvfp4"],
                        arguments.get("enable_pdl"))


@dataclasses.dataclass(frozen=True)
class Member:
    name: str
    versions: SpecifierSet
    implement: Callable
    #: Defining module: "fp4" (where fp4_quantize lives in this release) or a dotted path.
    module: str = "fp4"


ALL = SpecifierSet(">=0.5.3,<0.7.5")
MEMBERS = (
    Member("nvfp4_quantize", SpecifierSet(">=0.5.3,<0.6.7"), _nvfp4_quantize(linear_layout_honoured=False)),
    Member("nvfp4_quantize", SpecifierSet(">=0.6.7,<0.7.5"), _nvfp4_quantize(linear_layout_honoured=True)),
    Member("mxfp4_quantize", SpecifierSet(">=0.5.3,<0.6.16"), _mxfp4_quantize(with_dead_global_scale=True)),
    Member("mxfp4_quantize", SpecifierSet(">=0.6.16,<0.7.5"), _mxfp4_quantize(with_dead_global_scale=False)),
    Member("block_scale_interleave", SpecifierSet(">=0.5.3,<0.6.0"), _block_scale_interleave((torch.uint8,))),
    Member("block_scale_interleave", SpecifierSet(">=0.6.0,<0.7.5"),
           _block_scale_interleave((torch.uint8, torch.bfloat16))),
    Member("e2m1_and_ufp8sf_scale_to_float", ALL, _e2m1_and_ufp8sf_scale_to_float),
    Member("mxfp4_dequantize", ALL, _mxfp4_dequantize),
    Member("mxfp4_dequantize_host", ALL, _mxfp4_dequantize_host),
    Member("nvfp4_batched_quantize", SpecifierSet(">=0.5.3,<0.6.11.post1"),
           _nvfp4_batched_quantize(per_row_global_scale=False)),
    Member("nvfp4_batched_quantize", SpecifierSet(">=0.6.11.post1,<0.7.5"),
           _nvfp4_batched_quantize(per_row_global_scale=True)),
    Member("scaled_fp4_grouped_quantize", ALL, _experts(use_silu_and_mul=False)),
    Member("silu_and_mul_scaled_nvfp4_experts_quantize", ALL, _experts(use_silu_and_mul=True),
           module="flashinfer.activation"),
    Member("mm_fp4", ALL, _mm_fp4, module="flashinfer.gemm"),
)


def members_for(version: str):
    release = Version(Version(version).public)
    return [m for m in MEMBERS if m.versions.contains(release, prereleases=True)]


def make_dispatch(member: Member, context: Context, original: Callable) -> Callable:
    implement = member.implement

    def dispatch(**arguments):
        result = implement(context, arguments)
        if isinstance(result, Unsupported):
            if torch.compiler.is_compiling():
                raise NotExpressibleError(
                    f"fp4_dynamo_shim: {member.name}({result.reason}) cannot run inside torch.compile: no custom "
                    "op carries it. Call it outside the compiled region."
                )
            return original(**arguments)
        return result

    return dispatch


def build_replacements(version: str, fp4_module, fp4_replacement, recipe):
    """(original, replacement) for each family function of this release, and a per-function report.

    A function this release lacks is reported as absent; one whose signature the shim cannot mirror is
    reported and left alone (FlashInfer's own function stays in place).
    """
    from . import wrapper

    global _mm_fp4_original
    context = Context(fp4_module, fp4_replacement, recipe)
    pairs, report = [], {}
    for member in members_for(version):
        module_name = fp4_module.__name__ if member.module == "fp4" else member.module
        try:
            original = getattr(importlib.import_module(module_name), member.name)
        except (ImportError, AttributeError) as error:
            report[member.name] = f"absent: {error}"
            continue
        if wrapper.is_shim(original):
            report[member.name] = "already a replacement"
            continue
        try:
            replacement = wrapper.build_forwarding(original, make_dispatch(member, context, original))
        except (TypeError, ValueError) as error:
            report[member.name] = f"left alone: {error}"
            continue
        if member.name == "mm_fp4":
            _mm_fp4_original = original
        pairs.append((original, replacement))
        report[member.name] = f"op-backed ({module_name})"
    return pairs, report
