"""P1 on CPU for the FlashInfer wrappers whose eager calls the declared layer touches, against FlashInfer alone:
``SegmentGEMMWrapper.run`` (a thin method on the class: ``declared/segment_gemm.py``) and the batch attention
wrappers' ``run`` and ``plan`` (properties for the plan and the batch's sizes: ``declared/wrappers.py``).

The kernels need a GPU, so they stand in and cost nothing: the triton args kernel (``flashinfer.triton.gemm``,
which does not import without a GPU), the JIT modules' GEMM, plan and run functions; the attention wrappers'
pinned host buffer is an ordinary one (CPU torch has no pinned memory). What is timed is FlashInfer's Python and
its small allocations, with and without what the layer adds: the worst case for the ratio, since a GPU launch only
adds to both sides. Each round times the shim applied (FP4_DYNAMO_SHIM_FLASHINFER_OPS=all) and reverted, the
shim's turn first in even rounds and FlashInfer's first in odd ones, so that what the order alone does to a turn
cancels in the median; the ratio is the median of per-round ratios. The GPU's figures are P1's rows
(``benchmarks/p1_declared.py``).

    python benchmarks/p1_wrappers_cpu.py [--functions NAME...] [--calls N] [--rounds N] [--save]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import types

os.environ["FP4_DYNAMO_SHIM_FLASHINFER_OPS"] = "all"

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  (the layer registers its ops when torch._dynamo is imported)

import fp4_dynamo_shim  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from common import add_save_option, environment, median_ratio, now, table, timed, write  # noqa: E402

HEADS, KV_HEADS, DIM, PAGE = 8, 2, 128, 16


class _NoKernel:
    """Every kernel a wrapper launches, for nothing: the triton args kernel, the JIT modules' GEMM, plan and runs
    (a plan is a list of ints, as FlashInfer's modules return)."""

    def __getitem__(self, grid):
        return lambda *arguments: None

    def build_and_load(self):
        return self

    def plan(self, *arguments):
        return [4, 16, 0, 0, 0, 0, 1]

    def cutlass_segment_gemm(self, *arguments):
        pass

    run = paged_run = ragged_run = cutlass_segment_gemm


def _stand_in_kernels() -> None:
    import flashinfer.decode
    import flashinfer.gemm.gemm_base as gemm_base
    import flashinfer.prefill

    triton, kernels = types.ModuleType("flashinfer.triton"), types.ModuleType("flashinfer.triton.gemm")
    kernels.compute_sm80_group_gemm_args = _NoKernel()
    triton.gemm = kernels
    sys.modules.update({"flashinfer.triton": triton, "flashinfer.triton.gemm": kernels})
    gemm_base.gen_gemm_module = _NoKernel
    gemm_base.get_gemm_module.cache_clear()
    flashinfer.decode.gen_batch_decode_module = lambda *arguments: _NoKernel()
    for name in ("_gen_batch_prefill_primary_module", "_gen_batch_prefill_independent_paged_module",
                 "gen_batch_prefill_module"):  # the first two are 0.7.x's
        if hasattr(flashinfer.prefill, name):
            setattr(flashinfer.prefill, name, lambda *arguments: _NoKernel())
    flashinfer.decode.get_batch_decode_module.cache_clear()
    flashinfer.prefill.get_batch_prefill_module.cache_clear()


def segment_gemm():
    import flashinfer

    wrapper = flashinfer.SegmentGEMMWrapper(torch.zeros(1024, dtype=torch.int8), backend="sm80")
    x, weights = torch.randn(10, 16), torch.randn(4, 8, 16)
    indptr, out = torch.tensor([0, 1, 3, 6, 10]), torch.empty(10, 8)
    return lambda: wrapper.run(x, weights, 4, True, out=out, seg_indptr=indptr)


def _attention(kind: str, what: str):
    """(a call of ``what``: "run" or "plan") for a wrapper of ``kind``, planned for 4 requests of 3 pages, 4 query
    rows each (decode: one)."""
    import flashinfer

    empty = torch.empty
    torch.empty = lambda *a, pin_memory=False, **k: empty(*a, **k)  # the pinned host buffer: module docstring
    try:
        workspace = torch.zeros(1 << 16, dtype=torch.uint8)
        if kind.startswith("decode"):
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=kind == "decode_tensor_cores", backend="fa2")
        elif kind == "prefill_paged":
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        else:
            wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
    finally:
        torch.empty = empty
    i32 = dict(dtype=torch.int32)
    indptr, indices = torch.arange(0, 13, 3, **i32), torch.arange(12, **i32)
    last, qo_indptr = torch.full((4,), 5, **i32), torch.arange(0, 17, 4, **i32)
    dtypes = dict(q_data_type=torch.float16, kv_data_type=torch.float16)
    if kind.startswith("decode"):
        def plan():
            wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, **dtypes)
    elif kind == "prefill_paged":
        def plan():
            wrapper.plan(qo_indptr, indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, causal=True, **dtypes)
    else:
        def plan():
            wrapper.plan(qo_indptr, indptr * PAGE, HEADS, KV_HEADS, DIM, causal=True, **dtypes)
    plan()
    if what == "plan":
        return plan
    q = torch.randn(4 if kind.startswith("decode") else 16, HEADS, DIM, dtype=torch.float16)
    cache = tuple(torch.randn(12, PAGE, KV_HEADS, DIM, dtype=torch.float16) for _ in range(2))
    if kind == "prefill_ragged":
        keys, values = (c.flatten(0, 1) for c in cache)
        return lambda: wrapper.run(q, keys, values)
    return lambda: wrapper.run(q, cache)


FUNCTIONS = {
    "segment_gemm": ("SegmentGEMMWrapper.run", segment_gemm),
    **{f"batch_{kind}_{what}": (f"{cls}.{what} ({label})", lambda kind=kind, what=what: _attention(kind, what))
       for kind, cls, label in (
           ("decode", "BatchDecodeWithPagedKVCacheWrapper", "fa2"),
           ("decode_tensor_cores", "BatchDecodeWithPagedKVCacheWrapper", "fa2, tensor cores"),
           ("prefill_paged", "BatchPrefillWithPagedKVCacheWrapper", "fa2"),
           ("prefill_ragged", "BatchPrefillWithRaggedKVCacheWrapper", "fa2"))
       for what in ("run", "plan")},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", nargs="+", choices=sorted(FUNCTIONS), default=list(FUNCTIONS))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=21)
    add_save_option(parser)
    options = parser.parse_args()
    helpers = (fp4_dynamo_shim.status()["flashinfer_ops"] or {}).get("helpers", ())
    if not any("SegmentGEMMWrapper.run" in helper for helper in helpers) or not any(
            helper.endswith("._plan_info") for helper in helpers):
        print(f"the layer did not cover the wrappers: {fp4_dynamo_shim.status()['problem']}", file=sys.stderr)
        return 2
    _stand_in_kernels()
    rows = {}
    for name in options.functions:
        call = FUNCTIONS[name][1]()
        shim, alone = [], []

        def shim_turn():
            shim.append(timed(call, options.calls, warmup=50))

        def flashinfer_turn():
            fp4_dynamo_shim.revert()
            alone.append(timed(call, options.calls, warmup=50))
            assert fp4_dynamo_shim.apply()

        for round_number in range(options.rounds):
            # FlashInfer's turn first in odd rounds, so that the order's own cost cancels in the median
            for turn in (shim_turn, flashinfer_turn)[::-1 if round_number % 2 else 1]:
                turn()
        rows[name] = {"function": FUNCTIONS[name][0], "flashinfer_us": statistics.median(alone),
                      "shim_us": statistics.median(shim), "shim_over_flashinfer": median_ratio(shim, alone)}
    print(table(["function", "FlashInfer us", "shim us", "shim/FlashInfer"],
                [[row["function"], f"{row['flashinfer_us']:.2f}", f"{row['shim_us']:.2f}",
                  f"{row['shim_over_flashinfer']:.4f}"] for row in rows.values()]))
    print(f"(medians of {options.rounds} rounds of {options.calls} calls; kernels standing in)")
    print(write("p1_wrappers_cpu", {
        "benchmark": "P1 on CPU for the wrappers the declared layer touches: eager cost, kernels standing in",
        "when": now(), "environment": environment(), "calls": options.calls, "rounds": options.rounds,
        "order": "the shim's turn first in even rounds, FlashInfer's in odd ones",
        "command": " ".join(["python"] + sys.argv), "result": rows}, options.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
