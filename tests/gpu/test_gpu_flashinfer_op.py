"""FlashInfer's own ``torch.ops.flashinfer.fp4_quantize`` (0.6.12+), repaired by the shim, on a real GPU in both
device modes (see gpu_support).

FlashInfer documents that op as its torch.compile route. Under the shim its fake once reached the kernel
on the kernel branch (the repaired autograd keys ran the shim's path on fake tensors, which the reference
computes on and FlashInfer's JIT entry cannot: "Cannot access data pointer of Tensor"); only the
reference branch was tested, so nobody saw it. Every test here runs on both branches.
"""

from __future__ import annotations

import flashinfer
import pytest
import torch

from _fp4_dynamo_shim.fp4 import flashinfer_op
from gpu_support import capture_and_replay, meta, no_breaks
from nvfp4_inputs import LAYOUTS, nvfp4_input

pytestmark = pytest.mark.skipif(not flashinfer_op.flashinfer_has_op(),
                                reason="this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")


def test_the_issues_snippet_compiles_and_replays_from_a_cuda_graph(device_mode):
    """Exactly what a new user tried (enable_pdl=False positionally), then captured and replayed."""
    op = torch.ops.flashinfer.fp4_quantize
    x = torch.randn(64, 2048, dtype=torch.bfloat16, device="cuda")
    gs = torch.tensor([1.0], device="cuda")
    eager = op(x, gs, 16, False, True, False, False)
    compiled = torch.compile(lambda a, b: op(a, b, 16, False, True, False, False), fullgraph=True)
    device_mode.branches.reset()
    got = compiled(x, gs)
    device_mode.assert_branch()
    assert meta(got) == meta(eager) == meta(flashinfer.fp4_quantize(x, gs))
    captured, graph = capture_and_replay(compiled, x, gs)
    if device_mode.computes_values:
        assert all(torch.equal(c, e) for c, e in zip(captured, flashinfer.fp4_quantize(x, gs)))




GRAD_MODES = {"autograd": torch.enable_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_every_enable_pdl_and_layout_traces_captures_and_matches_the_function(device_mode, enable_pdl, layout,
                                                                              grad_mode):
    x, scale = nvfp4_input(device="cuda", layout=layout)

    def call(t, s):
        return torch.ops.flashinfer.fp4_quantize(t, s, 16, False, True, False, enable_pdl)

    with GRAD_MODES[grad_mode]():
        want = flashinfer.fp4_quantize(x, scale)
        assert no_breaks(call, x, scale)
        compiled = torch.compile(call, fullgraph=True, backend="inductor")
        device_mode.branches.reset()
        got = compiled(x, scale)
        device_mode.assert_branch()
        eager = call(x, scale)
        assert meta(got) == meta(eager) == meta(want)
        captured, graph = capture_and_replay(compiled, x, scale)
        assert meta(captured) == meta(want)
    if device_mode.computes_values:
        for result in (got, eager, captured):
            assert all(torch.equal(r, w) for r, w in zip(result, want)), (layout, enable_pdl)
