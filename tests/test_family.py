"""FlashInfer's FP4 family under fullgraph on CPU: every function this release has traces with 0 graph
breaks, runs, matches eager, and each op passes opcheck; the references agree with hand-checked bytes."""

from __future__ import annotations

import inspect

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from fp4_dynamo_shim import family, family_ops, layout, reference


def present():
    return {name for name, state in fp4_dynamo_shim.status()["family"].items() if state.startswith("op-backed")}


def quantized(rows=32, columns=128, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(rows, columns, dtype=torch.bfloat16)
    scale = torch.tensor([448.0 * 6.0 / x.float().abs().max().item()])
    packed, sf = flashinfer.fp4_quantize(x, scale)
    return x, scale, packed, sf


def calls():
    """name -> (function, args, kwargs) valid for the installed release, CPU tensors."""
    torch.manual_seed(0)
    x, scale, packed, sf = quantized()
    _, sf_linear = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    w_scale = torch.tensor([448.0 * 6.0 / w.float().abs().max().item()])
    w_packed, w_sf = flashinfer.fp4_quantize(w, w_scale)
    experts = torch.randn(2, 40, 64, dtype=torch.bfloat16)
    mask = torch.tensor([40, 17], dtype=torch.int32)
    mx_packed, mx_sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    return {
        "nvfp4_quantize": (flashinfer.nvfp4_quantize, (x, scale), {}),
        "mxfp4_quantize": (flashinfer.mxfp4_quantize, (x,), {}),
        "block_scale_interleave": (flashinfer.block_scale_interleave, (sf_linear,), {}),
        "e2m1_and_ufp8sf_scale_to_float": (flashinfer.e2m1_and_ufp8sf_scale_to_float,
                                           (packed, sf.reshape(-1), 1.0 / scale), {}),
        "mxfp4_dequantize": (flashinfer.mxfp4_dequantize, tuple(flashinfer.mxfp4_quantize(x)), {}),
        "mxfp4_dequantize_host": (flashinfer.mxfp4_dequantize_host, (mx_packed, mx_sf), {}),
        "nvfp4_batched_quantize": (flashinfer.nvfp4_batched_quantize, (x.view(2, 16, 128), scale), {}),
        "scaled_fp4_grouped_quantize": (flashinfer.scaled_fp4_grouped_quantize,
                                        (experts, mask, torch.tensor([3.0, 5.0])), {}),
        "silu_and_mul_scaled_nvfp4_experts_quantize": (flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize,
                                                       (experts, mask, torch.tensor([3.0, 5.0])), {}),
        "mm_fp4": (flashinfer.mm_fp4, (packed, w_packed.t(), sf, w_sf.t(), 1.0 / (scale * w_scale)),
                   {"out_dtype": torch.bfloat16}),
    }


NAMES = sorted({member.name for member in family.MEMBERS})


def _flatten(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _assert_same(got, want):
    for g, w in zip(_flatten(got), _flatten(want)):
        assert (tuple(g.shape), g.stride(), g.dtype, g.device) == (tuple(w.shape), w.stride(), w.dtype, w.device)
        assert torch.equal(g.view(torch.uint8) if g.dtype == torch.float8_e4m3fn else g,
                           w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w) or (
            g.is_floating_point() and torch.allclose(g, w, equal_nan=True))


@pytest.mark.parametrize("name", NAMES)
def test_traces_with_no_graph_breaks_runs_and_matches_eager(name):
    if name not in present():
        pytest.skip(f"this FlashInfer has no {name}")
    function, args, kwargs = calls()[name]
    assert getattr(function, "__fp4_dynamo_shim__", False)
    explanation = torch._dynamo.explain(lambda *a: function(*a, **kwargs))(*args)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    torch._dynamo.reset()
    eager = function(*args, **kwargs)
    for backend in ("eager", "inductor"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend=backend)
        _assert_same(compiled(*args), eager)


def _op_arguments():
    x, scale, packed, sf = quantized()
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    w_scale = torch.tensor([2.0])
    w_packed, w_sf = flashinfer.fp4_quantize(w, w_scale)
    mx_packed, mx_sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    experts = torch.randn(2, 40, 64, dtype=torch.bfloat16)
    gs, mask = torch.tensor([3.0, 5.0]), torch.tensor([40, 17], dtype=torch.int32)
    return {
        "block_scale_interleave": [(torch.randint(0, 255, (130, 7), dtype=torch.uint8),),
                                   (torch.randn(3, 5, 9).to(torch.bfloat16),)],
        "e2m1_and_ufp8sf_scale_to_float": [(packed, sf.reshape(-1), 1.0 / scale, 16, 1, True, False),
                                           (mx_packed, mx_sf.reshape(-1), torch.ones(1), 32, 0, False, False)],
        "mxfp4_dequantize_host": [(mx_packed, mx_sf, 32)],
        "fp4_batched_quantize": [(x.view(2, 16, 128), scale, 16, False, 0)],
        "fp4_experts_quantize": [(experts, gs, mask, False, 0), (experts, gs, mask, True, 0)],
        "mm_fp4": [(packed, w_packed.t(), sf, w_sf.t(), torch.tensor([0.5]), torch.bfloat16, 16, False, "auto",
                    True, None)],
    }


@pytest.mark.parametrize("name", [o.name for o in family_ops.OPS])
def test_opcheck(name):
    for arguments in _op_arguments()[name]:
        torch.library.opcheck(family_ops.op(name), arguments)


def test_interleave_matches_the_kernels_offset_function():
    grid = (torch.arange(2 * 130 * 7) % 251).to(torch.uint8).view(2, 130, 7)
    out = family_ops.op("block_scale_interleave")(grid)
    expected = torch.zeros(2 * 256 * 8, dtype=torch.uint8)
    for e in range(2):  # get_sf_out_offset_128x4 with a batch index, transcribed
        for m in range(130):
            for k in range(7):
                offset = e * (2 * 2 * 512) + (m // 128) * (2 * 512) + (k // 4) * 512 + (m % 32) * 16 + \
                    ((m % 128) // 32) * 4 + k % 4
                expected[offset] = grid[e, m, k]
    assert torch.equal(out, expected)


def test_dequantize_decodes_what_quantize_encoded():
    x, scale, packed, sf = quantized()
    values = family_ops.op("e2m1_and_ufp8sf_scale_to_float")(packed, sf.reshape(-1), 1.0 / scale, 16, 1, True, False)
    grid = layout.unswizzle(sf.reshape(-1), 32, 8, False)
    # FlashInfer multiplies by the decode scale 1/gs; dividing by gs can differ in the last ulp.
    assert torch.allclose(values, reference.dequantize(packed, grid, scale, 16, False), rtol=1e-6, atol=0)


def test_ue8m0_decodings_differ_between_the_two_host_dequantizers_as_in_flashinfer():
    weight = torch.tensor([[0x21] * 16], dtype=torch.uint8)  # codes 1 (0.5) and 2 (1.0)
    for byte, host, e2m1 in ((127, 1.0, 1.0), (0, 2.0 ** -127, 0.0), (255, float("nan"), float("inf"))):
        scale = torch.tensor([[byte]], dtype=torch.uint8)
        got_host = family_ops.op("mxfp4_dequantize_host")(weight, scale, 32)[0, 1].item()
        got = family_ops.op("e2m1_and_ufp8sf_scale_to_float")(weight, scale.reshape(-1), torch.ones(1), 32, 0, False,
                                                         False)[0, 1].item()
        assert (got_host == host or (host != host and got_host != got_host)) and got == e2m1


def test_grouped_quantize_leaves_masked_rows_zero_and_uses_one_scale_per_expert():
    experts = torch.randn(2, 40, 64, dtype=torch.bfloat16)
    values, scales = family_ops.op("fp4_experts_quantize")(experts, torch.tensor([3.0, 5.0]),
                                                       torch.tensor([40, 17], dtype=torch.int32), False, 0)
    assert not values[1, 17:].any()
    for e, s in enumerate((3.0, 5.0)):
        packed, sf = reference.quantize(experts[e, :17], torch.tensor([s]), 16, False)
        assert torch.equal(values[e, :17], packed)


def test_unsupported_options_fall_back_in_eager_and_fail_clearly_when_compiled():
    if "block_scale_interleave" not in present() or "out" not in inspect.signature(flashinfer.block_scale_interleave).parameters:
        pytest.skip("this FlashInfer's block_scale_interleave has no out= parameter")
    sf = torch.randint(0, 255, (128, 4), dtype=torch.uint8)
    compiled = torch.compile(lambda t, o: flashinfer.block_scale_interleave(t, out=o), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="cannot run inside torch.compile"):
        compiled(sf, torch.empty(512, dtype=torch.uint8))
