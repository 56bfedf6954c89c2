"""Property tests of the FP4 family's ops against the independent oracle: batched and per-expert quantize,
the scale-factor interleave and the dequantizers (each with its fake's shapes, strides and dtypes), and mm_fp4 as
the oracle's dequantized product (NVFP4 and MXFP4). Examples are fixed (``derandomize``); the "ci" profile bounds
their number, "long" is the longer run (docs/testing.md).
"""

from __future__ import annotations

import flashinfer
import numpy
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import fp4_oracle
import fp4_oracle_modes
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import reference
from fp4_strategies import float32, global_scales, matrices

INSTALLED = fp4_oracle_modes.release_of(lifecycle.flashinfer_version())


def _same_meta_under_fake_mode(op, arguments):
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = op(*arguments)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in arguments])
    real, fake = (list(r) if isinstance(r, (tuple, list)) else [r] for r in (real, fake))
    assert [(t.shape, t.stride(), t.dtype) for t in fake] == [(t.shape, t.stride(), t.dtype) for t in real]
    return real


@given(data=st.data(), g=st.floats(2.0 ** -7, 1024.0, width=32))
def test_batched_quantize_matches_the_oracle_and_its_fake(data, g):
    batches = data.draw(st.integers(1, 3))
    x, _ = data.draw(matrices(16, rows=st.sampled_from([1, 2, 3, 5]), max_blocks=5,
                              dtype=data.draw(st.sampled_from([torch.bfloat16, torch.float16]))))
    x = torch.cat([x] * batches).reshape(batches, x.shape[0], x.shape[1]).contiguous()
    per_row = data.draw(st.booleans())
    scales = [float32(g * (r + 1)) for r in range(x.shape[1])] if per_row else [float32(g)]
    op = torch.ops.fp4_dynamo_shim.fp4_batched_quantize.default
    packed, sf = _same_meta_under_fake_mode(op, (x, torch.tensor(scales), 16, False, 0))
    sf_columns = x.shape[2] // 16
    for b in range(batches):
        want_packed, want_scales = fp4_oracle.quantize(x[b].float().tolist(), scales, 16, False, release=INSTALLED)
        assert packed[b].tolist() == want_packed
        assert sf[b].tolist() == fp4_oracle.swizzled(want_scales, sf_columns, False)


@given(data=st.data(), silu=st.booleans())
def test_experts_quantize_matches_the_oracle_per_expert_and_its_fake(data, silu):
    experts = data.draw(st.integers(1, 3))
    rows = data.draw(st.sampled_from([1, 3, 5]))
    columns = 16 * data.draw(st.integers(1, 5))
    x = torch.tensor(data.draw(st.lists(st.floats(-6, 6, width=32), min_size=experts * rows * columns * (2 if silu else 1),
                                        max_size=experts * rows * columns * (2 if silu else 1))))
    x = x.reshape(experts, rows, -1).to(torch.bfloat16)
    scales = [float32(data.draw(st.floats(0.125, 128.0, width=32))) for _ in range(experts)]
    mask = torch.tensor([data.draw(st.integers(0, rows)) for _ in range(experts)], dtype=torch.int32)
    op = torch.ops.fp4_dynamo_shim.fp4_experts_quantize.default
    values, sf = _same_meta_under_fake_mode(op, (x, torch.tensor(scales), mask, silu, 0))
    if silu:  # the kernel's silu_and_mul in float, rounded to the input dtype (the reference's step)
        gate, up = x[..., :columns].float(), x[..., columns:].float()
        x = (gate / (1.0 + torch.exp(-gate)) * up).to(torch.bfloat16)
    sf_bytes = sf.view(torch.uint8).reshape(experts, -1)
    for e in range(experts):
        valid = int(mask[e])
        want_packed, want_scales = fp4_oracle.quantize(x[e].float().tolist(), [scales[e]], 16, False, release=INSTALLED)
        want_packed = [row if r < valid else [0] * (columns // 2) for r, row in enumerate(want_packed)]
        want_scales = [row if r < valid else [0] * (columns // 16) for r, row in enumerate(want_scales)]
        assert values[e].tolist() == want_packed
        assert sf_bytes[e].tolist() == fp4_oracle.swizzled(want_scales, columns // 16, False)


@given(rows=st.sampled_from([1, 5, 127, 129]), columns=st.integers(1, 9), experts=st.sampled_from([None, 1, 2]),
       bf16=st.booleans())
def test_block_scale_interleave_matches_the_kernels_offsets_and_its_fake(rows, columns, experts, bf16):
    shape = (rows, columns) if experts is None else (experts, rows, columns)
    grid = (torch.arange(int(numpy.prod(shape))) % 251 + 1).to(torch.uint8).reshape(shape)
    if bf16:
        grid = grid.to(torch.bfloat16)
    out = _same_meta_under_fake_mode(torch.ops.fp4_dynamo_shim.block_scale_interleave.default, (grid,))[0]
    expected = []
    for expert in (grid.reshape(-1, rows, columns)):
        expected += fp4_oracle.swizzled(expert.float().tolist(), columns, False)
    assert out.float().tolist() == [float(v) for v in expected]


@given(data=st.data(), ufp8_type=st.sampled_from([0, 1, 2]), layout_choice=st.sampled_from(["linear", "128x4", "8x4"]),
       g=st.floats(2.0 ** -10, 1024.0, width=32))
def test_dequantize_matches_the_oracles_decode(data, ufp8_type, layout_choice, g):
    rows = data.draw(st.sampled_from([1, 2, 9, 129]))
    sf_vec_size = data.draw(st.sampled_from([16, 32]))
    sf_columns = data.draw(st.integers(1, 5))
    codes = [[data.draw(st.integers(0, 255)) for _ in range(sf_columns * sf_vec_size // 2)] for _ in range(rows)]
    scales = [[data.draw(st.integers(0, 254)) for _ in range(sf_columns)] for _ in range(rows)]
    flat = ([b for row in scales for b in row] if layout_choice == "linear"
            else fp4_oracle.swizzled(scales, sf_columns, layout_choice == "8x4"))
    values = flashinfer.e2m1_and_ufp8sf_scale_to_float(
        torch.tensor(codes, dtype=torch.uint8), torch.tensor(flat, dtype=torch.uint8), torch.tensor([g]), sf_vec_size,
        ufp8_type, layout_choice != "linear", layout_choice == "8x4")

    def scale_of(byte):  # fp4Op.cpp: float scaleFloat, then scaleFloat *= globalScaleVal (1 unless type 1)
        if ufp8_type == 0:  # uint32(byte) << 23 read as float: 2^(byte - 127), byte 0 -> 0
            return 0.0 if byte == 0 else 2.0 ** (byte - 127)
        return float32(fp4_oracle.e4m3_value(byte) * (float32(g) if ufp8_type == 1 else 1.0))

    want = [[float32(fp4_oracle.e2m1_value((codes[r][i // 2] >> (4 * (i % 2))) & 0xF) * scale_of(scales[r][i // sf_vec_size]))
             for i in range(sf_columns * sf_vec_size)] for r in range(rows)]
    assert numpy.array_equal(values.numpy(), numpy.array(want, dtype=numpy.float32), equal_nan=True)
    if layout_choice != "8x4":  # the reference on its own: 128x4 by default (as tests/gpu call it), and like
        # fp4Op.cpp it reads the global scale's first element only
        direct = reference.e2m1_and_ufp8sf_scale_to_float(
            torch.tensor(codes, dtype=torch.uint8), torch.tensor(flat, dtype=torch.uint8), torch.tensor([g, 3.0]),
            sf_vec_size, ufp8_type, layout_choice != "linear")
        assert numpy.array_equal(direct.numpy(), values.numpy(), equal_nan=True)


@given(data=st.data(), ue8m0=st.booleans(), scale_form=st.sampled_from(["none", "float", "one", "per-row"]))
def test_reference_dequantize_matches_the_oracles_decode_for_every_global_scale_form(data, ue8m0, scale_form):
    # reference.dequantize (mm_fp4's reference and the tests' decoder): e4m3 scales divided by the global scale
    # (None, a float, one value, one per row), or e8m0 scales 2^(byte - 127) with no global scale.
    rows, sf_columns = data.draw(st.sampled_from([1, 2, 3, 5])), data.draw(st.integers(1, 5))
    sf_vec_size = 32 if ue8m0 else 16
    codes = [[data.draw(st.integers(0, 255)) for _ in range(sf_columns * sf_vec_size // 2)] for _ in range(rows)]
    scale_bytes = st.integers(0, 254) if ue8m0 else st.integers(0, 126)  # 0x7F: e4m3 NaN
    scales = [[data.draw(scale_bytes) for _ in range(sf_columns)] for _ in range(rows)]
    g = [float32(data.draw(st.sampled_from([0.25, 2.0, 448.0]) if scale_form == "float" else global_scales))
         for _ in range(rows if scale_form == "per-row" else 1)]
    global_scale = {"none": None, "float": g[0], "one": torch.tensor(g[:1]), "per-row": torch.tensor(g)}[scale_form]
    values = reference.dequantize(torch.tensor(codes, dtype=torch.uint8), torch.tensor(scales, dtype=torch.uint8),
                                  global_scale, sf_vec_size, ue8m0)

    def scale_of(r, byte):
        if ue8m0:
            return numpy.float32(fp4_oracle.e8m0_value(byte))
        decoded = numpy.float32(fp4_oracle.e4m3_value(byte))
        return decoded if global_scale is None else decoded / numpy.float32(g[r if len(g) > 1 else 0])

    with numpy.errstate(all="ignore"):
        want = numpy.array([[numpy.float32(fp4_oracle.e2m1_value((codes[r][i // 2] >> 4 * (i % 2)) & 0xF))
                             * scale_of(r, scales[r][i // sf_vec_size]) for i in range(sf_columns * sf_vec_size)]
                            for r in range(rows)], dtype=numpy.float32)
    assert values.dtype == torch.float32 and values.shape == (rows, sf_columns * sf_vec_size)
    assert numpy.array_equal(values.numpy(), want, equal_nan=True)


@given(data=st.data(), with_alpha=st.booleans())
def test_mxfp4_mm_fp4_matches_the_oracles_dequantized_product(data, with_alpha):
    # MXFP4 operands (use_nvfp4=False): e8m0 scales per 32 elements, no global scales.
    rows, outputs = data.draw(st.sampled_from([1, 3, 9])), data.draw(st.sampled_from([1, 4]))
    columns = 32 * data.draw(st.integers(1, 3))
    small = st.one_of(st.floats(-4, 4, width=32), st.sampled_from([0.0, -0.0, 2.0 ** -20, 3.0e4, -448.0]))
    a, w = (torch.tensor(data.draw(st.lists(small, min_size=n * columns, max_size=n * columns)))
            .reshape(n, columns).to(torch.bfloat16) for n in (rows, outputs))
    a_packed, a_sf = flashinfer.fp4_quantize(a, None, 32, True, True)
    w_packed, w_sf = flashinfer.fp4_quantize(w, None, 32, True, True)
    alpha = torch.tensor([0.375]) if with_alpha else None
    out = flashinfer.mm_fp4(a_packed, w_packed.t(), a_sf, w_sf.t(), alpha, torch.float32, block_size=32,
                            use_nvfp4=False)

    def dequantized(values):
        packed, scales = fp4_oracle.quantize(values, None, 32, True, release=INSTALLED)
        return numpy.array([[fp4_oracle.e2m1_value((p[i // 2] >> 4 * (i % 2)) & 0xF) * fp4_oracle.e8m0_value(s[i // 32])
                             for i in range(len(p) * 2)] for p, s in zip(packed, scales)])

    want = dequantized(a.float().tolist()) @ dequantized(w.float().tolist()).T * (0.375 if with_alpha else 1)
    assert out.shape == (rows, outputs) and out.dtype == torch.float32
    numpy.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * (numpy.abs(want).max() + 1))


@given(data=st.data(), is_8x4=st.booleans(), with_alpha=st.booleans())
def test_mm_fp4_matches_the_oracles_dequantized_product(data, is_8x4, with_alpha):
    rows, outputs = data.draw(st.sampled_from([1, 3, 9])), data.draw(st.sampled_from([1, 4]))
    blocks = data.draw(st.integers(1, 4))
    a, a_values = data.draw(matrices(16, rows=st.just(rows), max_blocks=blocks, dtype=torch.bfloat16))
    columns = a.shape[1]
    w = torch.tensor(data.draw(st.lists(st.floats(-4, 4, width=32), min_size=outputs * columns,
                                        max_size=outputs * columns))).reshape(outputs, columns).to(torch.bfloat16)
    assume(torch.isfinite(a.float()).all())
    a_scale, w_scale = torch.tensor([3.0]), torch.tensor([5.0])
    a_packed, a_sf = flashinfer.fp4_quantize(a, a_scale, is_sf_8x4_layout=is_8x4)
    w_packed, w_sf = flashinfer.fp4_quantize(w, w_scale)
    alpha = torch.tensor([0.125]) if with_alpha else None
    out = flashinfer.mm_fp4(a_packed, w_packed.t(), a_sf, w_sf.t(), alpha, torch.float32, use_8x4_sf_layout=is_8x4)

    def dequantized(values, g):
        packed, scales = fp4_oracle.quantize(values, [g], 16, False, release=INSTALLED)
        return numpy.array([[fp4_oracle.e2m1_value((p[i // 2] >> 4 * (i % 2)) & 0xF) * fp4_oracle.e4m3_value(s[i // 16])
                             for i in range(len(p) * 2)] for p, s in zip(packed, scales)])

    want = dequantized(a.float().tolist(), 3.0) @ dequantized(w.float().tolist(), 5.0).T * (0.125 if with_alpha else 1)
    assert out.shape == (rows, outputs)
    numpy.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * (numpy.abs(want).max() + 1))
