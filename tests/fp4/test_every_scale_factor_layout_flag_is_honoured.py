"""Every scale-factor layout flag is honoured where a default layout would hide it: FlashInfer's op with 8x4
tiles, the family's fakes and mm_fp4's reading of 8x4 activation scales."""

from __future__ import annotations

import itertools

import flashinfer
import pytest
import torch

from nvfp4_inputs import LAYOUTS, nvfp4_input


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


def test_batched_quantize_fake_pads_scale_columns_like_the_kernel():
    # K = 96: K/16 = 6 scale columns, padded to 8 in the 128x4 layout; the fake must say so.
    x = torch.randn(2, 3, 96, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fp4_dynamo_shim.fp4_batched_quantize.default,
                          (x, torch.tensor([2.0]), 16, False, 0), test_utils=("test_faketensor",))
    compiled = torch.compile(lambda t, s: flashinfer.nvfp4_batched_quantize(t, s), fullgraph=True, backend="aot_eager")
    got, want = compiled(x, torch.tensor([2.0])), flashinfer.nvfp4_batched_quantize(x, torch.tensor([2.0]))
    assert want[1].shape == (2, 128 * 8)
    assert all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want))


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


def test_block_scale_interleave_of_no_experts_is_empty_like_its_fake():
    grids = torch.zeros(0, 5, 3, dtype=torch.uint8)
    out = torch.ops.fp4_dynamo_shim.block_scale_interleave.default(grids)
    assert out.shape == (0,) and out.dtype == torch.uint8
    torch.library.opcheck(torch.ops.fp4_dynamo_shim.block_scale_interleave.default, (grids,),
                          test_utils=("test_faketensor",))


RECIPES = [(16, False), (32, True)]  # NVFP4, MXFP4
SHAPES = [(1, 64), (130, 96), (128, 2048)]


def _meta(outputs):
    return [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in outputs]


def _every_call():
    for (rows, columns), layout, (sf_vec_size, ue8m0), swizzled, is_8x4 in itertools.product(
            SHAPES, LAYOUTS, RECIPES, (True, False), (False, True)):
        if layout.endswith("column-major") and rows % sf_vec_size:  # column-major input quantizes along M
            continue
        yield (rows, columns, layout), (sf_vec_size, ue8m0, swizzled, is_8x4)


@pytest.mark.parametrize("op_name", ["fp4_dynamo_shim", "flashinfer"])
def test_each_ops_fake_gives_the_real_outputs_shapes_strides_and_dtypes_for_every_layout(op_name):
    """Both ops the shim registers a fake for (its own, and FlashInfer's repaired one): under FakeTensorMode and
    on meta tensors, every layout flag, recipe, input layout and an unaligned shape give what the op returns
    for real (the reference on CPU: on the GPU the kernel writes the same buffers, tests/gpu/test_gpu_core.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    namespace = getattr(torch.ops, op_name, None)
    if namespace is None or not hasattr(namespace, "fp4_quantize"):
        pytest.skip(f"this FlashInfer registers no torch.ops.{op_name}.fp4_quantize")
    op = namespace.fp4_quantize
    extra = (0,) if op_name == "fp4_dynamo_shim" else ()  # the shim's op also takes the 4over6 code
    inversed = (False,) if op_name == "fp4_dynamo_shim" else ()
    checked = 0
    for (rows, columns, layout), (sf_vec_size, ue8m0, swizzled, is_8x4) in _every_call():
        x, scale = nvfp4_input(rows, columns, layout=layout, seed=rows)
        arguments = (sf_vec_size, ue8m0, swizzled, is_8x4, *inversed, None, *extra)
        real = op(x, scale, *arguments)
        with FakeTensorMode() as mode:
            fake = op(mode.from_tensor(x), mode.from_tensor(scale), *arguments)
        meta = op(x.to("meta"), scale.to("meta"), *arguments)
        want = [(shape, stride, dtype, "cpu") for shape, stride, dtype, _ in _meta(real)]
        assert [(s, st, d, "cpu") for s, st, d, _ in _meta(fake)] == want, (rows, columns, layout, arguments)
        assert [(s, st, d, "cpu") for s, st, d, _ in _meta(meta)] == want, (rows, columns, layout, arguments)
        assert {t.dtype for t in real} == {torch.uint8}
        checked += 1
    assert checked == 64  # 96 combinations less the column-major ones whose M is no multiple of the block
