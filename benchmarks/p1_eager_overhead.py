"""P1: eager per-call cost of flashinfer.fp4_quantize, shim / original FlashInfer (goal <= 0.8).

Both sides launch the same FlashInfer kernel on the same inputs; the ratio is what the shim's eager
path costs per call relative to FlashInfer's own function. Rounds alternate between the two, and the
reported figure is the median of per-round ratios.

On GPUs without the FP4 kernel (SM<100) run it with FP4_DYNAMO_SHIM_FALLBACK=launch: both paths then
launch FlashInfer's real (empty) kernel, which is what makes per-call host overhead measurable there.

    FP4_DYNAMO_SHIM_FALLBACK=launch python benchmarks/p1_eager_overhead.py
"""

from __future__ import annotations

import argparse
import sys

import torch

import fp4_dynamo_shim
from fp4_dynamo_shim import patching

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import add_save_option, environment, interleaved_ratio, median_ratio, now, table, write  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--columns", type=int, nargs="+", default=[2048, 7168])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    add_save_option(parser)
    options = parser.parse_args()
    if not torch.cuda.is_available():
        print("P1 needs a GPU", file=sys.stderr)
        return 2
    if not fp4_dynamo_shim.status()["applied"]:
        print(f"shim not applied: {fp4_dynamo_shim.status()['problem']}", file=sys.stderr)
        return 2
    import flashinfer

    shim, original = flashinfer.fp4_quantize, patching.original_function()
    rows_out, results = [], []
    for columns in options.columns:
        for rows in options.rows:
            x = torch.randn(rows, columns, device="cuda", dtype=torch.bfloat16)
            scale = torch.tensor([1.0], device="cuda")
            for function in (shim, original):  # warm both paths (allocator, module caches)
                for _ in range(20):
                    function(x, scale)
            timing = interleaved_ratio(
                {"original": lambda: original(x, scale), "shim": lambda: shim(x, scale)},
                options.calls, options.rounds, torch.cuda.synchronize,
            )
            ratio = median_ratio(timing["shim"]["rounds_us"], timing["original"]["rounds_us"])
            results.append({"rows": rows, "columns": columns, "ratio": ratio, **{
                f"{name}_median_us": value["median_us"] for name, value in timing.items()}})
            rows_out.append([rows, columns, f"{timing['original']['median_us']:.2f}",
                             f"{timing['shim']['median_us']:.2f}", f"{ratio:.3f}"])
    print(table(["M", "K", "original us/call", "shim us/call", "shim/original"], rows_out))
    worst = max(r["ratio"] for r in results)
    print(f"worst ratio {worst:.3f} (goal <= 0.8)")
    saved = write("p1_eager_overhead", {
        "benchmark": "P1 eager per-call cost, shim / original", "when": now(), "environment": environment(),
        "mode": fp4_dynamo_shim.status()["devices"][0]["mode"], "calls": options.calls, "rounds": options.rounds,
        "command": " ".join(["python"] + sys.argv), "results": results, "worst_ratio": worst,
    }, options.save)
    print(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
