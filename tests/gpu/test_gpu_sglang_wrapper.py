"""SGLang >= 0.5.12's own FP4 op on a real GPU, with the shim applied before SGLang binds and by the plugin after.

``tests/sglang/test_sglang_wrapper.py`` proves it on CPU; here the same verbatim SGLang code (``tests/support/sglang_wrapper.py``,
with SGLang's own CUDA-only registration and no CPU kernel added) runs on CUDA tensors: SGLang's op gives
exactly the shim's bytes (``FP4_DYNAMO_SHIM_FALLBACK=reference``: the H200 has no FP4 kernel body), compiled
with ``fullgraph=True`` and replayed from a CUDA graph it gives the eager bytes, and with the real (empty)
kernel launch (``launch``) its outputs have FlashInfer's shapes, strides and dtypes.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.activation import sglang_plugin
from _fp4_dynamo_shim.fp4 import replacement

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sglang_facts  # noqa: E402
import sglang_wrapper  # noqa: E402
from nvfp4_inputs import nvfp4_input

VERSIONS = sglang_facts.SOURCE_RELEASES

# The same condition as tests/sglang/test_sglang_wrapper.py's: found on the H200 with FlashInfer 0.6.3, where these
# tests failed with SGLang's own TypeError instead of saying why they cannot run there.
pytestmark = pytest.mark.skipif(
    "backend" not in inspect.signature(lifecycle.original_function() or flashinfer.fp4_quantize).parameters,
    reason="SGLang >= 0.5.12 passes backend= to fp4_quantize; this FlashInfer's has no such parameter "
           "(SGLang pins 0.6.11.post1 and later)")


@pytest.fixture
def sglang_op():
    loaded = []

    def load(version, route):
        if route == "after":  # the plugin route: SGLang binds FlashInfer's own function, the plugin rebinds it
            fallback = lifecycle.status()["fallback"]
            fp4_dynamo_shim.revert()
            loaded.append(sglang_wrapper.load(version, sm100=torch.cuda.get_device_capability()[0] == 10,
                                              cpu_kernel=False))
            sglang_plugin.plugin()
            assert lifecycle.status()["fallback"] == fallback
        else:
            loaded.append(sglang_wrapper.load(version, sm100=torch.cuda.get_device_capability()[0] == 10,
                                              cpu_kernel=False))
        fp4_utils = loaded[-1].fp4_utils
        assert replacement.is_shim(fp4_utils._flashinfer_fp4_quantize)
        return fp4_utils

    yield load
    for each in reversed(loaded):
        each.unload()


def _inputs():
    for seed, (rows, columns) in enumerate(((1, 2048), (37, 256), (256, 7168))):
        yield nvfp4_input(rows, columns, device="cuda", seed=18 + seed, spread=3)


@pytest.mark.parametrize("route", ["before", "after"])
@pytest.mark.parametrize("version", VERSIONS)
def test_sglangs_op_gives_the_shims_bytes_eager_compiled_and_replayed(version, route, sglang_op, reference_mode):
    fp4_utils = sglang_op(version, route)
    compiled = torch.compile(lambda x, s: fp4_utils.fp4_quantize(x, s), fullgraph=True, backend="inductor")
    for x, scale in _inputs():
        eager = fp4_utils.fp4_quantize(x, scale)
        for got, want in zip(eager, flashinfer.fp4_quantize(x, scale)):
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert torch.equal(got, want)
        for _ in range(2):
            compiled(x, scale)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = compiled(x, scale)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(c, e) for c, e in zip(captured, eager))


@pytest.mark.parametrize("version", VERSIONS)
def test_with_the_real_kernel_launch_sglangs_op_has_flashinfers_layout(version, sglang_op, kernel_mode):
    fp4_utils = sglang_op(version, "after")
    original = lifecycle.original_function()
    for x, scale in _inputs():
        try:
            expected = original(x, scale, backend="cuda")
        except RuntimeError as error:  # FlashInfer 0.7.4 refuses SM<100 itself; 0.6.12 launches the empty kernel
            pytest.skip(f"FlashInfer's own function refuses this GPU: {str(error)[:120]}")
        for got, want in zip(fp4_utils.fp4_quantize(x, scale), expected):
            assert (got.shape, got.stride(), got.dtype, got.device) == (want.shape, want.stride(), want.dtype, want.device)
