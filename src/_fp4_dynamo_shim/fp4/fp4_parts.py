"""The FP4 layer's parts, as FlashInfer's sources define them: what an untested release is compared on.

Each part is left as FlashInfer's where the installed sources differ from the newest tested release's
(``release_parts``): the JIT getter (every FP4 kernel comes through it, so without it the whole layer stays
FlashInfer's), ``fp4_quantize`` itself, and each family member on its own.
"""

from __future__ import annotations

from typing import List, Optional

from ..sources import Part, Sources, call_arguments
from .family import Member
from .fp4_releases import JIT_ENTRY, QUANTIZE_CLOSURE, Target

JIT_GETTER = "get_fp4_quantization_module"
#: The getter's namespace entries the shim calls (kernels.jit_module_of, family_ops).
GETTER_ENTRIES = (
    QUANTIZE_CLOSURE, "block_scale_interleave_sm100", "e2m1_and_ufp8sf_scale_to_float_sm100",
    "fp4_batched_quantize_sm100", "mxfp4_dequantize_host", "scaled_fp4_grouped_quant_sm100",
    "silu_and_mul_scaled_nvfp4_experts_quantize_sm100",
)
#: Names of the getter's module the shim binds (the 4over6 recipe, the scale-factor layouts, FlashInfer's op).
MODULE_NAMES = ("SfLayout", "resolve_nvfp4_4over6", "nvfp4_4over6_code", "nvfp4_4over6_from_code")


def member_module(member: Member, target: Target) -> str:
    return target.module if member.module == "fp4" else member.module


def parts(target: Target, members: List[Member]) -> List[Part]:
    """The JIT getter first (the others need it), then ``fp4_quantize``, then each family member once."""
    found = [Part(JIT_GETTER, target.module, JIT_GETTER, names=MODULE_NAMES, returns=GETTER_ENTRIES),
             Part("fp4_quantize", target.module, "fp4_quantize")]
    for member in members:
        if member.name not in [part.name for part in found]:
            found.append(Part(member.name, member_module(member, target), member.name))
    return found


def kernel_arguments_difference(sources: Sources, target: Target) -> Optional[str]:
    """Whether the getter's closure still calls the JIT entry with the row's scalar arguments, in order."""
    located = sources.definition(target.module, JIT_GETTER)
    if located is None:
        return None  # said as the getter's absence

    arguments = call_arguments(located[1], QUANTIZE_CLOSURE, JIT_ENTRY)
    if arguments is None:
        return f"{QUANTIZE_CLOSURE} no longer calls the JIT entry {JIT_ENTRY}"
    if tuple(arguments[4:]) != target.kernel_args:
        return (f"the JIT entry {JIT_ENTRY} is called with ({', '.join(arguments[4:])}) after the four tensors, "
                f"the row has ({', '.join(target.kernel_args)})")
    return None
