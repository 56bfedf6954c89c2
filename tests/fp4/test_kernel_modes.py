"""The CPU reference follows every switch the installed kernel reads, and its knowable edges, bit for bit.

Through the public ``flashinfer.fp4_quantize`` (the shim's CPU kernel is the reference), with the linear
layout so the scale bytes can be read directly. Expected bytes are worked out by hand from the kernel's
arithmetic (quantization_utils.cuh; the derivation is next to each case); what a release reads comes
from tests/support/release_facts.py, written down from each wheel.
"""

from __future__ import annotations

import inspect

import flashinfer
import pytest
import torch

from release_facts import installed_facts

FAST_MATH_OFF = "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH"
FOUR_OVER_SIX = "FLASHINFER_NVFP4_4OVER6"
SWITCHES = (FAST_MATH_OFF, "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", FOUR_OVER_SIX, "FLASHINFER_NVFP4_4OVER6_ERR_MODE",
            "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "FLASHINFER_NVFP4_4OVER6_E4M3_USE_256")


@pytest.fixture(autouse=True)
def no_switches(monkeypatch):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def quantize(values, global_scale, width=16, **kwargs):
    x = torch.zeros(1, width, dtype=torch.bfloat16)
    for index, value in values.items():
        x[0, index] = value
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor([global_scale]), is_sf_swizzled_layout=False, **kwargs)
    return packed[0].tolist(), sf[0].tolist()


# --- fast math off ------------------------------------------------------------------------------------

def test_fast_math_off_multiplies_in_the_kernels_order(no_switches):
    # Block 1, amax 9, g = 224: default 9 * f32(1/6) = 1.5 (rounded), * 224 = 336, exactly between e4m3 320
    # and 352 -> even 320 (byte 122). Fast math off: f32(224 * f32(1/6)) = 37.333336, * 9 = 336.00002 -> 352
    # (byte 123). Block 0 (amax 12) is 448 (byte 126) either way.
    values, g = {0: 12.0, 16: 9.0}, 2688 / 12
    assert quantize(values, g, width=32)[1] == [126, 122]
    switches = installed_facts().fast_math_switches
    for name in switches:
        no_switches.setenv(name, "1")
        assert quantize(values, g, width=32)[1] == [126, 123], name
        no_switches.setenv(name, "true")  # getBoolEnv: only "1" is on
        assert quantize(values, g, width=32)[1] == [126, 122], name
        no_switches.delenv(name)
    if not switches:
        no_switches.setenv(FAST_MATH_OFF, "1")
        assert quantize(values, g, width=32)[1] == [126, 122]  # this release has no such switch


def test_fast_math_off_saturates_where_the_default_gives_infinity(no_switches):
    # x0 = 6, g = 2^-12: scale 2^-12 rounds to e4m3 0 (byte 0). Default up to 0.7.2: output scale
    # rcp(0 * rcp(g)) = inf, so 6 -> +6 (code 7) and every 0 -> 0 * inf = NaN -> code 7; 0.7.4: 0 -> codes 0.
    # Fast math off: min(1 / 0, FLT_MAX) = FLT_MAX: 6 -> code 7, zeros stay 0.
    facts = installed_facts()
    packed, sf = quantize({0: 6.0}, 2.0 ** -12)
    assert sf == [0]
    assert packed == ([0x77] * 8 if facts.zero_scale == "amax" else [0] * 8)
    if facts.fast_math_switches:
        no_switches.setenv(facts.fast_math_switches[0], "1")
        assert quantize({0: 6.0}, 2.0 ** -12) == ([0x07] + [0] * 7, [0])


# --- 4over6 --------------------------------------------------------------------------------------------

def four_over_six_setting(no_switches, mode=None, fast_error=False):
    """Switch 4over6 on the way the installed release takes it; None when it has no 4over6."""
    facts = installed_facts()
    if facts.four_over_six == "none":
        return None
    no_switches.setenv(FOUR_OVER_SIX, "1")
    if mode:
        no_switches.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", mode)
    if fast_error:
        no_switches.setenv("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    return {}


def test_four_over_six_picks_the_four_based_scale_when_it_is_exact(no_switches):
    # x0 = 4, g = 1. 6-based: 4/6 -> e4m3 0.6875 (byte 0x33), 4 / 0.6875 = 5.8 -> 6 (code 7), error 0.125.
    # 4-based: 1.5 x 0.6667 = 1.0 (0x38), 4 -> 4 (code 6), error 0: it wins.
    assert quantize({0: 4.0}, 1.0) == ([0x07] + [0] * 7, [0x33])
    kwargs = four_over_six_setting(no_switches)
    if kwargs is None:
        assert quantize({0: 4.0}, 1.0) == ([0x07] + [0] * 7, [0x33])  # no 4over6 in this release: env ignored
        return
    with pytest.warns(FutureWarning) if installed_facts().four_over_six == "code" else _no_warning():
        assert quantize({0: 4.0}, 1.0) == ([0x06] + [0] * 7, [0x38])


def test_four_over_six_error_modes_choose_as_the_kernel_does(no_switches):
    # x = [6, 5, 4], g = 1. 6-based (sf 1.0, 0x38): 6 -> 6, 5 -> 4 (tie to the even code), 4 -> 4: errors
    # [0, 1, 0]. 4-based (sf 1.5, 0x3C): 4 -> 6, 3.33 -> 3 -> 4.5, 2.67 -> 3 -> 4.5: errors [0, .5, .5].
    # MAE: 1 vs 1, a tie keeps 6. MSE: 1 vs 0.5: 4 wins.
    values = {0: 6.0, 1: 5.0, 2: 4.0}
    if four_over_six_setting(no_switches) is None:
        pytest.skip("this FlashInfer has no 4over6 recipe")
    with _maybe_future_warning():
        assert quantize(values, 1.0) == ([0x67, 0x06] + [0] * 6, [0x38])
    no_switches.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "mse")  # case-insensitive, as toUpper in C++
    with _maybe_future_warning():
        assert quantize(values, 1.0) == ([0x56, 0x05] + [0] * 6, [0x3C])
    no_switches.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "MEDIAN")
    with pytest.raises(ValueError, match="MAE or MSE"):
        quantize(values, 1.0)


def test_four_over_six_fast_error_estimate_follows_the_release(no_switches):
    # Found by search (the estimate differs from the exact error only in rounding): with g = 1.7 the exact
    # error keeps the 6-based scale (byte 66) and the release's fast estimate picks the 4-based one (62).
    values = dict(enumerate([6.0, 4.5, 4.0, 1.5, 3.5, 3.25, 4.5, 2.75, 5.5, 4.0, 0.5, 3.25, 2.0, 2.5, 3.5, 4.5]))
    if four_over_six_setting(no_switches) is None:
        pytest.skip("this FlashInfer has no 4over6 recipe")
    with _maybe_future_warning():
        assert quantize(values, 1.7)[1] == [66]
    no_switches.setenv("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    with _maybe_future_warning():
        assert quantize(values, 1.7)[1] == [62]


def test_e4m3_use_256_changes_nothing_in_fp4_quantize(no_switches):
    # The kernel still clamps the e4m3 scale at 448; 256 only changes the per-token kernel's error denominator.
    values = {0: 6.0, 1: 5.0, 2: 4.0}
    if four_over_six_setting(no_switches) is None:
        pytest.skip("this FlashInfer has no 4over6 recipe")
    with _maybe_future_warning():
        before = quantize(values, 1.0)
    no_switches.setenv("FLASHINFER_NVFP4_4OVER6_E4M3_USE_256", "1")
    with _maybe_future_warning():
        assert quantize(values, 1.0) == before


def test_an_explicit_recipe_argument_wins_over_the_environment(no_switches):
    if "nvfp4_4over6" not in inspect.signature(flashinfer.fp4_quantize).parameters:
        pytest.skip("this FlashInfer's fp4_quantize has no nvfp4_4over6 parameter")
    from flashinfer.quantization.nvfp4_quantization_utils import NVFP44Over6Config

    no_switches.setenv(FOUR_OVER_SIX, "1")
    assert quantize({0: 4.0}, 1.0, nvfp4_4over6=None) == ([0x07] + [0] * 7, [0x33])
    no_switches.delenv(FOUR_OVER_SIX)
    assert quantize({0: 4.0}, 1.0, nvfp4_4over6=NVFP44Over6Config()) == ([0x06] + [0] * 7, [0x38])


def test_a_compiled_region_reads_the_switches_when_it_runs(no_switches):
    facts = installed_facts()
    if not facts.fast_math_switches:
        pytest.skip("this FlashInfer's kernel reads no switch")
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0], x[0, 16] = 12.0, 9.0
    g = torch.tensor([2688 / 12])
    compiled = torch.compile(lambda t, s: flashinfer.fp4_quantize(t, s, is_sf_swizzled_layout=False)[1],
                             fullgraph=True, backend="inductor")
    assert compiled(x, g).tolist() == [[126, 122]]
    no_switches.setenv(facts.fast_math_switches[0], "1")
    assert compiled(x, g).tolist() == [[126, 123]]  # same graph, no recompilation: the kernel reads it
    if facts.four_over_six != "none":
        no_switches.delenv(facts.fast_math_switches[0])
        no_switches.setenv(FOUR_OVER_SIX, "1")
        y = torch.zeros(1, 16, dtype=torch.bfloat16)
        y[0, 0] = 4.0
        assert compiled(y, torch.tensor([1.0])).tolist() == [[0x38]]
        # The error mode too (values as in the error-mode test: an MAE tie keeps 6, MSE picks 4).
        y[0, :3] = torch.tensor([6.0, 5.0, 4.0])
        assert compiled(y, torch.tensor([1.0])).tolist() == [[0x38]]
        no_switches.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "MSE")
        assert compiled(y, torch.tensor([1.0])).tolist() == [[0x3C]]


# --- edges the kernel's arithmetic decides ---------------------------------------------------------------

def test_nan_inputs_encode_as_the_hardware_conversion_does():
    # A NaN element, finite amax 6 (g = 1, scale 1.0): NaN -> +6 (code 7), 6 -> 6 (code 7), 2 -> code 4.
    assert quantize({0: 6.0, 1: 2.0, 3: float("nan")}, 1.0) == ([0x47, 0x70] + [0] * 6, [0x38])
    # Every odd element NaN: the kernel's max is (even > odd) ? even : odd, so the block amax is NaN,
    # the scale byte 0x7F and every code 7.
    values = {i: float("nan") for i in range(1, 16, 2)}
    values[0] = 1.0
    assert quantize(values, 1.0) == ([0x77] * 8, [0x7F])


def test_negative_zeros_and_flushed_subnormals_keep_their_sign():
    # A block of bf16 subnormals (-2^-130): under -use_fast_math its amax compares equal to 0, so it is a
    # zero block: scale byte 0, output scale 0, every code the signed zero 8.
    assert quantize({i: -(2.0 ** -130) for i in range(16)}, 1.0) == ([0x88] * 8, [0])
    assert quantize({0: 6.0, 1: -0.0}, 1.0) == ([0x87] + [0] * 7, [0x38])


def test_mxfp4_near_underflow_follows_the_release():
    # x0 = 2^-124 (a normal bf16), the rest 0. amax / 6 = 2^-126.6 is subnormal. Up to 0.7.2 the multiply
    # flushes it: byte 0, codes 0. 0.7.4 keeps subnormals: 2^-126.6 rounds up to 2^-126 (byte 1), output scale
    # 2^126, x0 -> 4 (code 6).
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0] = 2.0 ** -124
    packed, sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    if installed_facts().mxfp4_keeps_subnormals:
        assert (packed[0, 0].item(), sf.tolist()) == (0x06, [[1]])
    else:
        assert (packed[0, 0].item(), sf.tolist()) == (0x00, [[0]])


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _maybe_future_warning():
    """FlashInfer 0.7.x warns (FutureWarning) when the environment switches 4over6 on."""
    return pytest.warns(FutureWarning) if installed_facts().four_over_six == "code" else _no_warning()
