"""P1 for FlashInfer's declared ops: eager per-call cost of a norm, a rope, an activation and a
sampling function with every declared op turned on, against FlashInfer alone, a dispatcher op and the floor;
and of the attention functions and wrappers (fa2; the wrappers' ``run()`` and ``plan()``) and
``SegmentGEMMWrapper.run`` (sm80), against FlashInfer alone (M is the batch, the number of segments, or for the
single functions the key count over 64).

Columns (microseconds per call, same inputs, same kernel):

* ``flashinfer``: FlashInfer's public function, the shim reverted for that candidate's turn of each round;
* ``shim``: the same function with the shim applied and FP4_DYNAMO_SHIM_FLASHINFER_OPS=all (the layer leaves
  FlashInfer's function objects in place, so this is FlashInfer's own eager path);
* ``custom_op``: FlashInfer's declared function wrapped by ``torch.library.custom_op`` with its own
  ``mutates_args``, what FlashInfer's decorators would cost turned on (FlashInfer registers none of these);
* ``shim_op``: the shim's op through the dispatcher (``torch.ops.fp4_dynamo_shim_flashinfer.<name>``), what
  a compiled graph calls;
* ``floor``: the output allocation plus the JIT module's entry (for the sampling function: its declared nested
  function, i.e. the JIT call with FlashInfer's argument conversions).

Rounds alternate between candidates (each round also reverts the shim once, for the ``flashinfer`` column);
ratios are medians of per-round ratios. ``--control`` reverts the shim for the whole round, so both columns
are FlashInfer's: their ratio is what the benchmark's order (a round's first turn against its last) makes of no
difference at all (only for functions timed alone: the attention rows); ``--alternate`` times FlashInfer's turn
first in every other round (built and planned with the shim reverted), so that the order's bias cancels.

    python benchmarks/p1_declared.py [--save] [--control] [--alternate]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ["FP4_DYNAMO_SHIM_FLASHINFER_OPS"] = "all"

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  (the layer registers its ops when torch._dynamo is imported)

import fp4_dynamo_shim  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from common import add_save_option, environment, median_ratio, now, table, timed, write  # noqa: E402


def _op(name):
    return getattr(torch.ops.fp4_dynamo_shim_flashinfer, name).default


def _custom_op(name, function, mutates):
    return torch.library.custom_op(f"p1_declared::{name}", mutates_args=mutates)(function)


def rmsnorm(tokens, hidden):
    import flashinfer.norm as norm

    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    pdl = norm.device_support_pdl(x.device)
    jit, op, wrapped = norm.get_norm_module(), _op("rmsnorm"), _custom_op("rmsnorm", norm._rmsnorm_impl, ("out",))

    def floor():
        jit.rmsnorm(torch.empty_like(x), x, w, 1e-6, pdl)

    return {"public": lambda: norm.rmsnorm(x, w, 1e-6),
            "custom_op": lambda: wrapped(torch.empty_like(x), x, w, 1e-6, None),
            "shim_op": lambda: op(torch.empty_like(x), x, w, 1e-6, None), "floor": floor}


def apply_rope_pos_ids(tokens, hidden):
    import flashinfer.rope as rope

    heads = hidden // 128
    q = torch.randn(tokens, heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tokens, heads, 128, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(tokens, device="cuda", dtype=torch.int32)
    jit, op = rope.get_rope_module(), _op("apply_rope_pos_ids")
    wrapped = _custom_op("apply_rope_pos_ids", rope._apply_rope_pos_ids, ("q_rope", "k_rope"))

    def floor():
        jit.apply_rope_pos_ids(q, k, torch.empty_like(q), torch.empty_like(k), pos, 128, False, 1.0, 1e4)

    return {"public": lambda: rope.apply_rope_pos_ids(q, k, pos),
            "custom_op": lambda: wrapped(q, k, torch.empty_like(q), torch.empty_like(k), pos, 128, False, 1.0, 1e4),
            "shim_op": lambda: op(q, k, torch.empty_like(q), torch.empty_like(k), pos, 128, False, 1.0, 1e4),
            "floor": floor}


def silu_and_mul(tokens, hidden):
    import flashinfer.activation as activation
    from flashinfer.jit import gen_act_and_mul_module

    x = torch.randn(tokens, 2 * hidden, device="cuda", dtype=torch.bfloat16)
    pdl = activation.device_support_pdl(x.device)
    nested = activation.get_act_and_mul_module("silu").silu_and_mul
    jit, op = gen_act_and_mul_module("silu").build_and_load(), _op("act_and_mul")
    wrapped = _custom_op("act_and_mul", nested, ("out",))

    def out():
        return torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16)

    return {"public": lambda: activation.silu_and_mul(x),
            "custom_op": lambda: wrapped(out(), x, pdl),
            "shim_op": lambda: op("silu", out(), x, pdl), "floor": lambda: jit.silu_and_mul(out(), x, pdl)}


def top_k_sampling_from_probs(tokens, hidden):
    import flashinfer.sampling as sampling

    probs = torch.softmax(torch.randn(tokens, 32000, device="cuda"), dim=-1)
    nested = sampling.get_sampling_module().top_k_sampling_from_probs
    op = _op("top_k_sampling_from_probs")
    arguments = (probs, None, None, 50, True)  # probs, indices, maybe_top_k_arr, top_k_val, deterministic, ...
    # ... then (the generator is not an op argument) seed/offset parts None, return_valid False
    padding = [False if str(a.type) == "bool" else None for a in op._schema.arguments[len(arguments):]]
    return {"public": lambda: sampling.top_k_sampling_from_probs(probs, 50),
            "shim_op": lambda: op(*arguments, *padding), "floor": lambda: nested(*arguments, None)}


def _paged_cache(batch, hidden):
    """Head counts, and ``batch`` requests of 4 pages of 16 tokens: page table and cache."""
    heads, kv_heads, pages = hidden // 128, max(1, hidden // 512), 4 * batch
    i32 = dict(dtype=torch.int32, device="cuda")
    table = (torch.arange(0, pages + 1, 4, **i32), torch.arange(pages, **i32), torch.full((batch,), 16, **i32))
    cache = torch.randn(pages, 2, 16, kv_heads, 128, device="cuda", dtype=torch.bfloat16)
    return heads, kv_heads, table, cache


def _planned(kind, batch, hidden):
    """A planned wrapper of ``kind`` over ``batch`` requests (prefill: 16 query rows each, causal), its plan()
    call and its run() call. fa2 throughout: the backend every release offers on every GPU."""
    import flashinfer

    heads, kv_heads, table, cache = _paged_cache(batch, hidden)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    dtypes = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    rows = batch if kind.startswith("batch_decode") else 16 * batch
    q = torch.randn(rows, heads, 128, device="cuda", dtype=torch.bfloat16)
    qo_indptr = torch.arange(0, rows + 1, 16, dtype=torch.int32, device="cuda")
    if kind.startswith("batch_decode"):
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=kind == "batch_decode_tensor_cores", backend="fa2")
        arguments = (*table, heads, kv_heads, 128, 16)
    elif kind == "batch_prefill_paged":
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        arguments = (qo_indptr, *table, heads, kv_heads, 128, 16)
        dtypes["causal"] = True
    else:
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
        arguments = (qo_indptr, qo_indptr * 4, heads, kv_heads, 128)
        dtypes["causal"] = True
        keys, values = (cache[:, i].flatten(0, 1).contiguous() for i in range(2))
    plan = lambda: wrapper.plan(*arguments, **dtypes)  # noqa: E731
    plan()
    if kind == "batch_prefill_ragged":
        return plan, lambda: wrapper.run(q, keys, values)
    return plan, lambda: wrapper.run(q, cache)


def _wrapper_run(kind):
    def run(batch, hidden):
        """run() of a planned wrapper: what the layer adds eagerly is the properties' reads (plan and sizes)."""
        return {"public": _planned(kind, batch, hidden)[1]}
    return run


def _wrapper_plan(kind):
    def plan(batch, hidden):
        """plan(): what the layer adds eagerly is the plan kept as a CPU tensor and the sizes as symbols too."""
        return {"public": _planned(kind, batch, hidden)[0]}
    return plan


def single_decode(batch, hidden):
    """single_decode_with_kv_cache over 64 x ``batch`` keys: the layer rebinds nothing eagerly."""
    import flashinfer

    heads, kv_heads = hidden // 128, max(1, hidden // 512)
    q = torch.randn(heads, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(64 * batch, kv_heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {"public": lambda: flashinfer.single_decode_with_kv_cache(q, k, v)}


def single_prefill(batch, hidden):
    """single_prefill_with_kv_cache (fa2, causal), 16 query rows over 64 x ``batch`` keys."""
    import flashinfer

    heads, kv_heads = hidden // 128, max(1, hidden // 512)
    q = torch.randn(16, heads, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(64 * batch, kv_heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {"public": lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa2")}


def segment_gemm_run(segments, hidden):
    """SegmentGEMMWrapper.run (sm80 backend) over ``segments`` segments of 16 rows: what the layer adds eagerly is
    the thin class method through which Dynamo reaches the run's polyfill."""
    import flashinfer

    wrapper = flashinfer.SegmentGEMMWrapper(torch.zeros(128 << 20, dtype=torch.int8, device="cuda"), backend="sm80")
    x = torch.randn(16 * segments, hidden, device="cuda", dtype=torch.bfloat16)
    weights = torch.randn(segments, 128, hidden, device="cuda", dtype=torch.bfloat16)
    indptr = torch.arange(0, 16 * segments + 1, 16, device="cuda", dtype=torch.int64)
    return {"public": lambda: wrapper.run(x, weights, segments, True, seg_indptr=indptr)}


WRAPPERS = ("batch_decode", "batch_decode_tensor_cores", "batch_prefill_paged", "batch_prefill_ragged")
FUNCTIONS = {"rmsnorm": rmsnorm, "apply_rope_pos_ids": apply_rope_pos_ids, "silu_and_mul": silu_and_mul,
             "top_k_sampling_from_probs": top_k_sampling_from_probs, "segment_gemm_run": segment_gemm_run,
             "single_decode": single_decode, "single_prefill": single_prefill,
             **{f"{kind}_run": _wrapper_run(kind) for kind in WRAPPERS},
             **{f"{kind}_plan": _wrapper_plan(kind) for kind in WRAPPERS}}


def measure(configs, hidden, calls, rounds, control=False, alternate=False) -> dict:
    """Per (function, M): the median microseconds of each candidate over ``rounds``. Each round times every
    configuration with the shim applied (``control``: reverted), then reverts once and times FlashInfer's function
    alone; with ``alternate`` every other round times FlashInfer's turn first."""
    per_round = {config: {} for config in configs}

    def turn(column, publics) -> None:
        for config, public in publics.items():
            for _ in range(5):
                public()
            per_round[config].setdefault(column, []).append(timed(public, calls, torch.cuda.synchronize))

    for round_number in range(rounds):
        if alternate and round_number % 2:  # FlashInfer's turn first: built and planned with the shim reverted
            fp4_dynamo_shim.revert()
            publics = {(name, tokens): FUNCTIONS[name](tokens, hidden)["public"] for (name, tokens) in configs}
            turn("flashinfer", publics)
            if not control:
                assert fp4_dynamo_shim.apply()
            turn("shim", publics)
            assert fp4_dynamo_shim.apply()
            continue
        publics = {}
        if control:  # the whole round FlashInfer's: built, planned and timed in both turns with the shim reverted
            fp4_dynamo_shim.revert()
        # Built again after each apply(): revert() destroyed the ops the previous round's closures held.
        for (name, tokens) in configs:
            candidates = FUNCTIONS[name](tokens, hidden)
            publics[(name, tokens)] = public = candidates.pop("public")
            for function in (public, *candidates.values()):
                for _ in range(5):
                    function()
            per_round[(name, tokens)].setdefault("shim", []).append(timed(public, calls, torch.cuda.synchronize))
            for candidate, function in candidates.items():
                per_round[(name, tokens)].setdefault(candidate, []).append(timed(function, calls, torch.cuda.synchronize))
        fp4_dynamo_shim.revert()
        turn("flashinfer", publics)
        assert fp4_dynamo_shim.apply()
    results = {}
    for config, values in per_round.items():
        result = {name: statistics.median(v) for name, v in values.items()}
        result["shim_over_flashinfer"] = median_ratio(values["shim"], values["flashinfer"])
        if "custom_op" in values:
            result["shim_over_custom_op"] = median_ratio(values["shim"], values["custom_op"])
        if "floor" in values:
            result["shim_minus_floor_us"] = statistics.median(s - f for s, f in zip(values["shim"], values["floor"]))
        results[config] = result
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--functions", nargs="+", choices=sorted(FUNCTIONS), default=sorted(FUNCTIONS))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--alternate", action="store_true",
                        help="every other round FlashInfer's turn first, so that the order's bias cancels")
    parser.add_argument("--control", action="store_true",
                        help="the whole round with the shim reverted: the ratio is the benchmark's own bias")
    add_save_option(parser)
    options = parser.parse_args()
    with_op_columns = {"rmsnorm", "apply_rope_pos_ids", "silu_and_mul", "top_k_sampling_from_probs"}
    if (options.control or options.alternate) and with_op_columns & set(options.functions):
        parser.error(f"--control and --alternate time functions alone; with op columns: {sorted(with_op_columns)}")
    if not torch.cuda.is_available():
        print("P1 needs a GPU", file=sys.stderr)
        return 2
    layer = fp4_dynamo_shim.status()["flashinfer_ops"]
    if not fp4_dynamo_shim.status()["applied"] or layer["gate"] != "all":
        print(f"shim not applied with every declared op: {fp4_dynamo_shim.status()['problem']}", file=sys.stderr)
        return 2
    rows, results = [], []
    measured = measure([(name, tokens) for name in options.functions for tokens in options.tokens], options.hidden,
                       options.calls, options.rounds, options.control, options.alternate)
    for (name, tokens), values in measured.items():
        result = {"function": name, "tokens": tokens, **values}
        results.append(result)
        rows.append([name, tokens] + [f"{result[c]:.2f}" if c in result else "-" for c in
                                      ("flashinfer", "shim", "custom_op", "shim_op", "floor")]
                    + [f"{result['shim_over_flashinfer']:.3f}",
                       f"{result['shim_over_custom_op']:.3f}" if "shim_over_custom_op" in result else "-",
                       f"{result['shim_minus_floor_us']:.2f}" if "shim_minus_floor_us" in result else "-"])
    print(table(["function", "M", "flashinfer", "shim", "custom_op", "shim_op", "floor", "shim/flashinfer",
                 "shim/custom_op", "shim-floor us"], rows))
    print(write("p1_declared", {
        "benchmark": "P1 for FlashInfer's declared ops: eager cost with every declared op on",
        "when": now(), "environment": environment(), "hidden": options.hidden, "calls": options.calls,
        "rounds": options.rounds, "control": options.control, "alternate": options.alternate,
        "command": " ".join(["python"] + sys.argv),
        "results": results,
    }, options.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
