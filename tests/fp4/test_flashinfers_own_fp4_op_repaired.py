"""FlashInfer's own torch.ops.flashinfer.fp4_quantize (0.6.12+), repaired while the shim is applied.

Asked of FlashInfer (does the op exist in this release), not of the shim. On CPU the op's kernel is the
shim's reference, so every comparison below is between FlashInfer's documented op and its function.
"""

from __future__ import annotations

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.fp4 import flashinfer_op

from release_facts import installed_facts
from nvfp4_inputs import nvfp4_input

pytestmark = pytest.mark.skipif(not flashinfer_op.flashinfer_has_op(),
                                reason="this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")


def same(got, want):
    return all(g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_the_op_honours_its_own_schema_for_every_enable_pdl(enable_pdl):
    # FlashInfer's body (0.6.12 to 0.7.0.post1) passes its 7th argument into is_global_scale_inversed.
    x, scale = nvfp4_input()
    assert same(torch.ops.flashinfer.fp4_quantize(x, scale, 16, False, True, False, enable_pdl),
                flashinfer.fp4_quantize(x, scale))


@pytest.mark.parametrize("rows, columns, layout", [(64, 256, "column-major"), (64, 256, "3-D"), (128, 64, "3-D column-major")])
def test_compiled_with_column_major_and_3d_input_matches_eager(rows, columns, layout):
    x, scale = nvfp4_input(rows, columns, layout=layout)
    compiled = torch.compile(lambda t, s: torch.ops.flashinfer.fp4_quantize(t, s, 16, False, True, False, None),
                             fullgraph=True, backend="inductor")
    assert same(compiled(x, scale), flashinfer.fp4_quantize(x, scale))


@pytest.mark.parametrize("rows, columns, layout", [(64, 256, "column-major"), (64, 256, "3-D"), (128, 64, "3-D column-major")])
def test_the_ops_fake_gives_the_functions_strides_with_autograd_on_and_off(rows, columns, layout):
    # Fake tensors reach the shim's fake whether autograd is on or off (inference mode: SGLang's), and on meta
    # tensors: the repaired op's autograd keys fall through instead of running a kernel of their own.
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, scale = nvfp4_input(rows, columns, layout=layout)
    want = [(o.shape, o.stride(), o.dtype) for o in flashinfer.fp4_quantize(x, scale)]
    call = lambda t, s: [(o.shape, o.stride(), o.dtype) for o in  # noqa: E731
                         torch.ops.flashinfer.fp4_quantize(t, s, 16, False, True, False, None)]
    with torch.inference_mode():
        with FakeTensorMode() as mode:
            assert call(mode.from_tensor(x), mode.from_tensor(scale)) == want
        assert call(x.to("meta"), scale.to("meta")) == want
    with FakeTensorMode() as mode:
        assert call(mode.from_tensor(x), mode.from_tensor(scale)) == want
    assert call(x.to("meta"), scale.to("meta")) == want


SHAPES = {"row-major": (64, 256), "column-major": (64, 256), "3-D": (64, 256), "3-D column-major": (128, 64)}
GRAD_MODES = {"autograd": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("layout", SHAPES)
@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_the_repaired_ops_fake_never_reaches_a_kernel(kernel_stand_in, layout, grad_mode, enable_pdl):
    """FlashInfer's documented torch.compile route, with a kernel that cannot take fake tensors: compiled
    with fullgraph it gives the function's outputs, and the kernel ran only on real tensors (one call per
    eager run, none while tracing)."""
    x, scale = nvfp4_input(*SHAPES[layout], layout=layout)
    for is_sf_8x4_layout in (False, True):
        torch._dynamo.reset()
        call = lambda t, s: torch.ops.flashinfer.fp4_quantize(t, s, 16, False, True, is_sf_8x4_layout,  # noqa: E731
                                                              enable_pdl)
        with GRAD_MODES[grad_mode]():
            want = flashinfer.fp4_quantize(x, scale, is_sf_8x4_layout=is_sf_8x4_layout)
            del kernel_stand_in[:]
            got = torch.compile(call, fullgraph=True, backend="aot_eager")(x, scale)
        assert same(got, want), (layout, is_sf_8x4_layout)
        assert len(kernel_stand_in) == 1, kernel_stand_in


def test_verify_compiles_flashinfers_op_with_a_kernel_that_cannot_take_fake_tensors(kernel_stand_in):
    from _fp4_dynamo_shim.verify import checks

    assert "column-major, 3-D" in checks.check_flashinfer_op("cpu")
    assert kernel_stand_in  # the check ran the op for real, through the kernel


def test_revert_restores_flashinfers_registrations_exactly():
    fp4_dynamo_shim.revert()
    dispatch_table = torch._C._dispatch_dump("flashinfer::fp4_quantize")
    fake = torch._library.simple_registry.singleton.find("flashinfer::fp4_quantize").fake_impl.kernel
    assert fp4_dynamo_shim.apply()
    assert torch._C._dispatch_dump("flashinfer::fp4_quantize") != dispatch_table  # repaired while applied
    assert "torch.ops.flashinfer.fp4_quantize" in fp4_dynamo_shim.status()["family"]
    fp4_dynamo_shim.revert()
    assert torch._C._dispatch_dump("flashinfer::fp4_quantize") == dispatch_table
    assert torch._library.simple_registry.singleton.find("flashinfer::fp4_quantize").fake_impl.kernel is fake
    assert fp4_dynamo_shim.apply()


def test_the_release_table_says_what_flashinfers_op_body_does():
    # Read off the wheel: 0.6.12 to 0.7.0.post1 forward positionally, 0.7.1 on by keyword.
    import inspect

    body = inspect.getsource(_flashinfer_op_body())
    positional = "is_sf_swizzled_layout=is_sf_swizzled_layout" not in body
    assert installed_facts().flashinfer_op == ("positional" if positional else "keyword")


def _flashinfer_op_body():
    import sys

    module = sys.modules[flashinfer.fp4_quantize.__wrapped__.__module__]
    return module._fp4_quantize_custom_op._init_fn
