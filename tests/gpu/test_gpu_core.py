"""The shim on a real GPU: refusal below SM100, tracing with the real kernel launch, fake = real,
CUDA-graph capture and replay, and real values through the reference fallback."""

from __future__ import annotations

import itertools

import flashinfer
import pytest
import torch
import torch._dynamo.testing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

from fp4_dynamo_shim import ops, patching
from fp4_dynamo_shim.errors import NoFp4KernelError
from gpu_support import has_fp4_kernel

LAYOUTS = [dict(), dict(is_sf_8x4_layout=True), dict(is_sf_swizzled_layout=False)]
RECIPES = [dict(), dict(sf_vec_size=32, sf_use_ue8m0=True)]


def inputs(rows=64, columns=256, dtype=torch.bfloat16, column_major=False, three_d=False, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    if column_major:
        x = torch.randn(columns, rows, device="cuda", generator=generator).to(dtype).t()
    elif three_d:
        x = torch.randn(2, rows, columns, device="cuda", generator=generator).to(dtype)
    else:
        x = torch.randn(rows, columns, device="cuda", generator=generator).to(dtype)
    return x, (448.0 * 6.0 / x.float().abs().amax()).reshape(1)


SHAPES = [dict(), dict(rows=1), dict(rows=300), dict(column_major=True), dict(three_d=True),
          dict(dtype=torch.float16), dict(dtype=torch.float8_e4m3fn)]


def meta(tensors):
    return [(tuple(t.shape), t.stride(), t.dtype) for t in tensors]


@pytest.mark.skipif(has_fp4_kernel(), reason="this GPU has the FP4 kernel")
def test_default_mode_refuses_instead_of_returning_uninitialized_memory():
    x, scale = inputs()
    with pytest.raises(NoFp4KernelError, match="FP4_DYNAMO_SHIM_FALLBACK=reference"):
        flashinfer.fp4_quantize(x, scale)
    compiled = torch.compile(lambda t, s: flashinfer.fp4_quantize(t, s), fullgraph=True, backend="inductor")
    with pytest.raises(NoFp4KernelError):
        compiled(x, scale)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_fullgraph_with_the_real_kernel_launch_static_and_dynamic(backend, launch_mode):
    def forward(t, s):
        return flashinfer.fp4_quantize(t, s)

    x, scale = inputs()
    explanation = torch._dynamo.explain(forward)(x, scale)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(forward, fullgraph=True, backend=counter)
    for rows in (2, 17, 64, 300):
        x, scale = inputs(rows=rows)
        torch._dynamo.mark_dynamic(x, 0)
        assert meta(compiled(x, scale)) == meta(forward(x, scale))
    assert counter.frame_count == 1


def test_opcheck_schema_and_fake_on_the_real_kernel(launch_mode):
    # The kernel computes no values on SM90, so only the schema and fake-tensor tests apply there.
    utils = None if has_fp4_kernel() else ("test_schema", "test_faketensor")
    for shape, layout, recipe in itertools.product(SHAPES, LAYOUTS, RECIPES):
        if shape.get("dtype") == torch.float8_e4m3fn:
            continue  # SchemaCheckMode cannot compare float8 tensors on any device
        x, scale = inputs(**shape)
        args = (x, scale, recipe.get("sf_vec_size", 16), recipe.get("sf_use_ue8m0", False),
                layout.get("is_sf_swizzled_layout", True), layout.get("is_sf_8x4_layout", False), False, None, 0)
        opcheck(ops.fp4_quantize_op, args, test_utils=utils) if utils else opcheck(ops.fp4_quantize_op, args)


def test_real_outputs_match_the_fake_and_flashinfer_for_every_layout(launch_mode):
    original = patching.original_function()
    mode = FakeTensorMode()
    for shape, layout, recipe in itertools.product(SHAPES, LAYOUTS, RECIPES):
        x, scale = inputs(**shape)
        real = flashinfer.fp4_quantize(x, scale, **layout, **recipe)
        flashinfer_own = original(x, scale, **layout, **recipe)
        with mode:
            fake_x, fake_scale = mode.from_tensor(x), mode.from_tensor(scale)
            fake = ops.fp4_quantize_op(fake_x, fake_scale, recipe.get("sf_vec_size", 16),
                                       recipe.get("sf_use_ue8m0", False), layout.get("is_sf_swizzled_layout", True),
                                       layout.get("is_sf_8x4_layout", False), False, None, 0)
        assert meta(real) == meta(fake) == meta(flashinfer_own), (shape, layout, recipe)


def test_cuda_graph_capture_and_replay_of_the_compiled_function(launch_mode):
    compiled = torch.compile(lambda t, s: flashinfer.fp4_quantize(t, s), fullgraph=True, backend="inductor")
    x, scale = inputs()
    for _ in range(2):
        compiled(x, scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = compiled(x, scale)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert meta(outputs) == meta(flashinfer.fp4_quantize(x, scale))


def test_reference_fallback_gives_real_values_eager_compiled_and_replayed(reference_mode):
    for shape, layout, recipe in itertools.product(SHAPES, LAYOUTS, RECIPES):
        x, scale = inputs(**shape)
        eager = flashinfer.fp4_quantize(x, scale, **layout, **recipe)
        cpu = flashinfer.fp4_quantize(x.cpu(), scale.cpu(), **layout, **recipe)
        assert all(torch.equal(g.cpu(), c) for g, c in zip(eager, cpu)), (shape, layout, recipe)

    def forward(t, s):
        return flashinfer.fp4_quantize(t, s)

    compiled = torch.compile(forward, fullgraph=True, backend="inductor")
    static_x, static_scale = inputs(rows=128)
    for _ in range(2):
        compiled(static_x, static_scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = compiled(static_x, static_scale)
    for seed in (1, 2, 3):  # fresh inputs copied into the captured buffers
        fresh_x, fresh_scale = inputs(rows=128, seed=seed)
        static_x.copy_(fresh_x)
        static_scale.copy_(fresh_scale)
        graph.replay()
        torch.cuda.synchronize()
        expected = forward(fresh_x, fresh_scale)
        assert all(torch.equal(g, e) for g, e in zip(static_outputs, expected))
        assert all(torch.equal(g, e) for g, e in zip(compiled(fresh_x, fresh_scale), expected))
