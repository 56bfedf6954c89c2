"""torch.compile(fullgraph=True) over flashinfer.fp4_quantize: the failure without the shim, the fix with it."""

from __future__ import annotations

import importlib
import sys
import textwrap

import flashinfer
import pytest
import torch
import torch._dynamo.testing

import fp4_dynamo_shim
from nvfp4_inputs import nvfp4_input

BACKENDS = ["eager", "inductor"]


def quantize_forward(x, global_scale):
    packed, sf = flashinfer.fp4_quantize(x, global_scale)
    return packed, sf


def inputs(rows, columns=128, dtype=torch.bfloat16, seed=0):
    return nvfp4_input(rows, columns, dtype=dtype, seed=seed)


def assert_same(actual, expected):
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.stride() == e.stride() and a.dtype == e.dtype
        assert torch.equal(a, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fullgraph_compile_has_no_graph_breaks_and_matches_eager(backend):
    x, global_scale = inputs(33)
    explanation = torch._dynamo.explain(quantize_forward)(x, global_scale)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(quantize_forward, fullgraph=True, backend=backend)
    assert_same(compiled(x, global_scale), quantize_forward(x, global_scale))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_rows_compile_once_and_match_eager(backend):
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(quantize_forward, fullgraph=True, backend=counter)
    for rows in (7, 64, 129, 300):
        x, global_scale = inputs(rows, seed=rows)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same(compiled(x, global_scale), quantize_forward(x, global_scale))
    assert counter.frame_count == 1


@pytest.mark.parametrize("grad_mode", [torch.enable_grad, torch.inference_mode], ids=["autograd", "inference_mode"])
def test_the_ops_fake_never_reaches_a_kernel(kernel_stand_in, grad_mode):
    """Tracing runs the op's fake on fake tensors; only the compiled graph's run reaches the kernel, once,
    with real tensors (the stand-in raises on a fake tensor as FlashInfer's JIT entry does)."""
    x, global_scale = inputs(64)
    with grad_mode():
        compiled = torch.compile(quantize_forward, fullgraph=True, backend="aot_eager")
        want = quantize_forward(x, global_scale)
        del kernel_stand_in[:]
        assert_same(compiled(x, global_scale), want)
    assert len(kernel_stand_in) == 1


def test_column_major_and_3d_inputs_compile_and_match_eager():
    compiled = torch.compile(
        lambda x, s: flashinfer.fp4_quantize(x, s, is_sf_swizzled_layout=False), fullgraph=True, backend="inductor"
    )
    x, global_scale = inputs(64)
    for tensor in (x.t().contiguous().t(), x.view(4, 16, 128)):
        assert_same(compiled(tensor, global_scale), flashinfer.fp4_quantize(tensor, global_scale, is_sf_swizzled_layout=False))


@pytest.fixture
def consumer_module(tmp_path, unpatched):
    """A module that did ``from flashinfer import fp4_quantize`` (aliased, too) before the shim applied."""
    (tmp_path / "early_consumer.py").write_text(textwrap.dedent("""
        from flashinfer import fp4_quantize
        from flashinfer import fp4_quantize as quantize_alias

        def forward(x, global_scale):
            a, _ = fp4_quantize(x, global_scale)
            b, sf = quantize_alias(x, global_scale)
            return a, b, sf
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        original = flashinfer.fp4_quantize
        module = importlib.import_module("early_consumer")
        assert module.fp4_quantize is original
        assert fp4_dynamo_shim.apply()
        yield module, original
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("early_consumer", None)


def test_module_that_imported_fp4_quantize_before_the_shim_is_rebound_and_compiles(consumer_module):
    module, original = consumer_module
    assert module.fp4_quantize is flashinfer.fp4_quantize is module.quantize_alias
    assert module.fp4_quantize is not original
    x, global_scale = inputs(16)
    explanation = torch._dynamo.explain(module.forward)(x, global_scale)
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    a, b, sf = torch.compile(module.forward, fullgraph=True, backend="inductor")(x, global_scale)
    assert torch.equal(a, b)
    assert_same((a, sf), flashinfer.fp4_quantize(x, global_scale))


def _fake_blackwell_capability(device):
    # Stand-in for the GPU capability lookup only (there is no GPU here): it lets the original
    # reach its JIT-module path the way it does on an SM100 machine.
    return (10, 0)


def test_unpatched_fp4_quantize_fails_under_fullgraph_on_the_nvcc_subprocess(unpatched, monkeypatch):
    module = sys.modules[flashinfer.fp4_quantize.__module__]
    monkeypatch.setattr(module, "get_compute_capability", _fake_blackwell_capability)
    x, global_scale = inputs(8)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="_thread.allocate_lock"):
        torch.compile(quantize_forward, fullgraph=True, backend="eager")(x, global_scale)
    torch._dynamo.reset()
    assert fp4_dynamo_shim.apply()
    packed, sf = torch.compile(quantize_forward, fullgraph=True, backend="eager")(x, global_scale)
    assert packed.shape == (8, 64)
