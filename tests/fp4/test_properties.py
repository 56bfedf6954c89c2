"""Property tests of fp4_quantize: its parameter space against the independent oracle, and eager against
compiled, and the switches and status it reads.

Shapes with K/16 % 4 in {0, 1, 2, 3} and M in {0, 1, 127, 129}, global scales over the whole float32 range
(negative, subnormal, zero, infinite, NaN), every layout flag, every kernel mode each release has (fast
math x 4over6 x MAE/MSE x fast error, set through the switches the kernel reads, in mixed case and with
unknown values), NaN/inf/subnormal elements and FP8 input. The installed release runs through
``flashinfer.fp4_quantize``; every other release's row of ``targets.py`` through the reference it selects
(``_fp4_dynamo_shim.fp4.reference.quantize`` with the row's arithmetic), against the oracle's own reading of that
release. Examples are fixed (``derandomize``); the "ci" profile bounds their number, "long" is the longer
run (docs/testing.md).
"""

from __future__ import annotations

import inspect

import flashinfer
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import fp4_dynamo_shim
from _fp4_dynamo_shim import switches
import fp4_oracle
import fp4_oracle_modes
from _fp4_dynamo_shim.fp4 import arithmetic
from _fp4_dynamo_shim.fp4 import layout
from _fp4_dynamo_shim.fp4 import devices
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import reference
from _fp4_dynamo_shim.fp4 import fp4_releases
from helpers import apply_with, installed_target
import stand_in_gpu
from fp4_strategies import float32, global_scales, matrices

INSTALLED = fp4_oracle_modes.release_of(lifecycle.flashinfer_version())
#: One version per range of releases whose kernel arithmetic differs (and the rows before any switch).
ROW_VERSIONS = ("0.6.11", "0.6.12", "0.6.13", "0.7.1", "0.7.4")
SWITCHES = ("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH", "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "FLASHINFER_NVFP4_4OVER6",
            "FLASHINFER_NVFP4_4OVER6_ERR_MODE", "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH")

#: An on/off variable: every one is read by the same parser.
SWITCH = switches.STRICT


# --- strategies -------------------------------------------------------------------------------------------

def environments(release_switches=SWITCHES):
    """The switch variables as a user might set them: "1", other spellings the kernel does not accept."""
    value = st.sampled_from(["1", "0", "true", "TRUE", " 1", "1 ", "yes"])
    mode = st.sampled_from(["MAE", "mse", "MsE", "mae", "median"])
    return st.fixed_dictionaries({}, optional={
        **{name: value for name in release_switches if not name.endswith("ERR_MODE")},
        "FLASHINFER_NVFP4_4OVER6_ERR_MODE": mode,
    })


# --- helpers ----------------------------------------------------------------------------------------------

def expected_sf(scales, rows, sf_columns, swizzled, is_8x4):
    """The scale-factor output of the installed release, as a flat list, from the oracle's row grid."""
    if not swizzled:
        return [byte for row in scales for byte in row]
    return fp4_oracle.swizzled(scales, sf_columns, is_8x4)


def oracle_mode(release, environ, code=None):
    if code is None or code == 0 and release not in ("0.7.1", "0.7.4"):
        return fp4_oracle_modes.mode_from_environment(release, environ)
    return fp4_oracle_modes.mode_from_code(release, code, environ)


# --- fp4_quantize of the installed release against the oracle ----------------------------------------------

@given(data=st.data(), swizzled=st.booleans(), is_8x4=st.booleans(), inversed=st.booleans(),
       nvfp4=st.booleans(), g=global_scales)
def test_fp4_quantize_matches_the_oracle(data, swizzled, is_8x4, inversed, nvfp4, g, monkeypatch):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    sf_vec_size = 16 if nvfp4 else 32
    x, values = data.draw(matrices(sf_vec_size))
    rows, columns = x.shape
    with_scale = nvfp4 or data.draw(st.booleans())  # MXFP4 takes None (the kernel then reads 1)
    scale = torch.tensor([g], dtype=torch.float32) if with_scale else None
    packed, sf = flashinfer.fp4_quantize(x, scale, sf_vec_size, not nvfp4, swizzled, is_8x4, inversed)
    want_packed, want_scales = fp4_oracle.quantize(values, [g] if with_scale else None, sf_vec_size, not nvfp4,
                                                   x.dtype == torch.float8_e4m3fn, inversed, release=INSTALLED)
    sf_columns = columns // sf_vec_size
    tile = 8 if is_8x4 else 128
    padded = -(-sf_columns // 4) * 4
    if swizzled:
        assert sf.shape == (-(-rows // tile) * tile, padded)  # 0.7.4: (-1, round_up(K/sfv, 4))
    else:
        assert sf.shape == (rows, sf_columns)
    assert packed.shape == (rows, columns // 2) and packed.dtype == sf.dtype == torch.uint8
    assert packed.tolist() == want_packed
    assert sf.reshape(-1).tolist() == expected_sf(want_scales, rows, sf_columns, swizzled, is_8x4)


@given(data=st.data(), g=st.lists(global_scales, min_size=1, max_size=1))
def test_a_row_wise_global_scale_scales_each_row_by_its_own_value(data, g):
    if not installed_target().row_wise_global_scale:
        pytest.skip("this FlashInfer takes one global scale")
    x, values = data.draw(matrices(16, rows=st.sampled_from([1, 2, 3, 5]), dtype=torch.bfloat16))
    scales = data.draw(st.lists(global_scales, min_size=x.shape[0], max_size=x.shape[0]))
    packed, sf = flashinfer.fp4_quantize(x, torch.tensor(scales, dtype=torch.float32), is_sf_swizzled_layout=False)
    want = fp4_oracle.quantize(values, [float32(s) for s in scales], 16, False, release=INSTALLED)
    assert (packed.tolist(), sf.tolist()) == want


# --- every release row's arithmetic and switches, through the reference it selects -------------------------

@pytest.mark.parametrize("version", ROW_VERSIONS)
@given(data=st.data(), g=global_scales, inversed=st.booleans())
def test_each_release_rows_reference_matches_the_oracle_in_every_mode(version, data, g, inversed):
    release = fp4_oracle_modes.release_of(version)
    row_arithmetic = fp4_releases.target_for(version).arithmetic
    environ = data.draw(environments())
    code = None
    if row_arithmetic.four_over_six == "code":  # 0.7.1+: the code FlashInfer's Python passes (-1: the environment)
        code = data.draw(st.sampled_from([-1, 0, 1, 5, 17, 21, 3, 2, 8, 33]))
    nvfp4 = data.draw(st.booleans())
    x, values = data.draw(matrices(16 if nvfp4 else 32, rows=st.sampled_from([1, 2, 3]), max_blocks=3))
    fp8 = x.dtype == torch.float8_e4m3fn
    try:
        want_mode = oracle_mode(release, environ, code)
    except ValueError:
        with pytest.raises(ValueError):
            arithmetic.recipe(row_arithmetic, code or 0, environ)
        return
    if fp8 or not nvfp4:  # only NVFP4 from 16-bit input has 4over6 (FlashInfer passes code 0 for the rest)
        assume(code in (None, 0, -1))
        want_mode = fp4_oracle_modes.Mode(want_mode.fast_math)
        code = 0 if code is not None else None
    recipe = arithmetic.recipe(row_arithmetic, code or 0, environ)
    packed, sf = reference.quantize(x, torch.tensor([g]), 16 if nvfp4 else 32, not nvfp4, inversed, recipe=recipe)
    want = fp4_oracle.quantize(values, [g], 16 if nvfp4 else 32, not nvfp4, fp8, inversed, want_mode, release)
    assert (packed.tolist(), sf.tolist()) == want
    assert packed.dtype == sf.dtype == torch.uint8


def _battery_values(rng, blocks, size):
    """One row: each block ordinary (its own magnitude), all zero, all NaN, subnormal-small, or near the top of
    bf16, with specials sprinkled in."""
    specials = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 2.0 ** -130, 2.0 ** -24, 448.0, 0.25, 0.75,
                2.5, 5.0, 6.0]
    row = []
    for _ in range(blocks):
        kind = rng.choice(["ordinary"] * 6 + ["zero", "nan", "tiny", "huge"])
        magnitude = {"tiny": 2.0 ** -131, "huge": 2.0 ** 120}.get(kind, 2.0 ** rng.randint(-14, 14))
        for _ in range(size):
            if kind in ("zero", "nan"):
                row.append(0.0 if kind == "zero" else float("nan"))
            else:
                row.append(rng.choice(specials) if rng.random() < 0.1 else rng.gauss(0.0, 1.0) * magnitude)
    return row


def _battery_call(case):
    """(reference bytes, oracle bytes) of one call given as plain data (a battery entry, or one from
    tests/data/fp4_cases.json)."""
    release, row_arithmetic = fp4_oracle_modes.release_of(case["version"]), fp4_releases.target_for(case["version"]).arithmetic
    x = torch.tensor(case["values"], dtype=torch.float32).reshape(case["rows"], -1)
    dtype = getattr(torch, case["dtype"])
    x = (x.clamp(-448, 448) if dtype is torch.float8_e4m3fn else x).to(dtype)
    setting = case["four_over_six"]
    recipe = arithmetic.Recipe(row_arithmetic, case["fast_math"], arithmetic.FourOverSix(*setting) if setting else None)
    g = case["global_scale"]
    size = 32 if case["ue8m0"] else 16
    packed, sf = reference.quantize(x, None if g is None else torch.tensor([g], dtype=torch.float32), size,
                                    case["ue8m0"], case["inversed"], recipe=recipe)
    assert packed.dtype == sf.dtype == torch.uint8
    mode = fp4_oracle_modes.Mode(case["fast_math"], bool(setting), *(setting or (False, False)))
    want = fp4_oracle.quantize(x.float().tolist(), None if g is None else [g], size, case["ue8m0"],
                               dtype is torch.float8_e4m3fn, case["inversed"], mode, release)
    return (packed.tolist(), sf.tolist()), want


def test_every_mode_of_every_release_row_matches_the_oracle_on_a_fixed_battery():
    # Each release row x each mode it has (fast math x 4over6 x MAE/MSE x fast error) x each scale format and
    # input dtype, on rows of 2-3 blocks with their own magnitudes, specials, and global scales across the
    # range: the property tests above sample this space; this covers every cell of it on every run.
    import random

    rng = random.Random(17)
    scales = [1.0, 2688.0, 14.517072677612305, 1.7, 2.0 ** -12, 1e-30, 3.0e30, -2.5, 0.0, float("inf")]
    cases = 0
    for version in ROW_VERSIONS:
        row_arithmetic = fp4_releases.target_for(version).arithmetic
        fast_maths = (True, False) if row_arithmetic.fast_math_switches else (True,)
        settings = [None] + ([[mse, fast] for mse in (False, True) for fast in (False, True)]
                             if row_arithmetic.four_over_six != "none" else [])
        for fast_math in fast_maths:
            for setting in settings:
                for ue8m0, dtype in ((False, "bfloat16"), (False, "float16"), (False, "float8_e4m3fn"),
                                     (True, "bfloat16"), (True, "float8_e4m3fn")):
                    if setting and (ue8m0 or dtype == "float8_e4m3fn"):
                        continue  # 4over6 is NVFP4 from 16-bit input only
                    for inversed in (False, True):
                        rows, blocks = 3, 2 if ue8m0 else 3
                        values = [v for r in range(rows) for v in _battery_values(rng, blocks, 32 if ue8m0 else 16)]
                        case = dict(version=version, dtype=dtype, ue8m0=ue8m0, fast_math=fast_math,
                                    four_over_six=setting, rows=rows, values=values, inversed=inversed,
                                    global_scale=None if ue8m0 and inversed else rng.choice(scales))
                        got, want = _battery_call(case)
                        assert got == want, {k: v for k, v in case.items() if k != "values"}
                        cases += 1
    assert cases == 218


def test_the_searched_inputs_match_the_oracle():
    # Calls that tell a plausible arithmetic mistake from the kernel's arithmetic, found by a random search
    # against mutmut's mutants of fp4_arithmetic; expected bytes from the oracle.
    import json
    from pathlib import Path

    cases = json.loads((Path(__file__).parents[1] / "data" / "fp4_cases.json").read_text())
    for case in cases:
        got, want = _battery_call(case)
        assert got == want, case["found_for"]


# --- eager against compiled, the direct path against the general one --------------------------------------

@given(data=st.data(), swizzled=st.booleans(), is_8x4=st.booleans(), column_major=st.booleans(),
       three_d=st.booleans(), backend=st.sampled_from(["eager", "aot_eager"]))
def test_compiled_fp4_quantize_matches_eager(data, swizzled, is_8x4, column_major, three_d, backend):
    # Column-major input is quantized along M (FlashInfer transposes it), so M is then a multiple of 16.
    x, _ = data.draw(matrices(16, rows=st.sampled_from([32] if column_major else [1, 2, 4, 6]), max_blocks=4))
    if three_d and x.shape[0] % 2 == 0:
        x = x.reshape(2, x.shape[0] // 2, x.shape[1])
    if column_major:
        x = x.transpose(-2, -1).contiguous().transpose(-2, -1)
    scale = torch.tensor([data.draw(global_scales)], dtype=torch.float32)
    call = lambda t, s: flashinfer.fp4_quantize(t, s, 16, False, swizzled, is_8x4)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend=backend)
    for got, want in zip(compiled(x, scale), call(x, scale)):
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
        assert torch.equal(got, want)


@given(data=st.data(), g=global_scales)
def test_the_direct_path_gives_the_general_paths_bytes(data, g):
    """Stand-in for the GPU's JIT entry (cannot run here), as in test_battery: CPU tensors take the direct
    path and reach an entry that fills the buffers with the reference, in the release's argument order."""
    entered = []
    x, _ = data.draw(matrices(16, dtype=data.draw(st.sampled_from([torch.bfloat16, torch.float16]))))
    scale = torch.tensor([g], dtype=torch.float32)
    extra = {"nvfp4_4over6": None} if "nvfp4_4over6" in inspect.signature(flashinfer.fp4_quantize).parameters else {}
    general = flashinfer.fp4_quantize(x, scale, **extra)
    with devices.overridden(**stand_in_gpu.direct_path_on_cpu(stand_in_gpu.reference_entry(entered))):
        direct = flashinfer.fp4_quantize(x, scale, **extra)
    assert [input_shape[0] for input_shape, _, _ in entered] == ([x.shape[0]] if x.shape[0] else [])
    for got, want in zip(direct, general):
        assert (got.shape, got.stride()) == (want.shape, want.stride()) and torch.equal(got, want)


# --- switches ----------------------------------------------------------------------------------------------

WORDS = switches.TRUE + switches.FALSE + ("",)  # unset and empty are off too
spellings = st.one_of(
    st.tuples(st.sampled_from(WORDS), st.lists(st.booleans(), min_size=5, max_size=5), st.sampled_from(["", " ", "\t", "\n "]))
    .map(lambda t: t[2] + "".join(c.upper() if up else c for c, up in zip(t[0], t[1] + [False] * 10)) + t[2]),
    st.text(max_size=6),
)


@given(raw=spellings)
def test_a_switch_reads_every_spelling_of_its_words_and_names_anything_else(raw):
    value, problem = switches.read(SWITCH, {SWITCH: raw})
    word = raw.strip().lower()
    assert value == (word in switches.TRUE)
    assert (problem is None) == (word in WORDS)
    if problem:
        assert SWITCH in problem and repr(raw) in problem


@given(environ=environments())
def test_the_reference_reads_the_kernels_switches_exactly_as_the_kernel(environ):
    # getBoolEnv: only the exact "1" is on; the error mode is upper-cased and must be MAE or MSE.
    for version in ROW_VERSIONS:
        row_arithmetic = fp4_releases.target_for(version).arithmetic
        release = fp4_oracle_modes.release_of(version)
        try:
            want = fp4_oracle_modes.mode_from_environment(release, environ)
        except ValueError:
            with pytest.raises(ValueError):
                arithmetic.recipe(row_arithmetic, -1 if row_arithmetic.four_over_six == "code" else 0, environ)
            continue
        got = arithmetic.recipe(row_arithmetic, -1 if row_arithmetic.four_over_six == "code" else 0, environ)
        assert (got.fast_math, got.four_over_six is not None) == (want.fast_math, want.four_over_six), version
        if want.four_over_six:
            assert (got.four_over_six.mse, got.four_over_six.fast_error) == (want.mse, want.fast_error), version


@given(values=st.fixed_dictionaries({}, optional={
    "FP4_DYNAMO_SHIM_FALLBACK": st.sampled_from(["error", "Reference", "launch", "referense", ""]),
    "FP4_DYNAMO_SHIM_CUDA_VERSION": st.sampled_from(["torch", "12.8", "twelve", "nvcc"]),
    "FP4_DYNAMO_SHIM_STRICT": st.sampled_from(["0", "no", "Off", "2"]),
}))
def test_status_keeps_its_keys_and_names_every_unknown_value(values, monkeypatch):
    try:
        state = apply_with(monkeypatch, **values)
        assert state["applied"]
        assert tuple(state) == lifecycle.STATUS_KEYS
        unknown = [n for n, v in values.items() if v in ("referense", "twelve", "2")]
        assert sorted(n for n in unknown if any(n in w for w in state["warnings"])) == sorted(unknown)
    finally:
        fp4_dynamo_shim.revert()
        monkeypatch.undo()
        fp4_dynamo_shim.apply()


def test_layout_shapes_are_the_kernels_for_every_tile_and_remainder():
    for rows in (0, 1, 7, 8, 9, 127, 128, 129):
        for sf_columns in range(1, 9):
            for is_8x4 in (False, True):
                tile = 8 if is_8x4 else 128
                assert layout.swizzled_sf_shape(rows, sf_columns, is_8x4) == (-(-rows // tile) * tile, -(-sf_columns // 4) * 4)
