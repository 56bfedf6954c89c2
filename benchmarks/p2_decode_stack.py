"""P2: a decode-shaped stack, eager with FlashInfer's function vs torch.compile(fullgraph) + CUDA graph with the shim.

32 layers of RMSNorm -> fp4_quantize -> GEMM at M in {1, 8, 16}. The FP4 GEMM cannot run below SM100,
so a bf16 GEMM on the normalised activations stands in for it; every fp4_quantize output is returned,
so nothing can be dead-code-eliminated. Goal: captured time <= 1/3 of eager. Also reports the captured
time against the sum of its kernels' GPU time (the limit), from one profiled replay.

On SM<100: FP4_DYNAMO_SHIM_FALLBACK=launch python benchmarks/p2_decode_stack.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle

sys.path.insert(0, os.path.dirname(__file__))
from common import add_save_option, environment, now, table, write  # noqa: E402


class DecodeStack(torch.nn.Module):
    def __init__(self, quantize, layers: int, hidden: int):
        super().__init__()
        self.quantize = quantize
        generator = torch.Generator(device="cuda").manual_seed(0)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16,
                                           generator=generator) * hidden ** -0.5, requires_grad=False)
            for _ in range(layers)
        )
        self.norms = torch.nn.ParameterList(
            torch.nn.Parameter(torch.ones(hidden, device="cuda", dtype=torch.bfloat16), requires_grad=False)
            for _ in range(layers)
        )
        self.register_buffer("global_scale", torch.tensor([448.0 * 6.0 / 8.0], device="cuda"))

    def forward(self, x):
        quantized = []
        for weight, norm in zip(self.weights, self.norms):
            variance = x.float().pow(2).mean(-1, keepdim=True)
            normed = (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype) * norm
            quantized.extend(self.quantize(normed, self.global_scale))
            x = normed @ weight  # bf16 stand-in for the FP4 GEMM that would consume `quantized`
        return x, quantized


def time_calls(function, iterations: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(iterations):
            function()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - started) / iterations * 1e6)
    return statistics.median(samples)


def kernel_time_us(function) -> float:
    from torch.profiler import ProfilerActivity, profile

    function()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        function()
        torch.cuda.synchronize()
    return sum(e.device_time for e in profiler.events() if e.device_type.name == "CUDA") or float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default="inductor")
    add_save_option(parser)
    options = parser.parse_args()
    if not fp4_dynamo_shim.status()["applied"] or not torch.cuda.is_available():
        print("P2 needs a GPU and the applied shim", file=sys.stderr)
        return 2
    import flashinfer

    original = lifecycle.original_function()
    eager_stack = DecodeStack(original, options.layers, options.hidden)
    shim_stack = DecodeStack(flashinfer.fp4_quantize, options.layers, options.hidden)
    shim_stack.load_state_dict(eager_stack.state_dict())
    compiled = torch.compile(shim_stack, fullgraph=True, backend=options.backend)

    results, rows_out = [], []
    for rows in options.rows:
        x = torch.randn(rows, options.hidden, device="cuda", dtype=torch.bfloat16)
        eager_us = time_calls(lambda: eager_stack(x), options.iterations, options.repeats)
        for _ in range(3):
            compiled(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            compiled(x)
        captured_us = time_calls(graph.replay, options.iterations, options.repeats)
        kernels_us = kernel_time_us(graph.replay)
        results.append({"rows": rows, "eager_us": eager_us, "captured_us": captured_us,
                        "captured_over_eager": captured_us / eager_us, "kernel_sum_us": kernels_us,
                        "captured_over_kernel_sum": captured_us / kernels_us})
        rows_out.append([rows, f"{eager_us:.0f}", f"{captured_us:.0f}", f"{captured_us / eager_us:.3f}",
                         f"{kernels_us:.0f}", f"{captured_us / kernels_us:.2f}"])
    print(table(["M", "eager us", "compiled+graph us", "graph/eager", "kernel sum us", "graph/kernels"], rows_out))
    saved = write("p2_decode_stack", {
        "benchmark": "P2 decode stack, eager original vs compiled+CUDA graph with the shim", "when": now(),
        "environment": environment(), "layers": options.layers, "hidden": options.hidden,
        "backend": options.backend, "mode": fp4_dynamo_shim.status()["devices"][0]["mode"],
        "command": " ".join(["python"] + sys.argv), "results": results,
    }, options.save)
    print(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
