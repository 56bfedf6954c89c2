"""FlashInfer's FP4 family under fullgraph on CPU.

Every function the installed FlashInfer has (asked of FlashInfer, not of the shim) must be the shim's,
trace with 0 graph breaks, run and match eager; each op passes opcheck; each reference is checked
against values worked out by hand (alpha, silu, per-row scales, scale layouts), since comparing
compiled with eager only compares the reference with itself.
"""

from __future__ import annotations

import inspect
import re

import flashinfer
import pytest
import torch

from _fp4_dynamo_shim.fp4 import family
from _fp4_dynamo_shim.fp4 import family_ops
from _fp4_dynamo_shim.fp4 import layout
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import reference
from fp4_dynamo_shim.errors import InvalidArgumentError, NotExpressibleError

from release_facts import installed_facts
from nvfp4_inputs import nvfp4_input

NAMES = sorted({member.name for member in family.MEMBERS})


def flashinfer_has(name: str) -> bool:
    return hasattr(flashinfer, name)


def quantized(rows=32, columns=128, seed=0):
    x, scale = nvfp4_input(rows, columns, seed=seed)
    packed, sf = flashinfer.fp4_quantize(x, scale)
    return x, scale, packed, sf


def calls():
    """name -> (function, args, kwargs) valid for the installed release, CPU tensors."""
    torch.manual_seed(0)
    x, scale, packed, sf = quantized()
    _, sf_linear = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    w, w_scale = nvfp4_input(64, 128, seed=1)
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
    if not flashinfer_has(name):
        pytest.skip(f"this FlashInfer has no {name}")
    function, args, kwargs = calls()[name]
    assert getattr(function, "__fp4_dynamo_shim__", False), f"flashinfer.{name} is not the shim's replacement"
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


# --- references against values worked out by hand ------------------------------------------------------

E4M3_ONE, E4M3_TWO = 0x38, 0x40  # 1.0 and 2.0 as e4m3 bytes


def swizzled_128x4(grid: dict, rows: int, columns: int) -> torch.Tensor:
    """A 128x4 scale buffer holding ``grid[(m, k)]`` at get_sf_out_offset_128x4's offset, zero elsewhere."""
    k_tiles = (columns + 3) // 4
    buffer = torch.zeros(((rows + 127) // 128) * k_tiles * 512, dtype=torch.uint8)
    for (m, k), byte in grid.items():
        buffer[(m // 128) * k_tiles * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4] = byte
    return buffer


def test_mm_fp4_dequantizes_both_operands_and_applies_alpha():
    # K = 16, one block. a: all codes 2 (1.0), scale 1.0. Weight rows: all 1.0 with scale 2.0, all 0.5 with
    # scale 1.0. a @ w.T = [16 * 1 * 2, 16 * 0.5 * 1] = [32, 8]; times alpha 0.25: [8, 2].
    if not flashinfer_has("mm_fp4"):
        pytest.skip("this FlashInfer has no mm_fp4")
    a = torch.full((1, 8), 0x22, dtype=torch.uint8)
    weight = torch.tensor([[0x22] * 8, [0x11] * 8], dtype=torch.uint8)
    a_sf = swizzled_128x4({(0, 0): E4M3_ONE}, 1, 1).view(128, 4)
    w_sf = swizzled_128x4({(0, 0): E4M3_TWO, (1, 0): E4M3_ONE}, 2, 1).view(128, 4)
    for alpha, expected in ((torch.tensor([0.25]), [[8.0, 2.0]]), (None, [[32.0, 8.0]])):
        out = flashinfer.mm_fp4(a, weight.t(), a_sf, w_sf.t(), alpha, torch.bfloat16)
        assert out.dtype == torch.bfloat16 and out.float().tolist() == expected
        compiled = torch.compile(lambda *t: flashinfer.mm_fp4(*t, alpha, torch.bfloat16), fullgraph=True)
        assert compiled(a, weight.t(), a_sf, w_sf.t()).float().tolist() == expected
        torch._dynamo.reset()


def test_silu_and_mul_experts_quantize_applies_silu_to_the_gate_half():
    # gate = 4 everywhere, up = 1: silu(4) * 1 = 3.928 -> bf16 3.921875; amax/6 = 0.6536 -> e4m3 0.625
    # (byte 0x32); 3.92 / 0.625 = 6.27 saturates to 6 (code 7). Without the silu: 4/6 -> 0.6875 (0x33).
    if not flashinfer_has("silu_and_mul_scaled_nvfp4_experts_quantize"):
        pytest.skip("this FlashInfer has no silu_and_mul_scaled_nvfp4_experts_quantize")
    x = torch.cat([torch.full((1, 3, 16), 4.0), torch.ones(1, 3, 16)], dim=-1).to(torch.bfloat16)
    values, scales = flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(
        x, torch.tensor([2], dtype=torch.int32), torch.tensor([1.0]))
    assert values.shape == (3, 8, 1) and values[:2, :, 0].flatten().tolist() == [0x77] * 16
    assert not values[2].any()  # row 2 is at or beyond mask[0] = 2: left unwritten (zero in the reference)
    grid = layout.unswizzle(scales.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(-1), 3, 1, False)
    assert grid.flatten().tolist() == [0x32, 0x32, 0]


def test_grouped_quantize_uses_one_global_scale_per_expert():
    # Expert 0 scale 1, expert 1 scale 2: amax 6 -> e4m3 1.0 (0x38) and 2.0 (0x40); values 6 -> code 7.
    if not flashinfer_has("scaled_fp4_grouped_quantize"):
        pytest.skip("this FlashInfer has no scaled_fp4_grouped_quantize")
    x = torch.full((2, 1, 16), 6.0, dtype=torch.bfloat16)
    values, scales = flashinfer.scaled_fp4_grouped_quantize(x, torch.tensor([1, 1], dtype=torch.int32),
                                                            torch.tensor([1.0, 2.0]))
    grid = scales.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).view(2, -1)
    assert [layout.unswizzle(g, 1, 1, False).item() for g in grid] == [E4M3_ONE, E4M3_TWO]
    assert values.permute(2, 0, 1).flatten().tolist() == [0x77] * 16


def test_batched_quantize_applies_a_per_row_global_scale_to_that_row_in_every_batch():
    # Two batches of two rows, every value 6; row scales [1, 2]: row 0 -> e4m3 1.0, row 1 -> 2.0, in both batches.
    if not flashinfer_has("nvfp4_batched_quantize"):
        pytest.skip("this FlashInfer has no nvfp4_batched_quantize")
    x = torch.full((2, 2, 16), 6.0, dtype=torch.bfloat16)
    if not installed_facts().per_row_batched_global_scale:
        with pytest.raises(ValueError, match="global scale"):
            flashinfer.nvfp4_batched_quantize(x, torch.tensor([1.0, 2.0]))
        return
    values, scales = flashinfer.nvfp4_batched_quantize(x, torch.tensor([1.0, 2.0]))
    assert [layout.unswizzle(batch, 2, 1, False).flatten().tolist() for batch in scales] == [
        [E4M3_ONE, E4M3_TWO], [E4M3_ONE, E4M3_TWO]]
    assert values.flatten().tolist() == [0x77] * 32


def test_mxfp4_dequantize_reads_swizzled_scales():
    # Two rows, two 32-blocks with power-of-two amaxes 6, 12 / 24, 48: every value is exact in MXFP4, so
    # quantize then dequantize gives x back. Reading the 128x4 buffer as linear gets row 1's scales wrong.
    if not flashinfer_has("mxfp4_dequantize"):
        pytest.skip("this FlashInfer has no mxfp4_dequantize")
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    for (row, block), amax in {(0, 0): 6.0, (0, 1): 12.0, (1, 0): 24.0, (1, 1): 48.0}.items():
        x[row, block * 32: block * 32 + 4] = torch.tensor([amax, -amax / 2, amax / 4, 0.0])
    packed, sf = flashinfer.mxfp4_quantize(x)
    assert torch.equal(flashinfer.mxfp4_dequantize(packed, sf).float(), x.float())


def test_dequantize_reads_swizzled_e4m3_scales_times_the_global_scale():
    # Row 0: codes 7 (6.0), scale 1.0; row 1: codes 2 (1.0), scale 2.0; ufp8_type 1 multiplies by 0.5.
    packed = torch.tensor([[0x77] * 8, [0x22] * 8], dtype=torch.uint8)
    sf = swizzled_128x4({(0, 0): E4M3_ONE, (1, 0): E4M3_TWO}, 2, 1)
    values = flashinfer.e2m1_and_ufp8sf_scale_to_float(packed, sf, torch.tensor([0.5]))
    assert values.tolist() == [[3.0] * 16, [1.0] * 16]


def test_interleave_matches_the_kernels_offset_function():
    grid = (torch.arange(2 * 130 * 7) % 251).to(torch.uint8).view(2, 130, 7)
    out = flashinfer.block_scale_interleave(grid)
    expected = torch.cat([swizzled_128x4({(m, k): grid[e, m, k].item() for m in range(130) for k in range(7)}, 130, 7)
                          for e in range(2)])
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
        got_host = flashinfer.mxfp4_dequantize_host(weight, scale, 32)[0, 1].item()
        got = flashinfer.e2m1_and_ufp8sf_scale_to_float(weight, scale.reshape(-1), torch.ones(1), 32, 0, False)[0, 1]
        assert (got_host == host or (host != host and got_host != got_host)) and got.item() == e2m1


def test_grouped_quantize_leaves_masked_rows_zero():
    experts = torch.randn(2, 40, 64, dtype=torch.bfloat16)
    values, _ = family_ops.op("fp4_experts_quantize")(experts, torch.tensor([3.0, 5.0]),
                                                      torch.tensor([40, 17], dtype=torch.int32), False, 0)
    assert not values[1, 17:].any() and values[1, :17].any() and values[0, 17:].any()


# --- arguments no op carries: FlashInfer's own function eagerly, a clear error compiled ---------------------

def _outcome(function, *args, **kwargs):
    """What a call did: its result's values, or its exception's class and message."""
    try:
        result = function(*args, **kwargs)
    except Exception as error:  # the error is the outcome being compared
        return ("error", type(error).__name__, str(error))
    return ("result", [(t.shape, t.dtype, t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)
                       for t in _flatten(result)])


def _same_outcome(got, want):
    if got[0] != want[0] or got[0] == "error":
        return got == want
    return all(g[:2] == w[:2] and torch.equal(g[2], w[2]) for g, w in zip(got[1], want[1]))


def _arguments_for(name):
    x, scale, packed, sf = quantized(rows=128)
    w_packed, w_sf = flashinfer.fp4_quantize(torch.randn(64, 128, dtype=torch.bfloat16), torch.tensor([2.0]))
    return {
        "fp4_quantize": (x, scale), "nvfp4_quantize": (x, scale), "mxfp4_quantize": (x,),
        "block_scale_interleave": (flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)[1],),
        "mm_fp4": (packed, w_packed.t(), sf, w_sf.t(), torch.tensor([0.5]), torch.bfloat16),
    }[name]


#: (function, parameter, value): arguments FlashInfer has that no op of the shim's carries.
NOT_EXPRESSIBLE = [
    ("fp4_quantize", "backend", lambda: "not-a-backend"),
    ("fp4_quantize", "batch_invariant", lambda: True),
    ("nvfp4_quantize", "do_shuffle", lambda: True),
    ("nvfp4_quantize", "batch_invariant", lambda: True),
    ("mxfp4_quantize", "batch_invariant", lambda: True),
    ("block_scale_interleave", "out", lambda: torch.empty(128 * 8, dtype=torch.uint8)),
    ("mm_fp4", "out", lambda: torch.empty(128, 64, dtype=torch.bfloat16)),
    ("mm_fp4", "batch_invariant", lambda: True),
]


@pytest.mark.parametrize("name, option, value", NOT_EXPRESSIBLE, ids=[f"{n}-{o}" for n, o, _ in NOT_EXPRESSIBLE])
def test_arguments_no_op_carries_reach_flashinfer_eagerly_and_fail_clearly_compiled(name, option, value):
    function = getattr(flashinfer, name, None)
    if function is None or option not in inspect.signature(function).parameters:
        pytest.skip(f"this FlashInfer's {name} has no {option} parameter")
    assert getattr(function, "__fp4_dynamo_shim__", False), f"flashinfer.{name} is not the shim's replacement"
    args, kwargs = _arguments_for(name), {option: value()}
    original = lifecycle.original_function(name)
    assert _same_outcome(_outcome(function, *args, **kwargs), _outcome(original, *args, **kwargs))
    compiled = torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend="eager")
    with pytest.raises(Exception) as error:
        compiled(*args)
    assert NotExpressibleError.__name__ in str(error.value) and "cannot run inside torch.compile" in str(error.value)


# --- meta tensors (issue 19) -------------------------------------------------------------------------------

def _meta_variants():
    """(name, which) for each family function and each tensor argument made meta, the others real."""
    for name, (function, args, kwargs) in calls().items():
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor) and len([a for a in args if isinstance(a, torch.Tensor)]) > 1:
                yield name, index


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name, index", list(_meta_variants()))
def test_a_meta_tensor_next_to_real_ones_is_refused_naming_the_argument(name, index, compiled):
    """Such a call reaches the op's fake, which would hand back uninitialized memory."""
    if not flashinfer_has(name):
        pytest.skip(f"this FlashInfer has no {name}")
    function, args, kwargs = calls()[name]
    args = tuple(a.to("meta") if i == index else a for i, a in enumerate(args))
    run = torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend="eager") if compiled else \
        (lambda *a: function(*a, **kwargs))
    with pytest.raises(Exception) as error:
        run(*args)
    text = str(error.value)
    assert "InvalidArgumentError" in text or isinstance(error.value, InvalidArgumentError), text[:600]
    assert re.search(r"\w+ is on (meta|cpu) but \w+ is on (cpu|meta); a meta tensor only goes with", text), text[:600]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", NAMES)
def test_meta_tensors_alone_give_meta_outputs_shaped_like_the_real_ones(name, compiled):
    if not flashinfer_has(name):
        pytest.skip(f"this FlashInfer has no {name}")
    function, args, kwargs = calls()[name]
    real = _flatten(function(*args, **kwargs))
    meta_args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    run = torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend="eager") if compiled else \
        (lambda *a: function(*a, **kwargs))
    got = _flatten(run(*meta_args))
    assert [(t.device.type, t.shape, t.stride(), t.dtype) for t in got] == \
        [("meta", t.shape, t.stride(), t.dtype) for t in real]
