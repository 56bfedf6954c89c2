"""FlashInfer's public FP4 functions under fullgraph, one entry per function and release range.

Each :class:`Member`'s ``implement`` maps the caller's arguments onto the ops in ``family_ops`` (or onto
the shim's ``fp4_quantize``), or says why it cannot (:class:`Unsupported`): eager calls then go to
FlashInfer's original, compiled ones raise :class:`NotExpressibleError`.

Replacements get the installed function's exact signature (``replacement.build_forwarding``) and are rebound
by identity, like ``fp4_quantize`` (so ``nvfp4_block_scale_interleave``, which *is*
``block_scale_interleave``, follows automatically).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import torch
from packaging.specifiers import SpecifierSet

from . import replacement
from ..errors import InvalidArgumentError, NotExpressibleError
from ..versions import SUPPORTED_FLASHINFER, rows_for
from .family_ops import experts_views, op


class Unsupported:
    """What ``implement`` returns for arguments no op can carry; ``reason`` names them."""

    def __init__(self, reason: str):
        self.reason = reason


class Context:
    """What ``implement`` functions need from the installed FlashInfer, resolved at apply time."""

    def __init__(self, fp4_module, fp4_quantize, recipe):
        self.fp4_quantize = fp4_quantize  # the shim's replacement (op under compile, fast path in eager)
        self.SfLayout = getattr(fp4_module, "SfLayout", None)
        self.recipe = recipe  # replacement.Recipe for releases with nvfp4_4over6, else None
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
    # FlashInfer copies both to the CPU; meta tensors, which hold nothing to copy, stay meta (the op's screen
    # refuses a meta tensor next to a real one).
    on_host = (lambda tensor: tensor if tensor.is_meta else tensor.cpu())
    return op("e2m1_and_ufp8sf_scale_to_float")(
        on_host(a_fp4).view(torch.uint8), on_host(a_sf).view(torch.uint8).reshape(-1),
        torch.ones(1, dtype=torch.float32, device="meta" if a_fp4.is_meta else "cpu"), 32, 0, swizzled, is_8x4)


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
    #: Whether the shim's version runs through its ``fp4_quantize`` (left with it where that part differs).
    through_fp4_quantize: bool = False


ALL = SUPPORTED_FLASHINFER
MEMBERS = (
    Member("nvfp4_quantize", SpecifierSet(">=0.5.3,<0.6.7"), _nvfp4_quantize(linear_layout_honoured=False),
           through_fp4_quantize=True),
    Member("nvfp4_quantize", SpecifierSet(">=0.6.7,<0.7.5"), _nvfp4_quantize(linear_layout_honoured=True),
           through_fp4_quantize=True),
    Member("mxfp4_quantize", SpecifierSet(">=0.5.3,<0.6.16"), _mxfp4_quantize(with_dead_global_scale=True),
           through_fp4_quantize=True),
    Member("mxfp4_quantize", SpecifierSet(">=0.6.16,<0.7.5"), _mxfp4_quantize(with_dead_global_scale=False),
           through_fp4_quantize=True),
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
    return rows_for(version, MEMBERS)


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


def build_replacements(version: str, fp4_module, fp4_replacement, recipe, left: dict = None):
    """{name: (original, replacement)} for each family function of this release, and a per-function report.

    A function this release lacks is reported as absent; one whose signature the shim cannot mirror, or that
    ``left`` names (name -> why), is reported and left alone (FlashInfer's own function stays in place).
    """
    context = Context(fp4_module, fp4_replacement, recipe)
    replaced, report, left = {}, {}, left or {}
    for member in members_for(version):
        if member.name in left:
            report[member.name] = f"left as FlashInfer's: {left[member.name]}"
            continue
        module_name = fp4_module.__name__ if member.module == "fp4" else member.module
        try:
            original = getattr(importlib.import_module(module_name), member.name)
        except (ImportError, AttributeError) as error:
            report[member.name] = f"absent: {error}"
            continue
        if replacement.is_shim(original):
            report[member.name] = "already a replacement"
            continue
        try:
            forwarding = replacement.build_forwarding(original, make_dispatch(member, context, original))
        except (TypeError, ValueError) as error:
            report[member.name] = f"left alone: {error}"
            continue
        replaced[member.name] = (original, forwarding)
        report[member.name] = f"op-backed ({module_name})"
    return replaced, report
