"""P1: eager per-call cost of flashinfer.fp4_quantize with the shim, against its peers, in one interleaved run.

Columns (microseconds per call, every candidate launching the same FlashInfer kernel on the same inputs):

* ``original``: FlashInfer's own ``fp4_quantize`` (the function the shim replaces);
* ``shim``: ``flashinfer.fp4_quantize`` with the shim applied;
* ``flashinfer_op``: FlashInfer's ``torch.ops.flashinfer.fp4_quantize`` as FlashInfer ships it (0.6.12+;
  ``enable_pdl=False``, the one value its 0.6.12-0.7.0 body passes correctly), measured with the shim
  reverted for that candidate's turn of each round;
* ``repaired_op``: the same op while the shim is applied (its kernels and fake repaired);
* ``sglang_op``: SGLang >= 0.5.12's ``torch.ops.sglang.flashinfer_fp4_quantize``, when SGLang imports;
* ``floor``: the two output allocations plus the raw JIT-module call, nothing else.

Rounds alternate between candidates; each ratio is the median of per-round ratios (machines are noisy).
On GPUs without the FP4 kernel (SM<100) run it with FP4_DYNAMO_SHIM_FALLBACK=launch: every candidate then
launches FlashInfer's real (empty) kernel, which is what per-call host overhead consists of there. With
``--device cpu`` (no GPU) every candidate runs on CPU tensors as on an SM100 whose JIT module does nothing
(``common.stand_in_sm100``): each path's host cost with a launch of zero, for comparing torch releases.

    FP4_DYNAMO_SHIM_FALLBACK=launch python benchmarks/p1_eager_overhead.py [--save]
    python benchmarks/p1_eager_overhead.py --device cpu [--save]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.fp4 import flashinfer_op
from _fp4_dynamo_shim.fp4 import quantize_op
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import kernels

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import (add_save_option, cpu_as_stand_in_gpu, environment, median_ratio, now, stand_in_sm100, timed,  # noqa: E402
                    table, write)


def _floor(x, scale):
    """Two allocations and the raw JIT entry with the release's argument order: the least any path can do."""
    target = quantize_op.active_target()
    module = sys.modules[target.module]
    jit = kernels.jit_module_of(module.get_fp4_quantization_module(
        "%d%d" % torch.cuda.get_device_capability(x.device if x.is_cuda else None)))
    values = dict(sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True, is_sf_8x4_layout=False,
                  is_global_scale_inversed=False, enable_pdl=True, nvfp4_4over6_code=0)
    scalars = [values[name] for name in target.kernel_args]
    rows, columns = x.shape
    sf_size = (rows + 127) // 128 * 128 * ((columns // 16 + 3) // 4 * 4)

    def call():
        out_val = torch.empty((rows, columns // 2), dtype=torch.uint8, device=x.device)
        out_sf = torch.empty((sf_size,), dtype=torch.uint8, device=x.device)
        jit.fp4_quantize(x, scale, out_val, out_sf, *scalars)

    return call


def _sglang_op():
    try:
        from sglang.srt.layers.quantization import fp4_utils  # noqa: F401  (registers the op, SGLang >= 0.5.12)

        return torch.ops.sglang.flashinfer_fp4_quantize
    except Exception:  # absent before 0.5.12, or SGLang not importable here: no column
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--columns", type=int, nargs="+", default=[2048, 7168])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    add_save_option(parser)
    options = parser.parse_args()
    if options.device == "cpu":
        stand_in_sm100()
    synchronize = torch.cuda.synchronize if options.device == "cuda" else (lambda: None)
    if not fp4_dynamo_shim.status()["applied"]:
        print(f"shim not applied: {fp4_dynamo_shim.status()['problem']}", file=sys.stderr)
        return 2
    import flashinfer

    shim, original = flashinfer.fp4_quantize, lifecycle.original_function()
    has_op, sglang_op = flashinfer_op.flashinfer_has_op(), _sglang_op()
    rows_out, results = [], []
    for columns in options.columns:
        for rows in options.rows:
            x = torch.randn(rows, columns, device=options.device, dtype=torch.bfloat16)
            scale = torch.tensor([1.0], device=options.device)
            candidates = {"original": lambda: original(x, scale), "shim": lambda: shim(x, scale),
                          "floor": _floor(x, scale)}
            if has_op:
                op = torch.ops.flashinfer.fp4_quantize
                candidates["repaired_op"] = lambda: op(x, scale, 16, False, True, False, False)
            if sglang_op is not None:
                candidates["sglang_op"] = lambda: sglang_op(x, scale)
            for function in candidates.values():  # warm every path (allocator, module caches)
                for _ in range(20):
                    function()
            per_round = {name: [] for name in [*candidates, *(["flashinfer_op"] if has_op else [])]}
            for _ in range(options.rounds):
                for name, function in candidates.items():
                    per_round[name].append(timed(function, options.calls, synchronize))
                if has_op:  # FlashInfer's op as shipped: its own registrations, its body calling its function
                    fp4_dynamo_shim.revert()
                    shipped = torch.ops.flashinfer.fp4_quantize
                    for _ in range(5):
                        shipped(x, scale, 16, False, True, False, False)
                    per_round["flashinfer_op"].append(timed(lambda: shipped(x, scale, 16, False, True, False, False),
                                                            options.calls, synchronize))
                    assert fp4_dynamo_shim.apply()
                    if options.device == "cpu":
                        cpu_as_stand_in_gpu()
            median = {name: statistics.median(values) for name, values in per_round.items()}
            result = {"rows": rows, "columns": columns, **{f"{n}_median_us": v for n, v in median.items()},
                      "shim_over_original": median_ratio(per_round["shim"], per_round["original"]),
                      "shim_minus_floor_us": statistics.median(
                          s - f for s, f in zip(per_round["shim"], per_round["floor"]))}
            if has_op:
                result["shim_over_flashinfer_op"] = median_ratio(per_round["shim"], per_round["flashinfer_op"])
                result["repaired_op_over_shim"] = median_ratio(per_round["repaired_op"], per_round["shim"])
            if sglang_op is not None:
                result["shim_over_sglang_op"] = median_ratio(per_round["shim"], per_round["sglang_op"])
            results.append(result)
            rows_out.append([rows, columns] + [f"{median[n]:.2f}" if n in median else "-" for n in
                                               ("original", "shim", "flashinfer_op", "repaired_op", "sglang_op", "floor")]
                            + [f"{result['shim_over_original']:.3f}",
                               f"{result['shim_over_flashinfer_op']:.3f}" if has_op else "-",
                               f"{result['shim_minus_floor_us']:.2f}"])
    print(table(["M", "K", "original", "shim", "flashinfer_op", "repaired_op", "sglang_op", "floor",
                 "shim/original", "shim/fi_op", "shim-floor us"], rows_out))
    print(f"worst shim/original {max(r['shim_over_original'] for r in results):.3f} (goal <= 0.8)"
          + (f"; worst shim/FlashInfer-op {max(r['shim_over_flashinfer_op'] for r in results):.3f} (goal <= 0.4)"
             if has_op else "")
          + f"; worst shim - floor {max(r['shim_minus_floor_us'] for r in results):.2f} us (goal <= 1)")
    print(write("p1_eager_overhead" + ("_cpu_torch" + torch.__version__.split("+")[0] if options.device == "cpu" else ""), {
        "benchmark": "P1 eager per-call cost against FlashInfer's function, its op, SGLang's op and the floor",
        "when": now(), "environment": environment(), "device": options.device,
        "mode": fp4_dynamo_shim.status()["devices"][0]["mode"] if options.device == "cuda" else "stand-in SM100, no kernel",
        "calls": options.calls, "rounds": options.rounds, "command": " ".join(["python"] + sys.argv),
        "results": results,
    }, options.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
