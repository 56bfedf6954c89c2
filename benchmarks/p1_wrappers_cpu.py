"""P1 for ``SegmentGEMMWrapper.run`` on CPU: the eager cost of the thin method the declared layer puts on the class
(``declared/segment_gemm.py``), against FlashInfer's run alone.

The kernels need a GPU, so both stand in and cost nothing: the triton args kernel (``flashinfer.triton.gemm``, which
does not import without a GPU) and the built JIT module's GEMM. What is timed is FlashInfer's run on CPU tensors, its
Python and its small allocations, with and without the extra frame: the worst case for the ratio, since a GPU
launch only adds to both sides. Rounds alternate between the shim applied (FP4_DYNAMO_SHIM_FLASHINFER_OPS=all) and
reverted; the ratio is the median of per-round ratios. The GPU's figure is P1's ``segment_gemm_run`` row
(``benchmarks/p1_declared.py``).

    python benchmarks/p1_segment_gemm_cpu.py [--calls N] [--rounds N] [--save]
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
from common import add_save_option, environment, median_ratio, now, timed, write  # noqa: E402


class _NoKernel:
    """The triton args kernel and the JIT module's GEMM, launched for nothing."""

    def __getitem__(self, grid):
        return lambda *arguments: None

    def cutlass_segment_gemm(self, *arguments):
        pass

    def build_and_load(self):
        return self


def _stand_in_kernels() -> None:
    import flashinfer.gemm.gemm_base as gemm_base

    triton, kernels = types.ModuleType("flashinfer.triton"), types.ModuleType("flashinfer.triton.gemm")
    kernels.compute_sm80_group_gemm_args = _NoKernel()
    triton.gemm = kernels
    sys.modules.update({"flashinfer.triton": triton, "flashinfer.triton.gemm": kernels})
    gemm_base.gen_gemm_module = _NoKernel
    gemm_base.get_gemm_module.cache_clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=21)
    add_save_option(parser)
    options = parser.parse_args()
    status = fp4_dynamo_shim.status()
    if not any("SegmentGEMMWrapper.run" in helper for helper in (status["flashinfer_ops"] or {}).get("helpers", ())):
        print(f"the layer did not cover SegmentGEMMWrapper.run: {status['problem']}", file=sys.stderr)
        return 2
    import flashinfer

    _stand_in_kernels()
    wrapper = flashinfer.SegmentGEMMWrapper(torch.zeros(1024, dtype=torch.int8), backend="sm80")
    x, weights = torch.randn(10, 16), torch.randn(4, 8, 16)
    indptr, out = torch.tensor([0, 1, 3, 6, 10]), torch.empty(10, 8)

    def run():
        wrapper.run(x, weights, 4, True, out=out, seg_indptr=indptr)

    shim, alone = [], []
    for _ in range(options.rounds):
        shim.append(timed(run, options.calls, warmup=50))
        fp4_dynamo_shim.revert()
        alone.append(timed(run, options.calls, warmup=50))
        assert fp4_dynamo_shim.apply()
    result = {"flashinfer_us": statistics.median(alone), "shim_us": statistics.median(shim),
              "shim_over_flashinfer": median_ratio(shim, alone)}
    print(f"SegmentGEMMWrapper.run on CPU, kernels standing in: FlashInfer {result['flashinfer_us']:.2f} us, "
          f"shim {result['shim_us']:.2f} us, shim/FlashInfer {result['shim_over_flashinfer']:.4f} "
          f"(median of {options.rounds} rounds of {options.calls} calls)")
    print(write("p1_segment_gemm_cpu", {
        "benchmark": "P1 for SegmentGEMMWrapper.run on CPU: the thin method's eager cost, kernels standing in",
        "when": now(), "environment": environment(), "calls": options.calls, "rounds": options.rounds,
        "command": " ".join(["python"] + sys.argv), "result": result}, options.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
