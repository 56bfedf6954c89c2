"""Behaviours that once broke unnoticed because every test used common values (issue 17).

K/16 a multiple of 4, global scale 1, lowercase switch values, one kernel mode at a time, default layouts:
each test here uses the uncommon value that tells the right behaviour from a plausible wrong one. Expected
bytes come from the kernel's arithmetic worked out by hand (next to each case) or, where a search found
the input, from ``fp4_oracle`` (written from the kernel sources, independent of the reference).
"""

from __future__ import annotations

import math
import sys

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.entry import startup
import fp4_oracle
from _fp4_dynamo_shim.verify import checks
from _fp4_dynamo_shim.fp4 import quantize_op as ops
from _fp4_dynamo_shim import lifecycle as patching
from _fp4_dynamo_shim.fp4 import reference
from _fp4_dynamo_shim.entry import sglang_plugin as sglang
from _fp4_dynamo_shim.fp4 import releases as targets
from _fp4_dynamo_shim.fp4.arithmetic import FourOverSix, Recipe
from helpers import run_python

ROW_0_6_12 = targets.target_for("0.6.12").arithmetic

#: An on/off variable: every one is read by the same parser.
SWITCH = switches.STRICT


def row_of(values, width=16, dtype=torch.bfloat16):
    x = torch.zeros(1, width, dtype=torch.float32)
    for index, value in values.items():
        x[0, index] = value
    return x.to(dtype)


# --- 1. the direct eager path ----------------------------------------------------------------------------

def test_the_direct_path_never_hands_an_empty_input_to_the_kernel(direct_entry):
    # FlashInfer launches an empty grid for M = 0, which leaves a stale CUDA error behind.
    packed, sf = flashinfer.fp4_quantize(torch.empty(0, 64, dtype=torch.bfloat16), torch.tensor([1.0]), nvfp4_4over6=None)
    assert direct_entry == [] and packed.shape == (0, 32) and sf.shape == (0, 4)
    flashinfer.fp4_quantize(torch.ones(1, 64, dtype=torch.bfloat16), torch.tensor([1.0]), nvfp4_4over6=None)
    assert len(direct_entry) == 1  # the stand-in is reached for M = 1


@pytest.mark.parametrize("columns", [64, 80, 96, 112])  # K/16 % 4 = 0, 1, 2, 3
def test_the_direct_path_pads_scale_columns_to_a_multiple_of_four(direct_entry, columns):
    x = torch.randn(3, columns, dtype=torch.bfloat16)
    scale = torch.tensor([7.0])
    general = flashinfer.fp4_quantize(x, scale)  # the 4over6 sentinel: the general path
    direct = flashinfer.fp4_quantize(x, scale, nvfp4_4over6=None)
    assert direct_entry and direct_entry[-1][2] == (128, -(-columns // 64) * 4)
    for got, want in zip(direct, general):
        assert got.shape == want.shape and torch.equal(got, want)


# --- 2. fast math off: a NaN amax ---------------------------------------------------------------------------

def test_fast_math_off_caps_a_nan_output_scale_at_flt_max():
    # Every odd element NaN, x0 = 1: the amax is NaN, so the scale byte is 0x7F. Fast math off computes
    # fminf(1 / (NaN * (1/g)), FLT_MAX) = FLT_MAX: zeros stay code 0, 1 * FLT_MAX saturates to 6 (code 7),
    # NaN -> 7. A NaN output scale would make every code 7 (0 * NaN).
    x = row_of({0: 1.0, **{i: float("nan") for i in range(1, 16, 2)}})
    fast_off = Recipe(ROW_0_6_12, fast_math=False)
    packed, sf = reference.quantize(x, torch.tensor([3.0]), 16, False, recipe=fast_off)
    assert sf.tolist() == [[0x7F]] and packed.tolist() == [[0x77] + [0x70] * 7]
    assert (packed.tolist(), sf.tolist()) == fp4_oracle.quantize(x.float().tolist(), [3.0], 16, False,
                                                                mode=fp4_oracle.Mode(fast_math=False), release="0.6.12")


# --- 3. 4over6 ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fast_math", [True, False])
@pytest.mark.parametrize("mse", [False, True])
def test_four_over_six_leaves_a_zero_block_zero(fast_math, mse):
    # Block 0 is all zero: both candidates' scales are 0, their output scale rcp(0) = inf and 0 * inf = NaN
    # would encode as 0x77; the kernel returns 0 codes and scale byte 0 for it. Block 1 is ordinary.
    from flashinfer.quantization.nvfp4_quantization_utils import NVFP44Over6Config

    x = row_of({16: 4.0, 17: -1.0}, width=32)
    config = NVFP44Over6Config(err_mode="MSE" if mse else "MAE")
    environment = {"FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH": "1"} if not fast_math else {}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1.0]), is_sf_swizzled_layout=False, nvfp4_4over6=config)
    assert packed[0, :8].tolist() == [0] * 8 and sf[0, 0].item() == 0
    assert packed[0, 8:].any() and sf[0, 1].item() != 0


def test_0_6_12_fast_math_off_four_over_six_multiplies_amax_by_g_over_six():
    # 0.6.12: __fmul_rn(amax, __fdiv_rn(g, 6)); 0.6.13 on: __fmul_rn(__fdiv_rn(amax, 6), g). Found by search
    # next to an e4m3 midpoint: amax 6.40625, g = 14.517072677612305 gives byte 87 (0.6.12), 88 (0.6.13).
    x = row_of({0: 6.40625})
    g = torch.tensor([14.517072677612305])
    mode = fp4_oracle.Mode(fast_math=False, four_over_six=True)
    for release, byte in (("0.6.12", 87), ("0.6.13", 88)):
        arithmetic = targets.target_for(release).arithmetic  # the row's formula column decides
        _, sf = reference.quantize(x, g, 16, False, recipe=Recipe(arithmetic, False, FourOverSix()))
        assert sf.tolist() == [[byte]], release
        assert fp4_oracle.quantize(x.float().tolist(), g.tolist(), 16, False, mode=mode, release=release)[1] == [[byte]]


def test_0_6_12_fast_mse_accumulates_with_fused_multiply_adds():
    # 0.6.12's fast error: error += diff * diff, which nvcc contracts into fma(diff, diff, error). Found by
    # search with g = 1.7: the fused sum keeps byte 73; rounding each square first would pick 68.
    values = [4.53125, -1.8828125, 2.125, -0.049560546875, -1.421875, -3.0625, 2.34375, -1.265625, -2.046875,
              -4.3125, -3.4375, 2.6875, -1.40625, -6.0625, 0.9453125, -10.75]
    x = torch.tensor([values]).to(torch.bfloat16)
    _, sf = reference.quantize(x, torch.tensor([1.7]), 16, False, recipe=Recipe(ROW_0_6_12, True, FourOverSix(True, True)))
    assert sf.tolist() == [[73]]
    mode = fp4_oracle.Mode(True, True, mse=True, fast_error=True)
    assert fp4_oracle.quantize([values], [1.7], 16, False, mode=mode, release="0.6.12")[1] == [[73]]


# --- 4. MXFP4: an infinite block ------------------------------------------------------------------------------

def test_mxfp4_maps_an_infinite_block_scale_to_byte_254():
    # amax inf: inf / 6 rounds up (satfinite) to the largest finite e8m0, byte 254; its inverse scale is 0
    # (0.7.4's ue8m0_inverse_scale; before, ex2.approx.ftz(-127) flushes to 0): inf * 0 = NaN -> code 7,
    # 3 * 0 = 0 -> 0, -3 * 0 = -0 -> 8.
    x = row_of({0: float("inf"), 1: 3.0, 2: -3.0}, width=32)
    packed, sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    assert sf.tolist() == [[254]] and packed[0, :2].tolist() == [0x07, 0x08]
    assert fp4_oracle.quantize(x.float().tolist(), None, 32, True)[1] == [[254]]


# --- 5. FP8 input ------------------------------------------------------------------------------------------------

def test_fp8_input_dequantizes_with_six_times_the_reciprocal_of_the_global_scale():
    # e4m3 6.0, g = 2: 6 * rcp(2) = 3, so the fp16 value is 18, the scale 2 * 18/6 = 6 (0x4C), the output
    # scale 2 * rcp(6), and 18 * 0.3333 -> code 7. With 6 * g it would be 72 and a scale of 24 (0x5C).
    x = row_of({0: 6.0}, dtype=torch.float8_e4m3fn)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([2.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x4C]] and packed[0, 0].item() == 0x07


def test_fp8_input_drops_a_nan_element_from_the_block_amax():
    # e4m3 NaN next to 6.0 (g = 1): __hmax drops the NaN, amax 36, scale 0x4C; the NaN still encodes as 7.
    x = row_of({0: 6.0, 1: float("nan")}, dtype=torch.float8_e4m3fn)
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([1.0]), is_sf_swizzled_layout=False)
    assert sf.tolist() == [[0x4C]] and packed.tolist() == [[0x77] + [0] * 7]


# --- 6. FlashInfer's own op, 8x4 layout ----------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(torch.ops, "flashinfer") or not hasattr(torch.ops.flashinfer, "fp4_quantize"),
                    reason="this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
def test_flashinfers_op_honours_the_8x4_layout_flag_eagerly_and_compiled():
    x = torch.randn(20, 96, dtype=torch.bfloat16)
    scale = torch.tensor([11.0])
    want = flashinfer.fp4_quantize(x, scale, is_sf_8x4_layout=True)
    assert want[1].shape == (24, 8)  # 20 rows padded to 8-row tiles (128x4 would give 128)
    op = torch.ops.flashinfer.fp4_quantize
    for call in (op, torch.compile(lambda t, s, *a: op(t, s, *a), fullgraph=True, backend="aot_eager")):
        got = call(x, scale, 16, False, True, True, None)
        assert all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want))


# --- 7. the family ---------------------------------------------------------------------------------------------

def test_batched_quantize_fake_pads_scale_columns_like_the_kernel():
    # K = 96: K/16 = 6 scale columns, padded to 8 in the 128x4 layout; the fake must say so.
    x = torch.randn(2, 3, 96, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fp4_dynamo_shim.fp4_batched_quantize.default,
                          (x, torch.tensor([2.0]), 16, False, 0), test_utils=("test_faketensor",))
    compiled = torch.compile(lambda t, s: flashinfer.nvfp4_batched_quantize(t, s), fullgraph=True, backend="aot_eager")
    got, want = compiled(x, torch.tensor([2.0])), flashinfer.nvfp4_batched_quantize(x, torch.tensor([2.0]))
    assert want[1].shape == (2, 128 * 8)
    assert all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want))


def test_batched_quantize_takes_one_global_scale_per_row_not_per_batch():
    # B = 2 batches of M = 3 rows: a per-row scale has 3 values; 2 (the batch count) is refused.
    x = torch.full((2, 3, 16), 6.0, dtype=torch.bfloat16)
    _, scales = flashinfer.nvfp4_batched_quantize(x, torch.tensor([1.0, 2.0, 4.0]))
    from _fp4_dynamo_shim.fp4 import layout

    assert [layout.unswizzle(batch, 3, 1, False).flatten().tolist() for batch in scales] == [[0x38, 0x40, 0x48]] * 2
    with pytest.raises(ValueError, match="global scale"):
        flashinfer.nvfp4_batched_quantize(x, torch.tensor([1.0, 2.0]))


def test_mm_fp4_reads_8x4_activation_scales_as_8x4():
    # The same activation quantized with 128x4 and with 8x4 scale layouts must multiply to the same result.
    torch.manual_seed(3)
    a, w = torch.randn(20, 64, dtype=torch.bfloat16), torch.randn(24, 64, dtype=torch.bfloat16)
    a_scale, w_scale = torch.tensor([30.0]), torch.tensor([40.0])
    w_packed, w_sf = flashinfer.fp4_quantize(w, w_scale)
    alpha = 1.0 / (a_scale * w_scale)
    results = []
    for is_8x4 in (False, True):
        packed, sf = flashinfer.fp4_quantize(a, a_scale, is_sf_8x4_layout=is_8x4)
        results.append(flashinfer.mm_fp4(packed, w_packed.t(), sf, w_sf.t(), alpha, torch.float32,
                                         use_8x4_sf_layout=is_8x4))
    assert torch.equal(results[0], results[1])
    assert (results[0] - a.float() @ w.float().t()).abs().max() < 0.25 * (a.float() @ w.float().t()).abs().max()


@pytest.mark.parametrize("ufp8_type, factor", [(0, None), (1, 0.5), (2, 1.0)])
def test_dequantize_applies_the_global_scale_only_for_ufp8_type_1(ufp8_type, factor):
    # Codes 2 (1.0); scale byte 0x40 is e4m3 2.0, or as UE8M0 (type 0) 2^(64-127). Global scale 0.5.
    packed = torch.full((1, 8), 0x22, dtype=torch.uint8)
    scale = torch.tensor([0x40], dtype=torch.uint8)
    values = flashinfer.e2m1_and_ufp8sf_scale_to_float(packed, scale, torch.tensor([0.5]), 16, ufp8_type, False)
    expected = 2.0 ** (0x40 - 127) if ufp8_type == 0 else 2.0 * factor
    assert values.tolist() == [[expected] * 16]


# --- 8. switches and the start-up routes --------------------------------------------------------------------

@pytest.mark.parametrize("raw, value", [("TRUE", True), ("On", True), (" Yes ", True), ("1", True), ("oN\n", True),
                                        ("FALSE", False), ("Off", False), ("NO", False), ("0", False), ("", False)])
def test_switch_values_are_case_insensitive_and_stripped(raw, value):
    assert switches.read(SWITCH, {SWITCH: raw}) == (value, None)


@pytest.mark.parametrize("raw", ["2", "enabled", "TRUE!", "o n"])
def test_an_unknown_switch_value_is_off_with_a_problem_naming_it(raw):
    value, problem = switches.read(SWITCH, {SWITCH: raw})
    assert value is False and SWITCH in problem and repr(raw) in problem


@pytest.mark.slow
def test_the_sitecustomize_route_records_itself_and_honours_the_kill_switch(tmp_path):
    from _fp4_dynamo_shim.routes import site_files as hook

    hook.install_hook(tmp_path, check=False)  # the block calls install() with its default route
    code = ("import sys, flashinfer, _fp4_dynamo_shim.entry.startup as h; s = sys.modules.get('_fp4_dynamo_shim.lifecycle'); "
            "print(h.route, s.status()['activated_by'] if s else None)")
    assert run_python(code, extra_path=str(tmp_path)).stdout.split() == ["sitecustomize", "sitecustomize"]
    # FP4_DYNAMO_SHIM_DISABLE=1: install() puts no hook in place at all (not merely a refusing apply()).
    disabled = run_python(code, env={"FP4_DYNAMO_SHIM_DISABLE": "TRUE"}, extra_path=str(tmp_path))
    assert disabled.stdout.split() == ["None", "None"], disabled.stderr


def test_install_honours_the_kill_switch_in_process(monkeypatch):
    monkeypatch.setattr(startup, "_installed", False)
    monkeypatch.setattr(startup, "route", None)
    monkeypatch.setenv(switches.DISABLE, "Yes")
    before = list(sys.meta_path)
    startup.install()
    assert startup.route is None and sys.meta_path == before


def test_status_lists_what_the_plugin_rebound(tmp_path, monkeypatch):
    (tmp_path / "late_bound_layer.py").write_text("fp4_quantize = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_bound_layer

    try:
        late_bound_layer.fp4_quantize = patching.original_function()
        sglang.plugin()
        assert getattr(late_bound_layer.fp4_quantize, "__fp4_dynamo_shim__", False)
        assert "late_bound_layer.fp4_quantize" in fp4_dynamo_shim.status()["rebound"]
    finally:
        sys.modules.pop("late_bound_layer", None)


# --- 9. verify ---------------------------------------------------------------------------------------------------

def test_verifys_compiled_vs_eager_check_fails_on_a_one_bit_difference(monkeypatch):
    # Fault injection: the op's CPU kernel (what a compiled region runs) flips one bit; eager calls keep the
    # launcher the replacement bound when it was built.
    def flipped(input, *arguments):
        ops.launch_reference(input, *arguments)
        arguments[1].view(-1)[0] ^= 1

    monkeypatch.setattr(ops, "launch_for", lambda input: flipped)
    torch._dynamo.reset()
    with pytest.raises(AssertionError, match="compiled output differs from eager"):
        checks.check_compiled_matches_eager("cpu")
    monkeypatch.undo()
    torch._dynamo.reset()
    assert "equals eager bitwise" in checks.check_compiled_matches_eager("cpu")


def test_oracle_and_reference_agree_on_a_hand_computed_block():
    # A sanity anchor for the oracle itself: amax 6, g = 1 -> scale 1.0 (0x38), codes 7, 13 (-3), 3 (1.5).
    x = row_of({0: 6.0, 1: -3.0, 2: 1.5})
    assert fp4_oracle.quantize(x.float().tolist(), [1.0], 16, False) == ([[7 | 13 << 4, 3, 0, 0, 0, 0, 0, 0]], [[0x38]])
    assert not math.isnan(fp4_oracle.e4m3_value(0x7E)) and fp4_oracle.e4m3_value(0x7E) == 448.0


# --- found by the generated mutants (tools/mutation/run_mutmut.py) --------------------------------------------

def test_the_batched_and_grouped_quantizers_compute_in_the_kernel_mode_in_force(monkeypatch):
    # Fast math off changes this block's bytes (the NaN amax case above: scale 0x7F, codes 7 then 0 instead of
    # all 7): the family's quantizers read the switch as fp4_quantize does, rather than the default recipe.
    x = row_of({0: 1.0, **{i: float("nan") for i in range(1, 16, 2)}})
    scale = torch.tensor([3.0])
    default = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1")
    monkeypatch.setenv("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH", "1")
    want_packed, want_sf = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    assert (want_packed.tolist(), want_sf.tolist()) != (default[0].tolist(), default[1].tolist())
    from _fp4_dynamo_shim.fp4 import layout

    if hasattr(flashinfer, "nvfp4_batched_quantize"):
        packed, sf = flashinfer.nvfp4_batched_quantize(x.reshape(1, 1, 16), scale)
        assert packed.reshape(1, 8).tolist() == want_packed.tolist()
        assert layout.unswizzle(sf[0], 1, 1, False).tolist() == want_sf.tolist()
    if hasattr(flashinfer, "scaled_fp4_grouped_quantize"):
        packed, sf = flashinfer.scaled_fp4_grouped_quantize(x.reshape(1, 1, 16), torch.tensor([1], dtype=torch.int32),
                                                           scale)
        assert packed.permute(2, 0, 1).reshape(1, 8).tolist() == want_packed.tolist()
        grid = sf.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(-1)
        assert layout.unswizzle(grid, 1, 1, False).tolist() == want_sf.tolist()


def test_block_scale_interleave_of_no_experts_is_empty_like_its_fake():
    grids = torch.zeros(0, 5, 3, dtype=torch.uint8)
    out = torch.ops.fp4_dynamo_shim.block_scale_interleave.default(grids)
    assert out.shape == (0,) and out.dtype == torch.uint8
    torch.library.opcheck(torch.ops.fp4_dynamo_shim.block_scale_interleave.default, (grids,),
                          test_utils=("test_faketensor",))


def test_an_mxfp4_scale_below_two_to_the_minus_127_rounds_to_byte_0():
    # 0.7.4 keeps subnormals in MXFP4: amax 2^-130 / 6 = 2^-132.6, whose power of two rounded up (2^-132) is
    # below e8m0's smallest, 2^-127: byte 0 (cuda_fp8.hpp saturates there), and the block's codes are 0.
    arithmetic = targets.target_for("0.7.4").arithmetic
    x = torch.full((1, 32), 2.0 ** -130, dtype=torch.bfloat16)
    packed, sf = reference.quantize(x, None, 32, True, recipe=Recipe(arithmetic))
    assert sf.tolist() == [[0]] and packed.tolist() == [[0] * 16]
    assert fp4_oracle.quantize(x.float().tolist(), None, 32, True, release="0.7.4") == ([[0] * 16], [[0]])


def test_silu_and_mul_rounds_its_product_to_the_input_dtype_before_quantizing():
    # The kernel computes silu(gate) * up in float and stores it in the input dtype before quantizing; found
    # by search: quantizing this row's float32 product instead gives byte 73 and code 228 where bf16 gives 74, 227.
    if not hasattr(flashinfer, "silu_and_mul_scaled_nvfp4_experts_quantize"):
        pytest.skip("this FlashInfer has no silu_and_mul_scaled_nvfp4_experts_quantize")
    gate = [1.4765625, 2.90625, 3.546875, 5.3125, 2.875, 5.0625, -5.65625, -0.412109375, 5.3125, 1.7890625, 4.8125,
            -4.65625, -0.37109375, -3.046875, 0.5234375, 0.88671875]
    up = [-5.84375, -3.40625, -2.640625, 5.0, 3.1875, -4.09375, 3.5625, -4.34375, 1.40625, -4.46875, -5.96875,
          4.46875, -3.484375, -3.421875, 5.78125, 4.46875]
    x = torch.tensor([[gate + up]], dtype=torch.bfloat16)
    values, scales = flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(x, torch.tensor([1], dtype=torch.int32),
                                                                           torch.tensor([1.0]))
    from _fp4_dynamo_shim.fp4 import layout

    product = (x[..., :16].float() / (1.0 + torch.exp(-x[..., :16].float())) * x[..., 16:].float()).to(torch.bfloat16)
    want_packed, want_scales = fp4_oracle.quantize(product[0].float().tolist(), [1.0], 16, False)
    assert want_packed == [[203, 124, 227, 8, 179, 143, 0, 17]] and want_scales == [[74]]
    assert values.permute(2, 0, 1).reshape(1, 8).tolist() == want_packed
    grid = scales.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(-1)
    assert layout.unswizzle(grid, 1, 1, False).tolist() == want_scales


def test_status_describes_the_release_row_as_plain_data():
    import dataclasses
    import json

    for target in targets.TARGETS:
        row = targets.describe(target)
        assert json.loads(json.dumps(row)) == row
        expected = dataclasses.asdict(target)
        expected.update(versions=str(target.versions), kernel_args=list(target.kernel_args))
        expected["arithmetic"]["fast_math_switches"] = list(target.arithmetic.fast_math_switches)
        assert row == expected
    installed = targets.target_for(patching.flashinfer_version())
    assert fp4_dynamo_shim.status()["target"] == targets.describe(installed)


@pytest.mark.parametrize("version, row", [("0.5.3", 0), ("0.6.6.post1", 0), ("0.6.7", 1), ("0.6.10", 2), ("0.6.11", 3),
                                          ("0.6.12", 4), ("0.7.0.post1", 5), ("0.7.3", 6), ("0.7.4+cu128", 7),
                                          ("0.7.5rc1", None), ("0.7.5", None), ("0.5.2", None), ("0.7.4rc1", None),
                                          ("0.7.0rc1", 5), ("0.6.14.dev1", 5)])  # pre-releases inside a row
def test_each_version_string_finds_its_release_row(version, row):
    assert targets.target_for(version) == (None if row is None else targets.TARGETS[row])


def test_an_unset_switch_is_off_without_a_problem_and_a_bad_one_says_what_is_accepted():
    assert switches.read(SWITCH, {}) == (False, None)
    assert switches.read(SWITCH, {"OTHER": "1"}) == (False, None)
    value, problem = switches.read(SWITCH, {SWITCH: "maybe"})
    assert (value, problem) == (False, f"{SWITCH}='maybe' is not understood; use 1, true, yes or on to switch it "
                                       "on, or 0, false, no, off or unset for off (treated as off)")
