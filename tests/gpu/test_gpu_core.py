"""fp4_quantize on a real GPU, in both device modes (see gpu_support): refusal below SM100, fullgraph
tracing, fake = real, CUDA-graph capture and replay with no host sync, the direct eager path, and values
where the mode computes them."""

from __future__ import annotations

import functools
import inspect
import itertools

import flashinfer
import pytest
import torch
import torch._dynamo.testing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

from _fp4_dynamo_shim.fp4 import quantize_op
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import fp4_releases
from fp4_dynamo_shim.errors import NoFp4KernelError
from gpu_support import capture_and_replay, has_fp4_kernel, meta, no_host_sync
from nvfp4_inputs import nvfp4_input

LAYOUTS = [dict(), dict(is_sf_8x4_layout=True), dict(is_sf_swizzled_layout=False)]
RECIPES = [dict(), dict(sf_vec_size=32, sf_use_ue8m0=True)]


inputs = functools.partial(nvfp4_input, device="cuda")


SHAPES = [dict(), dict(rows=1), dict(rows=300), dict(layout="column-major"), dict(layout="3-D"),
          dict(dtype=torch.float16), dict(dtype=torch.float8_e4m3fn)]
if fp4_releases.target_for(lifecycle.flashinfer_version()).swizzled_sf_padded_columns:
    SHAPES.append(dict(columns=96))  # K/16 = 6, not a multiple of 4 (before 0.6.8 FlashInfer's reshape rejects it)


def op_arguments(x, scale, layout, recipe):
    return (x, scale, recipe.get("sf_vec_size", 16), recipe.get("sf_use_ue8m0", False),
            layout.get("is_sf_swizzled_layout", True), layout.get("is_sf_8x4_layout", False), False, None, 0)


def same_values(got, want):
    return all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.skipif(has_fp4_kernel(), reason="this GPU has the FP4 kernel")
def test_default_mode_refuses_instead_of_returning_uninitialized_memory():
    x, scale = inputs()
    with pytest.raises(NoFp4KernelError, match="FP4_DYNAMO_SHIM_FALLBACK=reference"):
        flashinfer.fp4_quantize(x, scale)
    compiled = torch.compile(lambda t, s: flashinfer.fp4_quantize(t, s), fullgraph=True, backend="inductor")
    with pytest.raises(NoFp4KernelError):
        compiled(x, scale)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_fullgraph_static_and_dynamic(backend, device_mode):
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
        device_mode.branches.reset()
        got = compiled(x, scale)
        device_mode.assert_branch()
        assert device_mode.branches["direct"] == 0  # compiled calls run the op, never the eager direct path
        want = forward(x, scale)
        assert meta(got) == meta(want)
        if device_mode.computes_values:
            assert same_values(got, want), rows
    assert counter.frame_count == 1


def test_opcheck_on_the_op(device_mode):
    # Where the mode computes no values (the kernel branch on SM90), only the schema and fake-tensor tests apply.
    utils = None if device_mode.computes_values else ("test_schema", "test_faketensor")
    for shape, layout, recipe in itertools.product(SHAPES, LAYOUTS, RECIPES):
        if shape.get("dtype") == torch.float8_e4m3fn:
            continue  # SchemaCheckMode cannot compare float8 tensors on any device
        x, scale = inputs(**shape)
        args = op_arguments(x, scale, layout, recipe)
        opcheck(quantize_op.fp4_quantize_op, args, test_utils=utils) if utils else opcheck(quantize_op.fp4_quantize_op, args)
    device_mode.assert_branch()


def test_real_outputs_match_the_fake_and_flashinfer_for_every_layout(device_mode):
    original = lifecycle.original_function()
    mode = FakeTensorMode()
    for shape, layout, recipe in itertools.product(SHAPES, LAYOUTS, RECIPES):
        x, scale = inputs(**shape)
        device_mode.branches.reset()
        real = flashinfer.fp4_quantize(x, scale, **layout, **recipe)
        device_mode.assert_branch()
        flashinfer_own = original(x, scale, **layout, **recipe)
        with mode:
            fake = quantize_op.fp4_quantize_op(*op_arguments(mode.from_tensor(x), mode.from_tensor(scale), layout, recipe))
        assert meta(real) == meta(fake) == meta(flashinfer_own), (shape, layout, recipe)


@pytest.mark.parametrize("shape", [dict(), dict(rows=300), dict(layout="column-major"), dict(layout="3-D")],
                         ids=["2-D", "300 rows", "column-major", "3-D"])
def test_cuda_graph_capture_and_replay_of_the_compiled_function(shape, device_mode):
    compiled = torch.compile(lambda t, s: flashinfer.fp4_quantize(t, s), fullgraph=True, backend="inductor")
    static_x, static_scale = inputs(**shape)
    device_mode.branches.reset()
    outputs, graph = capture_and_replay(compiled, static_x, static_scale)
    device_mode.assert_branch()
    assert meta(outputs) == meta(flashinfer.fp4_quantize(static_x, static_scale))
    if device_mode.computes_values:
        for seed in (1, 2):  # fresh inputs copied into the captured buffers
            fresh_x, fresh_scale = inputs(**shape, seed=seed)
            static_x.copy_(fresh_x)
            static_scale.copy_(fresh_scale)
            graph.replay()
            torch.cuda.synchronize()
            assert same_values(outputs, flashinfer.fp4_quantize(fresh_x, fresh_scale))


def sglangs_call(x, scale):
    """As SGLang calls it: positional input and scale; with FlashInfer 0.7.1+ an explicit nvfp4_4over6=None (the
    parameter's default sentinel reads the environment through FlashInfer's Python, which the direct path skips)."""
    if "nvfp4_4over6" in inspect.signature(lifecycle.original_function()).parameters:
        return flashinfer.fp4_quantize(x, scale, nvfp4_4over6=None)
    return flashinfer.fp4_quantize(x, scale)


def test_sglangs_eager_call_takes_the_direct_path_on_the_kernel_branch_with_no_host_sync(device_mode):
    """The call SGLang makes on every layer (2-D row-major bf16, a one-element float32 scale on the GPU):
    eagerly and inside a captured CUDA graph (decode graphs capture eager calls). On the kernel branch it
    goes straight to the JIT entry (the replacement's direct path); the reference branch has none."""
    x, scale = inputs(rows=48, columns=2048)
    device_mode.branches.reset()
    with no_host_sync():
        eager = sglangs_call(x, scale)
    device_mode.assert_branch()
    assert device_mode.branches["direct"] == (1 if device_mode.name == "kernel" else 0)
    assert device_mode.branches["general"] == 0
    outputs, graph = capture_and_replay(sglangs_call, x, scale)
    assert meta(outputs) == meta(eager)
    if device_mode.computes_values:
        x.copy_(inputs(rows=48, columns=2048, seed=3)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert same_values(outputs, sglangs_call(x, scale))


def test_reference_fallback_gives_real_values_eager_compiled_and_replayed(reference_mode):
    """Values, which only the reference branch has on SM90 (the kernel branch's values are checked on
    SM100+ by the device_mode tests above)."""
    for shape, layout, recipe in itertools.product(SHAPES, LAYOUTS, RECIPES):
        x, scale = inputs(**shape)
        eager = flashinfer.fp4_quantize(x, scale, **layout, **recipe)
        cpu = flashinfer.fp4_quantize(x.cpu(), scale.cpu(), **layout, **recipe)
        assert all(torch.equal(g.cpu(), c) for g, c in zip(eager, cpu)), (shape, layout, recipe)
    reference_mode.assert_branch()
