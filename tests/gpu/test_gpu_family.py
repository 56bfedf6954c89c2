"""The FP4 family on a real GPU: fullgraph traces with real launches; values where SM90 computes them.

On SM90 the interleave kernel and the host-side dequantize code run for real (their values are compared
with FlashInfer's own functions and with the references); the arch-guarded quantize kernels launch and
write nothing, so only shapes, strides and dtypes are compared; mm_fp4 has no SM90 backend at all, so it
is traced without running (a backend that evaluates the graph on fake tensors).
"""

from __future__ import annotations

import flashinfer
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_dynamo_shim
from fp4_dynamo_shim import family_ops, patching, reference
from gpu_support import has_fp4_kernel


def present(name):
    return fp4_dynamo_shim.status()["family"].get(name, "").startswith("op-backed")


def meta(result):
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    return [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in items]


def no_breaks(function, *args):
    explanation = torch._dynamo.explain(function)(*args)
    torch._dynamo.reset()
    return (explanation.graph_count, explanation.graph_break_count) == (1, 0)


def quantized(rows=64, columns=256):
    x = torch.randn(rows, columns, device="cuda", dtype=torch.bfloat16)
    return x, (448.0 * 6.0 / x.float().abs().amax()).reshape(1)


def test_block_scale_interleave_runs_on_this_gpu_and_matches_flashinfer_and_the_reference(launch_mode):
    original = patching.original_function("block_scale_interleave")
    for sf in (torch.randint(0, 255, (130, 7), dtype=torch.uint8, device="cuda"),
               torch.randn(3, 129, 12, device="cuda").to(torch.bfloat16)):
        got = torch.compile(flashinfer.block_scale_interleave, fullgraph=True, backend="inductor")(sf)
        assert torch.equal(got, original(sf))
        assert torch.equal(got.cpu(), family_ops.op("block_scale_interleave")(sf.cpu()))
        assert no_breaks(flashinfer.block_scale_interleave, sf)


def test_host_dequantize_helpers_match_flashinfers_host_code(reference_mode):
    x, scale = quantized()
    packed, sf = flashinfer.fp4_quantize(x, scale)  # real values through the reference fallback
    e2m1 = patching.original_function("e2m1_and_ufp8sf_scale_to_float")
    want = e2m1(packed, sf.reshape(-1), 1.0 / scale)
    got = torch.compile(lambda p, s, g: flashinfer.e2m1_and_ufp8sf_scale_to_float(p, s, g), fullgraph=True,
                        backend="eager")(packed, sf.reshape(-1), 1.0 / scale)
    assert torch.equal(got, want)
    assert torch.equal(reference.e2m1_and_ufp8sf_scale_to_float(packed.cpu(), sf.cpu(), (1.0 / scale).cpu(), 16, 1,
                                                                True), want)
    weight = torch.randint(0, 255, (8, 64), dtype=torch.uint8)
    scales = torch.randint(100, 140, (8, 4), dtype=torch.uint8)
    host = patching.original_function("mxfp4_dequantize_host")(weight, scales, 32)
    assert torch.equal(flashinfer.mxfp4_dequantize_host(weight, scales, 32), host)
    assert torch.equal(reference.mxfp4_dequantize_host(weight, scales, 32), host)


QUANTIZERS = [
    ("nvfp4_quantize", lambda x, s: (x, s), {}),
    ("mxfp4_quantize", lambda x, s: (x,), {}),
    ("nvfp4_batched_quantize", lambda x, s: (x.view(2, -1, x.shape[-1]), s), {}),
    ("scaled_fp4_grouped_quantize",
     lambda x, s: (x.view(2, -1, x.shape[-1]), torch.tensor([32, 9], dtype=torch.int32, device="cuda"), s.repeat(2)), {}),
    ("silu_and_mul_scaled_nvfp4_experts_quantize",
     lambda x, s: (x.view(2, -1, x.shape[-1]), torch.tensor([32, 9], dtype=torch.int32, device="cuda"), s.repeat(2)), {}),
]


@pytest.mark.parametrize("name, arguments, keywords", QUANTIZERS, ids=[q[0] for q in QUANTIZERS])
def test_quantizers_trace_and_launch_the_real_kernel_with_flashinfers_shapes(name, arguments, keywords, launch_mode):
    if not present(name):
        pytest.skip(f"this FlashInfer has no {name}")
    function, original = getattr(flashinfer, name), patching.original_function(name)
    args = arguments(*quantized())
    assert no_breaks(lambda *a: function(*a, **keywords), *args)
    compiled = torch.compile(lambda *a: function(*a, **keywords), fullgraph=True, backend="inductor")
    assert meta(compiled(*args)) == meta(function(*args, **keywords)) == meta(original(*args, **keywords))


def test_quantizers_refuse_by_default_below_sm100():
    if has_fp4_kernel():
        pytest.skip("this GPU has the FP4 kernels")
    x, scale = quantized()
    with pytest.raises(RuntimeError, match="SM100|FP4"):
        flashinfer.nvfp4_batched_quantize(x.view(2, -1, x.shape[-1]), scale)


def test_mm_fp4_traces_with_no_graph_breaks(launch_mode):
    if not present("mm_fp4"):
        pytest.skip("this FlashInfer has no mm_fp4")
    x, scale = quantized(16, 256)
    w, w_scale = quantized(128, 256)
    packed, sf = flashinfer.fp4_quantize(x, scale)
    w_packed, w_sf = flashinfer.fp4_quantize(w, w_scale)
    graphs = []

    def capture(graph_module, example_inputs):  # trace only: evaluate on fake tensors, never launch
        graphs.append(graph_module)

        def run(*args):
            with FakeTensorMode(allow_non_fake_inputs=True):
                return graph_module(*args)
        return run

    compiled = torch.compile(lambda a, b, sa, sb, al: flashinfer.mm_fp4(a, b, sa, sb, al, torch.bfloat16),
                             fullgraph=True, backend=capture)
    out = compiled(packed, w_packed.t(), sf, w_sf.t(), 1.0 / (scale * w_scale))
    assert len(graphs) == 1 and tuple(out.shape) == (16, 128) and out.dtype == torch.bfloat16
