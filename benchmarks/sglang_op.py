"""SGLang's own FP4 op, eager, with and without the shim: what the shim costs on SGLang >= 0.5.12's default path.

SGLang 0.5.12+ calls ``torch.ops.sglang.flashinfer_fp4_quantize`` on every NVFP4 linear layer; its body
calls the ``_flashinfer_fp4_quantize`` that ``fp4_utils`` bound at import: FlashInfer's function without the
shim, the shim's replacement with it (any route; see docs/how-it-works.md). Columns, microseconds per call,
interleaved rounds on the same inputs:

* ``sglang_op_off``: SGLang's op bound to FlashInfer's own function (no shim);
* ``sglang_op_shim``: SGLang's op bound to the shim's replacement;
* ``original`` / ``shim``: the two functions called directly, for scale.

SGLang's ``fp4_utils.py`` runs from the verbatim copies in ``tests/data/sglang_sources`` (``tests/support/sglang_wrapper.py``
lists the stand-ins for its platform queries). ``--device cpu`` (no GPU): FlashInfer's own function and the
shim both run as on an SM100 whose JIT module does nothing (the stand-ins of ``tests/fp4/test_parity.py``), so
the figures are each path's host cost with a kernel launch of zero. ``--device cuda``: the real kernel; on
SM90 run it with ``FP4_DYNAMO_SHIM_FALLBACK=launch`` (the real, empty kernel launch).

    python benchmarks/sglang_op.py --device cpu [--save]
    FP4_DYNAMO_SHIM_FALLBACK=launch python benchmarks/sglang_op.py --device cuda [--save]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
from common import add_save_option, environment, median_ratio, now, stand_in_sm100, table, write  # noqa: E402
from common import timed as timed_calls  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sglang", default="0.5.14", help="which copy of SGLang's fp4_utils (0.5.14 or 0.5.21)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--columns", type=int, nargs="+", default=[2048, 7168])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    add_save_option(parser)
    options = parser.parse_args()

    import fp4_dynamo_shim
    from _fp4_dynamo_shim import lifecycle

    if options.device == "cpu":
        stand_in_sm100()
    if not fp4_dynamo_shim.status()["applied"]:
        print(f"shim not applied: {fp4_dynamo_shim.status()['problem']}", file=sys.stderr)
        return 2
    import flashinfer
    import sglang_wrapper

    shim, original = flashinfer.fp4_quantize, lifecycle.original_function()
    sm100 = options.device == "cuda" and torch.cuda.get_device_capability()[0] == 10
    loaded = sglang_wrapper.load(options.sglang, sm100=sm100, cpu_kernel=options.device == "cpu")
    fp4_utils, op = loaded.fp4_utils, torch.ops.sglang.flashinfer_fp4_quantize
    synchronize = torch.cuda.synchronize if options.device == "cuda" else (lambda: None)

    def timed(function) -> float:  # warm the path (allocator, caches) after a rebinding
        return timed_calls(function, options.calls, synchronize, warmup=20)

    names = ("sglang_op_off", "sglang_op_shim", "original", "shim")
    bindings = {"sglang_op_off": original, "sglang_op_shim": shim}
    results, rows_out = [], []
    try:
        for columns in options.columns:
            for rows in options.rows:
                x = torch.randn(rows, columns, device=options.device, dtype=torch.bfloat16)
                scale = torch.tensor([1.0], device=options.device)
                calls = {"sglang_op_off": lambda: op(x, scale), "sglang_op_shim": lambda: op(x, scale),
                         "original": lambda: original(x, scale), "shim": lambda: shim(x, scale)}
                timings = {name: [] for name in names}
                for _ in range(options.rounds):  # the candidates take turns within every round
                    for name in names:
                        if name in bindings:  # the two states SGLang's module is in, without and with the shim
                            fp4_utils._flashinfer_fp4_quantize = bindings[name]
                        timings[name].append(timed(calls[name]))
                median = {name: statistics.median(values) for name, values in timings.items()}
                result = {"rows": rows, "columns": columns, **{f"{n}_median_us": v for n, v in median.items()},
                          "sglang_op_shim_over_off": median_ratio(timings["sglang_op_shim"], timings["sglang_op_off"]),
                          "sglang_op_shim_minus_off_us": statistics.median(
                              s - o for s, o in zip(timings["sglang_op_shim"], timings["sglang_op_off"]))}
                results.append(result)
                rows_out.append([rows, columns] + [f"{median[n]:.2f}" for n in names]
                                + [f"{result['sglang_op_shim_over_off']:.3f}",
                                   f"{result['sglang_op_shim_minus_off_us']:+.2f}"])
    finally:
        loaded.unload()
    print(table(["M", "K", "sglang_op_off", "sglang_op_shim", "original", "shim", "shim/off", "shim-off us"], rows_out))
    print(f"SGLang {options.sglang}'s op with the shim / without: "
          f"{min(r['sglang_op_shim_over_off'] for r in results):.3f}-{max(r['sglang_op_shim_over_off'] for r in results):.3f}")
    device = fp4_dynamo_shim.status()["devices"][0]["mode"] if options.device == "cuda" else "stand-in SM100, no kernel"
    print(write(f"sglang_op_{options.device}", {
        "benchmark": "SGLang's torch.ops.sglang.flashinfer_fp4_quantize eager, bound to FlashInfer's function or the shim's",
        "when": now(), "environment": environment(), "device": options.device, "mode": device,
        "sglang_sources": options.sglang, "calls": options.calls, "rounds": options.rounds,
        "command": " ".join(["python"] + sys.argv), "results": results,
    }, options.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
