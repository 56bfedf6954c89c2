"""The FP4 family on a real GPU, in both device modes (see gpu_support).

On SM90 the interleave kernel and the host-side dequantize code run for real in either mode (their values
are compared with FlashInfer's own functions and with the references); the arch-guarded quantize kernels
launch and write nothing, so on the kernel branch only shapes, strides, dtypes, capture and the branch
itself are checked, and values come from the reference branch. mm_fp4 runs its CUDA path for real:
FlashInfer's own error where it has no backend (SM90), the reference's values on the reference branch.
"""

from __future__ import annotations

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.fp4 import family_ops
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import reference
from fp4_dynamo_shim.errors import NoFp4KernelError
from gpu_support import capture_and_replay, has_fp4_kernel, meta, no_breaks
from nvfp4_inputs import nvfp4_input


def present(name):
    return fp4_dynamo_shim.status()["family"].get(name, "").startswith("op-backed")


def quantized(rows=64, columns=256):
    return nvfp4_input(rows, columns, device="cuda")


def test_block_scale_interleave_runs_on_this_gpu_and_matches_flashinfer_and_the_reference(device_mode):
    """The interleave kernel has a body on every GPU: FlashInfer's kernel runs in both modes."""
    original = lifecycle.original_function("block_scale_interleave")
    for sf in (torch.randint(0, 255, (130, 7), dtype=torch.uint8, device="cuda"),
               torch.randn(3, 129, 12, device="cuda").to(torch.bfloat16)):
        compiled = torch.compile(flashinfer.block_scale_interleave, fullgraph=True, backend="inductor")
        device_mode.branches.reset()
        got = compiled(sf)
        assert device_mode.branches["family:block_scale_interleave_sm100"] == 1, dict(device_mode.branches.counts)
        assert torch.equal(got, original(sf))
        assert torch.equal(got.cpu(), family_ops.op("block_scale_interleave")(sf.cpu()))
        assert no_breaks(flashinfer.block_scale_interleave, sf)
        captured, graph = capture_and_replay(compiled, sf)
        assert torch.equal(captured, original(sf))


def test_host_dequantize_helpers_match_flashinfers_host_code(reference_mode):
    x, scale = quantized()
    packed, sf = flashinfer.fp4_quantize(x, scale)  # real values through the reference fallback
    e2m1 = lifecycle.original_function("e2m1_and_ufp8sf_scale_to_float")
    want = e2m1(packed, sf.reshape(-1), 1.0 / scale)
    got = torch.compile(lambda p, s, g: flashinfer.e2m1_and_ufp8sf_scale_to_float(p, s, g), fullgraph=True,
                        backend="eager")(packed, sf.reshape(-1), 1.0 / scale)
    assert torch.equal(got, want)
    assert torch.equal(reference.e2m1_and_ufp8sf_scale_to_float(packed.cpu(), sf.cpu(), (1.0 / scale).cpu(), 16, 1,
                                                                True), want)
    weight = torch.randint(0, 255, (8, 64), dtype=torch.uint8)
    scales = torch.randint(100, 140, (8, 4), dtype=torch.uint8)
    host = lifecycle.original_function("mxfp4_dequantize_host")(weight, scales, 32)
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


#: Quantizers the shim computes through its fp4_quantize op (the rest through their own family op).
THROUGH_FP4_QUANTIZE = {"nvfp4_quantize", "mxfp4_quantize"}


@pytest.mark.parametrize("name, arguments, keywords", QUANTIZERS, ids=[q[0] for q in QUANTIZERS])
def test_quantizers_trace_capture_and_replay_with_flashinfers_shapes(name, arguments, keywords, device_mode):
    if not present(name):
        pytest.skip(f"this FlashInfer has no {name}")
    function, original = getattr(flashinfer, name), lifecycle.original_function(name)
    args = arguments(*quantized())
    assert no_breaks(lambda *a: function(*a, **keywords), *args)
    compiled = torch.compile(lambda *a: function(*a, **keywords), fullgraph=True, backend="inductor")
    device_mode.branches.reset()
    got = compiled(*args)
    device_mode.assert_branch(family=name not in THROUGH_FP4_QUANTIZE)
    assert meta(got) == meta(function(*args, **keywords)) == meta(original(*args, **keywords))
    captured, graph = capture_and_replay(compiled, *args)
    assert meta(captured) == meta(got)
    if device_mode.computes_values:
        expected = function(*args, **keywords)
        assert all(torch.equal(c.view(torch.uint8), e.view(torch.uint8)) for c, e in zip(captured, expected))


def test_quantizers_refuse_by_default_below_sm100():
    if has_fp4_kernel():
        pytest.skip("this GPU has the FP4 kernels")
    x, scale = quantized()
    with pytest.raises(NoFp4KernelError, match=r"cuda:\d has no FP4 kernel below SM100"):
        flashinfer.nvfp4_batched_quantize(x.view(2, -1, x.shape[-1]), scale)


@pytest.mark.parametrize("name, arguments, keywords", QUANTIZERS, ids=[q[0] for q in QUANTIZERS])
def test_quantizers_give_the_references_values_with_the_reference_fallback(name, arguments, keywords,
                                                                           reference_mode):
    """Values, which only the reference branch has on SM90."""
    if not present(name):
        pytest.skip(f"this FlashInfer has no {name}")
    function = getattr(flashinfer, name)
    args = arguments(*quantized())
    on_gpu = function(*args, **keywords)
    on_cpu = function(*[a.cpu() for a in args], **keywords)
    compiled = torch.compile(lambda *a: function(*a, **keywords), fullgraph=True, backend="inductor")(*args)
    for gpu, cpu, graph in zip(on_gpu, on_cpu, compiled):  # (nvfp4/mxfp4_quantize move CPU input to the GPU)
        assert gpu.is_cuda and torch.equal(gpu.cpu().view(torch.uint8), cpu.cpu().view(torch.uint8))
        assert torch.equal(graph.cpu().view(torch.uint8), gpu.cpu().view(torch.uint8))


def _mm_fp4_operands():
    """K = 16: a all 1.0 (scale 1.0); weight rows 1.0 x scale 2.0 and 0.5 x scale 1.0; a @ w.T = [32, 8]."""
    def buffer(entries, rows):
        flat = torch.zeros(512, dtype=torch.uint8)
        for m, byte in entries:
            flat[(m % 32) * 16 + ((m % 128) // 32) * 4] = byte
        return flat.view(128, 4)

    a = torch.full((1, 8), 0x22, dtype=torch.uint8)
    weight = torch.tensor([[0x22] * 8, [0x11] * 8], dtype=torch.uint8)
    a_sf, w_sf = buffer([(0, 0x38)], 1), buffer([(0, 0x40), (1, 0x38)], 2)
    return [t.cuda() for t in (a, weight.t(), a_sf, w_sf.t())]


def test_mm_fp4_cuda_path_gives_flashinfers_own_outcome(kernel_mode):
    """The op's CUDA kernel calls FlashInfer's mm_fp4 itself: its result, or its own error (SM90 has no
    FP4 GEMM backend), never a RecursionError from the shim calling itself. Kernel branch only: the
    reference branch computes a product where FlashInfer has none."""
    if not present("mm_fp4"):
        pytest.skip("this FlashInfer has no mm_fp4")
    operands = _mm_fp4_operands()
    alpha = torch.tensor([0.25], device="cuda")
    original = lifecycle.original_function("mm_fp4")

    def outcome(function):
        try:
            return ("result", function(*operands, alpha, torch.bfloat16).float().cpu().tolist())
        except Exception as error:  # FlashInfer's own refusal is an outcome to compare
            return ("error", type(error).__name__, str(error))

    with_shim = outcome(flashinfer.mm_fp4)
    assert with_shim[:2] != ("error", "RecursionError")
    assert with_shim == outcome(original)


def test_mm_fp4_with_the_reference_fallback_computes_the_product(reference_mode):
    """Values, which only the reference branch has on SM90 (FlashInfer has no FP4 GEMM backend there)."""
    if not present("mm_fp4"):
        pytest.skip("this FlashInfer has no mm_fp4")
    operands = _mm_fp4_operands()
    alpha = torch.tensor([0.25], device="cuda")
    assert flashinfer.mm_fp4(*operands, alpha, torch.bfloat16).float().cpu().tolist() == [[8.0, 2.0]]
    compiled = torch.compile(lambda *t: flashinfer.mm_fp4(*t, alpha, torch.bfloat16), fullgraph=True,
                             backend="inductor")
    assert compiled(*operands).float().cpu().tolist() == [[8.0, 2.0]]
    # SGLang runs its FP4 GEMM inside captured CUDA graphs: the reference must capture (no host copies).
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashinfer.mm_fp4(*operands, alpha, torch.bfloat16)
    alpha.fill_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert captured.float().cpu().tolist() == [[16.0, 4.0]]


def _gpu_op_calls():
    """(op name, CUDA arguments) for each family op that runs on the GPU (host ops take any device)."""
    x, scale = quantized(32, 128)
    experts = x[:, :64].reshape(2, 16, 64).contiguous()
    mask = torch.tensor([16, 9], dtype=torch.int32, device="cuda")
    packed = torch.randint(0, 255, (32, 64), dtype=torch.uint8, device="cuda")
    sf = torch.randint(0, 255, (128, 8), dtype=torch.uint8, device="cuda")
    return {
        "fp4_batched_quantize": (x.view(2, 16, 128), scale, 16, False, 0),
        "fp4_experts_quantize": (experts, torch.tensor([3.0, 5.0], device="cuda"), mask, False, 0),
        "mm_fp4": (packed, packed.t(), sf, sf.t(), scale, torch.bfloat16, 16, False, "auto", True, None),
    }


@pytest.mark.parametrize("name", ["fp4_batched_quantize", "fp4_experts_quantize", "mm_fp4"])
def test_a_cpu_tensor_next_to_cuda_ones_is_refused_naming_it(name, kernel_mode):
    """Issue 19: the CUDA kernels screen their tensors' devices (FlashInfer's batched kernel would read a host
    pointer for a CPU global scale); every tensor but the first in turn is put on the CPU."""
    from fp4_dynamo_shim.errors import InvalidArgumentError

    arguments = _gpu_op_calls()[name]
    tensors = [i for i, a in enumerate(arguments) if isinstance(a, torch.Tensor)]
    for position in tensors[1:]:
        moved = tuple(a.cpu() if i == position else a for i, a in enumerate(arguments))
        with pytest.raises(InvalidArgumentError, match="is on cpu but .* is on cuda:0"):
            family_ops.op(name)(*moved)
        torch.cuda.synchronize()
