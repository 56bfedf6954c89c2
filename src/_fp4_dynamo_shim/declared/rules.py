"""What the declared-ops layer does with each kind of FlashInfer declaration: the gate's groups, the
declarations it leaves to other layers or out of scope (with the reason), the fakes the shim writes; and, from the
attention table, what FlashInfer's attention getters take and their run functions write where the source does not say it.

Data, read by ``declared_ops``; a FlashInfer release that changes any of it changes a record here.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Dict, Optional, Tuple

import torch

from .. import oplib
from . import adapters
from . import attention_table

#: The declared functions SGLang's traced paths call raw: on under the default gate.
#: (module, op name after ``flashinfer::``) -> the SGLang call that reaches it.
SGLANG = {
    ("flashinfer.norm", "layernorm"): "NSA indexer's LayerNorm (sglang 0.5.9-0.5.12)",
    ("flashinfer.norm", "rmsnorm_quant"): "FP8 per-tensor RMSNorm with tc_piecewise (sglang 0.5.19-0.5.21)",
    ("flashinfer.fused_moe.fused_routing_dsv3", "NoAuxTc"): "fused_topk_deepseek (sglang 0.5.9, no shared-expert fusion)",
}

#: What became of a declaration (status()["flashinfer_ops"]["counts"] counts each).
REGISTERED, GATED_OFF, FP4_LAYER, WRAPPER_OP, OUT_OF_SCOPE, FLASHINFER_OWN, NOT_EXPRESSIBLE, FAILED = (
    "registered", "off under the gate", "covered by the FP4 layer", "covered by a wrapper's op", "out of scope",
    "FlashInfer's own op", "not expressible", "failed")
KINDS = (REGISTERED, GATED_OFF, FP4_LAYER, WRAPPER_OP, OUT_OF_SCOPE, FLASHINFER_OWN, NOT_EXPRESSIBLE, FAILED)

#: The getter the FP4 layer owns (it builds the module when it applies; ``family_ops`` carries its functions).
FP4_GETTER = "get_fp4_quantization_module"
#: Declared names inside it that the FP4 family's ops already cover.
FP4_FAMILY = frozenset({
    "fp4_quantize_sm100", "fp4_batched_quantize_sm100", "block_scale_interleave_sm100",
    "e2m1_and_ufp8sf_scale_to_float_sm100", "mxfp4_dequantize_host", "scaled_fp4_grouped_quant_sm100",
    "silu_and_mul_scaled_nvfp4_experts_quantize_sm100",
})


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """Declarations left alone on purpose: those whose module starts with ``module`` (and, if given,
    sit in ``getter``), for ``reason``."""

    module: str
    reason: str
    getter: Optional[str] = None

    def matches(self, module: str, getter: Optional[str]) -> bool:
        inside = module == self.module or module.startswith(self.module + ".")
        return inside and (self.getter is None or self.getter == getter)


EXCLUSIONS = (
    Exclusion("flashinfer.comm", "distributed communication (process groups, IPC handles, shared workspaces): "
                                 "outside a single-GPU traced region; out of scope"),
)


#: Declarations whose kernel writes its output through device addresses the caller computed before the call (the
#: ``y_data`` pointer table), not through the tensor FlashInfer declares written, which the kernel never receives.
#: A functionalized graph hands the op a copy of that tensor while the kernel writes the original, then copies the
#: untouched copy back: the result is lost (measured on CPU with a stand-in kernel under aot_eager; Inductor kept it
#: only because it re-used the buffer). (module, declared name) -> the tensor declared in the output's place.
#: They stay listed so unless the wrapper method that computes the addresses becomes one op (SEGMENT_GEMM_WRAPPER).
WRITES_THROUGH_ADDRESSES = {("flashinfer.gemm.gemm_base", "cutlass_segment_gemm"): "y",
                            ("flashinfer.gemm.gemm_base", "cutlass_segment_gemm_sm90"): "y"}

#: The class whose ``run`` computes those addresses from its ``out`` and calls either declaration, in the declaring
#: module: ``declared/segment_gemm.py`` makes the whole run one op, which covers both (WRAPPER_OP).
SEGMENT_GEMM_WRAPPER = "SegmentGEMMWrapper"


def excluded(module: str, getter: Optional[str], name: Optional[str]) -> Optional[Tuple[str, str]]:
    """(kind, reason) for a declaration left alone by rule, or None."""
    if (module, name) in WRITES_THROUGH_ADDRESSES:
        declared = WRITES_THROUGH_ADDRESSES[(module, name)]
        return NOT_EXPRESSIBLE, (f"its kernel writes the output through addresses computed before the call, not "
                                 f"through {declared}, which it never receives: a compiled graph that copies {declared} "
                                 "loses the result")
    if getter == FP4_GETTER:
        if name in FP4_FAMILY:
            return FP4_LAYER, "covered by the FP4 layer, which makes each FP4 family function one op of its own"
        return FP4_LAYER, (f"in {FP4_GETTER}, the JIT module the FP4 layer builds: not registered "
                           "twice; not part of the FP4 family either")
    for exclusion in EXCLUSIONS:
        if exclusion.matches(module, getter):
            return OUT_OF_SCOPE, exclusion.reason
    return None


def _samples(probs, indices=None, **_):
    """A sampling function's result: one index per row (or per ``indices`` entry), in ``indices``' dtype."""
    batch = indices.size(0) if indices is not None else probs.size(0)
    return torch.empty(batch, dtype=indices.dtype if indices is not None else torch.int32, device=probs.device)


def _trtllm_moe_result(hidden_states, top_k, do_finalize=True, output=None, routing_logits=None, **_):
    """A trtllm fused-MoE op's result as the function builds it (0.5.3-0.6.7.post2): finalized, ``[output]``, bf16
    rows of the hidden size (twice the packed width for FP4 bytes) or the caller's ``output`` width; otherwise the
    expert rows (routing decides how many: an unbacked size), the (tokens, top_k) weights in the routing logits'
    dtype and the int32 token-to-row map, the contract FlashInfer's own later fake states (0.7.4
    ``fused_moe/shared/inputs.py``). A new tensor even where the function hands back the caller's ``output``."""
    tokens, width = hidden_states.size(0), hidden_states.size(-1) * (2 if hidden_states.dtype == torch.uint8 else 1)
    if do_finalize:
        width = output.size(1) if output is not None else width
        return [hidden_states.new_empty((tokens, width), dtype=torch.bfloat16)]
    rows = torch.library.get_ctx().new_dynamic_size()
    weights = routing_logits.dtype if routing_logits is not None else torch.bfloat16
    return [hidden_states.new_empty((rows, width), dtype=torch.bfloat16),
            hidden_states.new_empty((tokens, top_k), dtype=weights),
            hidden_states.new_empty((tokens * top_k,), dtype=torch.int32)]


#: Fakes the shim writes where FlashInfer declared a function that returns a value but wrote no fake, or wrote
#: one that cannot be called with the function's arguments (its parameters drifted from the function's):
#: (module, declared name) -> a function taking the declared function's arguments by keyword. Each is
#: checked by the GPU tests' opcheck (tests/gpu/test_gpu_declared.py).
DERIVED_FAKES = {
    ("flashinfer.sampling", "min_p_sampling_from_probs"): _samples,  # 0.5.3-0.6.3 (0.6.7 wrote the same)
    # 0.5.3-0.6.7.post2: the fakes name local_num_experts where the functions take num_local_experts, and
    # bf16's (0.6.7) expert_indices for topk_ids and no routed_scaling_factor.
    **{("flashinfer.fused_moe.core", name): _trtllm_moe_result for name in (
        "trtllm_fp4_block_scale_moe", "trtllm_mxint4_block_scale_moe", "trtllm_bf16_moe")},
}


def _merged_states(v, s, **_):
    """merge_states' result, on ``v``'s device."""
    seq_len, _, num_heads, head_dim = v.size()
    return (torch.empty(seq_len, num_heads, head_dim, dtype=v.dtype, device=v.device),
            torch.empty(seq_len, num_heads, dtype=torch.float32, device=v.device))


@dataclasses.dataclass(frozen=True)
class ReplacedFake:
    """A fake FlashInfer wrote wrong, replaced by the shim's while FlashInfer's text still shows the fault."""

    fake: object
    #: Says, from the text of FlashInfer's fake, whether it is still the wrong one.
    still_wrong: object
    fault: str


def _prims_ts_moe_result(hidden_states, top_k, do_finalize=True, output=None, routing_logits=None,
                         expert_weights=None, **_):
    """prims_ts' bf16 MoE result: the trtllm MoE contract (it runs that launcher), with the caller's precomputed
    weights' shape and dtype where it returns them (no routing logits, weights given)."""
    result = _trtllm_moe_result(hidden_states, top_k, do_finalize, output, routing_logits)
    if not do_finalize and routing_logits is None and expert_weights is not None and expert_weights.numel() > 0:
        result[1] = torch.empty_like(expert_weights)
    return result


#: (module, declared name) -> ReplacedFake. Found by opcheck on the H200 (tests/gpu/test_gpu_declared.py):
#: FlashInfer's merge_states fake allocates on the default device, so a compiled graph's fake outputs are
#: CPU tensors next to CUDA ones (0.5.3-0.7.4, the same text in every release).
REPLACED_FAKES = {
    ("flashinfer.cascade", "merge_states"): ReplacedFake(
        _merged_states, lambda source: "device=" not in source, "FlashInfer's allocates on the default device"),
    # 0.7.4: unfinalized, FlashInfer's fake returns (tokens, hidden) rows and an empty tensor; the function returns
    # the launcher's three (routing-sized rows, weights, token map), as the padded return's marker then says.
    ("flashinfer.fused_moe.backends.prims_ts.bf16_op", "prims_ts_bf16_moe"): ReplacedFake(
        _prims_ts_moe_result, lambda source: "new_empty(0)" in source,
        "FlashInfer's returns two tensors where the unfinalized function returns three"),
}


# --- attention ------------------------------------------------------------------------------------------------
# FlashInfer's attention getters take ``*args`` (``get_single_decode_module(*args)``) or leave ``backend``
# unannotated (``get_single_prefill_module(backend, *args)``), so their nested run functions cannot become ops
# from the declarations alone: the per-release table (``attention_table``, generated from each release's Python
# and C++ sources by tools/attention_table.py) gives each getter's real parameters (those of the ``gen_*``
# function it forwards them to). Single decode's ``mutates_args=("tmp", "o")`` leaves out ``maybe_lse``, which
# its C++ run function writes: the table's written tensors are added to what FlashInfer declared.

#: The attention entry points whose public function calls its getter itself, inside the region a user compiles: the
#: getter's polyfill reaches their run there. The wrappers call theirs in ``plan()``, outside it, and their
#: ``run`` reaches the module ``plan()`` cached: a getter polyfill never sees it.
ATTENTION_TRACED = ("single_decode", "single_prefill")

#: The stateful wrappers (entry point -> module, class) whose ``run`` reaches the module ``plan()`` cached on the
#: wrapper: ``declared/wrappers.py`` polyfills that module's run functions once ``plan()`` has built it, and carries
#: the plan's int list (``plan_info_vec``, the table's ``l`` kind) to the op as a CPU int64 tensor, so that a new plan
#: is a new argument, not a guard. trtllm-gen's decode module is one of them: its getter's ``*args`` are the
#: parameters of the uri function it forwards them to, which the table records as for the others.
ATTENTION_WRAPPED = {
    "batch_decode_paged": ("flashinfer.decode", "BatchDecodeWithPagedKVCacheWrapper"),
    "batch_prefill_paged": ("flashinfer.prefill", "BatchPrefillWithPagedKVCacheWrapper"),
    "batch_prefill_ragged": ("flashinfer.prefill", "BatchPrefillWithRaggedKVCacheWrapper"),
    # Defined in flashinfer.mla (0.5.3-0.6.7.post2) or flashinfer.mla._core (0.6.8.post1 on), which the package
    # re-exports: the class is one object either way.
    "mla_paged": ("flashinfer.mla", "BatchMLAPagedAttentionWrapper"),
}


def _function(row: dict) -> str:
    """The name a row's run goes by in its getter's result: its Python def's, or where the getter returns the built
    module (``run=None``: the parameters were read from the C++ function) the module's attribute."""
    return row["run"] or row["entry"]


def _attention_row(release: Optional[str], getter: str, run: str) -> Optional[dict]:
    for key in attention_table.RELEASES.get(release, ()):
        row = attention_table.ROWS[key]
        if row["getter"] != getter or _function(row) != run:
            continue
        if set(row["entry_points"]) & (set(ATTENTION_TRACED) | set(ATTENTION_WRAPPED)):
            return row
    return None


def attention_getter_signature(release: Optional[str], module, getter: str, run: str) -> Optional[inspect.Signature]:
    """The parameters ``getter`` of ``module`` really takes (for ``run``), or None where the table has no row:
    compiled from the table's text in the module's globals, where FlashInfer's annotations resolve."""
    row = _attention_row(release, getter, run)
    if row is None:
        return None
    local = oplib.run_source(f"def {getter}({row['getter_parameters']}): pass", f"<attention_table {release}>",
                             module.__dict__, {})
    return inspect.signature(local[getter], eval_str=True)


def kinds(row: dict) -> list:
    """(name, kind, marks) of each of a row's run parameters: the kind's letter, then its marks (``?`` optional,
    ``t`` read only under the trtllm-gen backend)."""
    return [(name, kind[0], kind[1:]) for name, kind in (p.split(":") for p in row["parameters"].split())]


def attention_written(release: Optional[str], getter: str, run: str) -> Tuple[str, ...]:
    """The tensors ``run`` writes in place, per the table (FlashInfer's ``mutates_args`` and the C++ writes)."""
    row = _attention_row(release, getter, run)
    return () if row is None else tuple(name for name, kind, _ in kinds(row) if kind == "w")


def attention_carried(release: Optional[str], getter: str, run: str) -> Dict[str, adapters.Adapter]:
    """``run``'s parameters the op carries in a form of its own, by the table's facts rather than FlashInfer's
    annotation: the int lists (the plan's ``plan_info_vec``) as a tensor (PLAN_TENSOR), the user's KV cache
    (KV_CACHE)."""
    row = _attention_row(release, getter, run)
    if row is None:
        return {}
    return {**{name: KV_CACHE for name, _, _ in kinds(row) if name == "paged_kv_cache"},
            **{name: PLAN_TENSOR for name, kind, _ in kinds(row) if kind == "l"},
            **{name: TRTLLM_GEN_ONLY for name, _, marks in kinds(row) if "t" in marks}}


#: An int list that changes with every plan, carried as a CPU int64 tensor: Dynamo guards a tensor's shape, not its
#: values, so a new plan of the same length is a new argument, not a recompile. The wrappers' plan leaves that tensor
#: (``declared/wrappers.py``); any other list is made one while tracing (its values then are constants). The fake
#: keeps the tensor: FlashInfer's fakes of these run functions do not read it.
#: trtllm-gen's decode plan is None (its kernel reads no plan): None crosses as None.
PLAN_TENSOR = adapters.Adapter("int list carried as a tensor", (("", Optional[torch.Tensor]),),
                               "_plan_tensor({n})", "None if {n} is None else {n}.tolist()")

#: trtllm-gen decode's ``paged_kv_cache``, annotated ``Optional[torch.Tensor]``, is the decode wrapper's ``run()``
#: argument as the user gave it: one tensor or a (k, v) pair, which no schema type holds. Its kernel only checks
#: that it is given; the pair crosses as its two tensors (a list given comes back a tuple).
KV_CACHE = adapters.Adapter("a KV cache: one tensor or a (k, v) pair",
                            (("", Optional[torch.Tensor]), ("__v", Optional[torch.Tensor])),
                            "{n}[0] if isinstance({n}, (tuple, list)) else {n}, "
                            "{n}[1] if isinstance({n}, (tuple, list)) else None",
                            "{n} if {n}__v is None else ({n}, {n}__v)")


#: A parameter the run reads only where the getter's backend is trtllm-gen (the table's ``t`` mark): under
#: another backend the op takes None there, whatever the caller passed, since FlashInfer never reads it. FlashInfer
#: 0.5.3-0.6.8.post1's tensor-core decode passes its KV cache, and the values after it, one place late into these
#: (a (k, v) pair where ``num_qo_heads`` is): no schema holds that, and fa2 and fa3 read none of it.
TRTLLM_GEN_ONLY = adapters.Adapter("read only under the trtllm-gen backend", (("", None),),
                                   "{n} if {backend} == 'trtllm-gen' else None", "{n}")


def attention_wrapped_getters(release: Optional[str], entry_point: str) -> set:
    """The getters whose modules ``entry_point``'s wrapper caches in plan() and whose rows the layer builds from."""
    return {attention_table.ROWS[key]["getter"] for key in attention_table.RELEASES.get(release, ())
            if entry_point in attention_table.ROWS[key]["entry_points"] and _attention_row(
                release, attention_table.ROWS[key]["getter"], _function(attention_table.ROWS[key])) is not None}


def attention_built_modules(release: Optional[str]) -> Dict[str, str]:
    """Wrapped entry point -> its row's key, for each run the table read from C++ alone (``run=None``): the getter
    returns the built module, whose run has no Python def to declare an op from (``declared/built_modules.py``)."""
    found = {}
    for key in attention_table.RELEASES.get(release, ()):
        row = attention_table.ROWS[key]
        if row["run"] is None:
            found.update({entry_point: key for entry_point in row["entry_points"] if entry_point in ATTENTION_WRAPPED})
    return found
