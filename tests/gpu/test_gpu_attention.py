"""Single decode and single prefill as the shim's ops on the GPU (``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``): the
real kernels, every backend the release offers on the GPU at hand (fa2 everywhere, fa3 on SM90), each call
through ``declared_checks.check`` (fullgraph with 0 graph breaks, Inductor bit-identical to eager, CUDA-graph
replay equal, ``opcheck`` on the op it reaches), and twenty decode steps with a growing KV cache compiled at most
twice (once per distinct shape set: automatic dynamic shapes), every step equal to eager.

The first call builds each JIT module (minutes for the six on the H200, FlashInfer 0.6.12): allow for it.
"""

from __future__ import annotations

import pytest
import torch

import declared_checks
from declared_examples import Example, _attention
from gpu_support import SM

ON_SM90 = SM is not None and SM[0] == 9
CASES = [
    Example("flashinfer.decode", "single_decode_with_kv_cache", _attention(None)),
    Example("flashinfer.decode", "single_decode_with_kv_cache", _attention(None, use_tensor_cores=True)),
    Example("flashinfer.prefill", "single_prefill_with_kv_cache", _attention(64, causal=True, backend="fa2")),
    Example("flashinfer.prefill", "single_prefill_with_kv_cache", _attention(64, backend="fa2")),
    pytest.param(Example("flashinfer.prefill", "single_prefill_with_kv_cache", _attention(64, causal=True,
                                                                                           backend="fa3")),
                 marks=pytest.mark.skipif(not ON_SM90, reason="fa3 is FlashInfer's SM90 backend")),
    Example("flashinfer.prefill", "single_prefill_with_kv_cache", _attention(64, causal=True)),  # "auto"
]
IDS = ["decode", "decode_tensor_cores", "prefill_fa2_causal", "prefill_fa2", "prefill_fa3_causal", "prefill_auto"]


@pytest.fixture(scope="module")
def every_op():
    with declared_checks.every_op_on() as layer:
        assert {"flashinfer.decode.get_single_decode_module.run_single_decode",
                "flashinfer.prefill.get_single_prefill_module.run_single_prefill"} <= set(layer["registered"])
        yield layer


@pytest.mark.parametrize("example", CASES, ids=IDS)
def test_single_attention_traces_compiles_bit_exact_replays_and_passes_opcheck(every_op, example):
    report = declared_checks.check(example)
    assert "error" not in report and report["present"], report
    assert report["traced"] and report["bit_exact"] is True and report["graph"] is True, report
    assert all(value is True for value in report["opcheck"].values()), report


def test_twenty_decode_steps_with_a_growing_kv_cache_compile_at_most_twice(every_op):
    import flashinfer
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    call = lambda q, k, v: flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)  # noqa: E731
    compiled = torch.compile(call, fullgraph=True, backend=counter)
    torch._dynamo.reset()
    q = torch.randn(8, 128, dtype=torch.bfloat16, device="cuda")
    for step in range(20):
        k, v = (torch.randn(128 + 37 * step, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        out, lse = compiled(q, k, v)
        eager_out, eager_lse = call(q, k, v)
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step
    assert counter.frame_count <= 2
