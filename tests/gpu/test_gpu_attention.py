"""Single decode and single prefill as the shim's ops on the GPU (``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``): the
real kernels, every backend the release offers on the GPU at hand (fa2 everywhere, fa3 on SM90), each call
through ``declared_checks.check`` (fullgraph with 0 graph breaks, Inductor bit-identical to eager, CUDA-graph
replay equal, ``opcheck`` on the op it reaches), and twenty decode steps with a growing KV cache compiled at most
twice (once per distinct shape set: automatic dynamic shapes), every step equal to eager.

The wrappers' section below runs each batch wrapper the same way (plan() eager, run() compiled): decode,
prefill paged and ragged, and MLA paged where its run is an op (0.5.3-0.6.x).

The first call builds each JIT module (minutes for the six on the H200, FlashInfer 0.6.12): allow for it.
"""

from __future__ import annotations

import math

import pytest
import torch

import declared_checks
from _fp4_dynamo_shim.declared import declared_layer
from declared_examples import Example, _attention
from gpu_support import SM
from helpers import Compiles

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
                "flashinfer.prefill.get_single_prefill_module.run_single_prefill",
                "flashinfer.decode.get_batch_decode_module.run_batch_decode",
                "flashinfer.prefill.get_batch_prefill_module.paged_run",
                "flashinfer.prefill.get_batch_prefill_module.ragged_run"} <= set(layer["registered"])
        yield layer


@pytest.mark.parametrize("example", CASES, ids=IDS)
def test_single_attention_traces_compiles_bit_exact_replays_and_passes_opcheck(every_op, record_property, example):
    report = declared_checks.check(example)
    record_property("function", example.name)  # the GPU record (tools/gpu/proven_record.py --add)
    record_property("declared_ops", ",".join(sorted(op.split(".")[1] for op in report.get("ops", []))))
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


# --- the stateful wrappers: plan() eager, run() compiled -------------------------------------------------------
# Each wrapper on the real kernels, fa2 and (SM90) fa3, with and without use_cuda_graph=True: run() traced with
# fullgraph to the shim's op, compiled (Inductor) equal to eager bit for bit in its output and lse, the compiled run
# captured in a CUDA graph and replayed after a new plan() equal to eager on that plan, opcheck on the op it reaches
# with the arguments it passed, and twenty steps whose composition and lengths change with no recompilation
# (dynamic=True; a use_cuda_graph=True wrapper keeps its batch: dynamic=False, SGLang's setting). The CPU counterpart
# with stand-in modules is tests/declared/test_attention_wrappers.py.

HEADS, KV_HEADS, DIM, PAGE, PAGES, BATCH = 8, 2, 128, 16, 256, 4
CKV, KPE = 512, 64  # MLA's compressed KV and rope dimensions (DeepSeek's, FlashInfer's own MLA tests)
WRAPPERS = [("decode", "fa2", False), ("decode", "fa2", True), ("decode_tensor_cores", "fa2", False),
            ("decode_tensor_cores", "fa2", True), ("prefill_paged", "fa2", False), ("prefill_paged", "fa2", True),
            ("prefill_ragged", "fa2", False), ("prefill_ragged", "fa2", True)]
WRAPPERS += [("mla", "fa2", False), ("mla", "fa2", True)]
WRAPPERS += [pytest.param(kind, "fa3", graph, marks=pytest.mark.skipif(not ON_SM90, reason="fa3 is SM90's"))
             for kind in ("prefill_paged", "prefill_ragged", "mla") for graph in (False, True)]
# trtllm-gen's decode kernels are built for SM100 only: on the H200 these are skipped; its CPU counterpart with a
# stand-in module is tests/declared/test_trtllm_gen_decode_wrapper.py.
WRAPPERS += [pytest.param("decode", "trtllm-gen", False, marks=pytest.mark.skipif(
    SM is None or SM[0] != 10, reason="trtllm-gen decode is FlashInfer's SM100 backend"))]


def _attention_wrapper(kind, backend, use_cuda_graph):
    import flashinfer.mla

    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    graph = {}
    if kind == "mla":
        if use_cuda_graph:
            graph = dict(qo_indptr=torch.zeros(BATCH + 1, **i32), kv_indptr=torch.zeros(BATCH + 1, **i32),
                         kv_indices=torch.zeros(PAGES, **i32), kv_len_arr=torch.zeros(BATCH, **i32))
        return flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, use_cuda_graph=use_cuda_graph, backend=backend,
                                                            **graph)
    if kind.startswith("decode"):
        if use_cuda_graph:
            graph = dict(paged_kv_indptr_buffer=torch.zeros(BATCH + 1, **i32),
                         paged_kv_indices_buffer=torch.zeros(PAGES, **i32),
                         paged_kv_last_page_len_buffer=torch.zeros(BATCH, **i32))
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(  # fa2: "auto" may pick cudnn on 0.7.x
            workspace, "NHD", use_cuda_graph=use_cuda_graph, use_tensor_cores=kind == "decode_tensor_cores",
            backend=backend, **graph)
    if kind == "prefill_paged":
        if use_cuda_graph:
            graph = dict(qo_indptr_buf=torch.zeros(BATCH + 1, **i32), paged_kv_indptr_buf=torch.zeros(BATCH + 1, **i32),
                         paged_kv_indices_buf=torch.zeros(PAGES, **i32),
                         paged_kv_last_page_len_buf=torch.zeros(BATCH, **i32))
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=use_cuda_graph,
                                                              backend=backend, **graph)
    if use_cuda_graph:
        graph = dict(qo_indptr_buf=torch.zeros(BATCH + 1, **i32), kv_indptr_buf=torch.zeros(BATCH + 1, **i32))
    return flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", use_cuda_graph=use_cuda_graph,
                                                           backend=backend, **graph)


def _attention_plan(wrapper, kind, pages, rows):
    """plan() for requests of ``pages`` pages (the last holding 1 + index % PAGE tokens) and ``rows`` query rows
    each (decode: one); returns the number of query rows."""
    i32 = dict(dtype=torch.int32, device="cuda")
    indptr = torch.tensor([0, *pages], **i32).cumsum(0, dtype=torch.int32)
    last = torch.tensor([1 + i % PAGE for i in range(len(pages))], **i32)
    indices = torch.randperm(PAGES, device="cuda")[:int(indptr[-1])].to(torch.int32)
    dtypes = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    if kind.startswith("decode"):
        wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, **dtypes)
        return len(pages)
    qo_indptr = torch.tensor([0, *rows], **i32).cumsum(0, dtype=torch.int32)
    if kind == "mla":  # the sequence lengths the pages hold; the scale of DeepSeek's head before absorption
        kv_lens = (indptr[1:] - indptr[:-1] - 1) * PAGE + last
        wrapper.plan(qo_indptr, indptr, indices, kv_lens, HEADS, CKV, KPE, PAGE, True, 1 / math.sqrt(128 + 64),
                     torch.bfloat16, torch.bfloat16)
    elif kind == "prefill_paged":
        wrapper.plan(qo_indptr, indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, causal=True, **dtypes)
    else:
        kv_lens = [max(p * PAGE, r) for p, r in zip(pages, rows)]
        kv_indptr = torch.tensor([0, *kv_lens], **i32).cumsum(0, dtype=torch.int32)
        wrapper.plan(qo_indptr, kv_indptr, HEADS, KV_HEADS, DIM, causal=True, **dtypes)
    return int(qo_indptr[-1])


def _attention_cache(kind):
    shapes = [(PAGES, PAGE, CKV), (PAGES, PAGE, KPE)] if kind == "mla" else [(PAGES, PAGE, KV_HEADS, DIM)] * 2
    return tuple(torch.randn(shape, dtype=torch.bfloat16, device="cuda") for shape in shapes)


def _attention_query(kind, rows):
    """MLA's q_nope and q_pe are views of one tensor, as SGLang passes them: one tensor for every kind."""
    return torch.randn(rows, HEADS, CKV + KPE if kind == "mla" else DIM, dtype=torch.bfloat16, device="cuda")


def _attention_call(wrapper, kind, cache):
    if kind == "mla":
        return lambda q: wrapper.run(q[..., :CKV], q[..., CKV:], *cache, return_lse=True)
    if kind == "prefill_ragged":
        keys, values = (c.flatten(0, 1) for c in cache)
        return lambda q: wrapper.run(q, keys, values, return_lse=True)
    return lambda q: wrapper.run(q, cache, return_lse=True)


#: The public function each kind's run() is, as tools/gpu/proven_record.py names it in the GPU record.
PUBLIC = {"decode": "decode.BatchDecodeWithPagedKVCacheWrapper.run",
          "decode_tensor_cores": "decode.BatchDecodeWithPagedKVCacheWrapper.run",
          "prefill_paged": "prefill.BatchPrefillWithPagedKVCacheWrapper.run",
          "prefill_ragged": "prefill.BatchPrefillWithRaggedKVCacheWrapper.run",
          "mla": "mla.BatchMLAPagedAttentionWrapper.run"}
MLA_RUN = "get_batch_mla_module.run"


def _covered(layer, kind):
    if kind == "mla" and not any(key.endswith(MLA_RUN) for key in layer["registered"]):
        pytest.skip("FlashInfer's MLA wrapper is an op on 0.5.3-0.6.x only (status() lists it as not covered)")


@pytest.mark.parametrize("kind, backend, use_cuda_graph", WRAPPERS)
def test_wrapper_run_traces_compiles_bit_exact_replays_after_a_new_plan_and_passes_opcheck(
        every_op, record_property, kind, backend, use_cuda_graph):
    import torch._dynamo.testing

    _covered(every_op, kind)
    record_property("function", PUBLIC[kind])  # the GPU record: which function this run proves, through what op
    torch.manual_seed(0)
    wrapper = _attention_wrapper(kind, backend, use_cuda_graph)
    cache = _attention_cache(kind)
    call = _attention_call(wrapper, kind, cache)
    rows = _attention_plan(wrapper, kind, [3, 5, 2, 7], [4, 1, 6, 3])
    q = _attention_query(kind, rows)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend=counter)
    eager = call(q)
    assert all(torch.equal(a, b) for a, b in zip(compiled(q), eager))
    names = {str(n.target) for g in counter.graphs for n in g.graph.nodes if declared_layer.NAMESPACE in str(n.target)}
    record_property("declared_ops", ",".join(sorted(name.split(".")[1] for name in names)))
    assert len(names) == 1, names
    opcheck = declared_checks._opcheck(call, (q,))  # the ops a compiled call reaches, with its arguments
    assert opcheck != "no shim op ran" and all(value is True for value in opcheck.values()), opcheck
    # The caller's own out=, with the cache as one tensor whose K and V are views of it (FlashInfer's own tests).
    combined = torch.stack(cache, 1) if kind != "mla" else None
    into = ((lambda q, out: wrapper.run(q, combined[:, 0].flatten(0, 1), combined[:, 1].flatten(0, 1), out=out))
            if kind == "prefill_ragged" else (lambda q, out: wrapper.run(q, combined, out=out)))
    if kind == "mla":
        into = lambda q, out: wrapper.run(q[..., :CKV], q[..., CKV:], *cache, out=out)  # noqa: E731
    written = torch.full_like(eager[0], float("nan"))
    torch.compile(into, fullgraph=True)(q, written)
    assert torch.equal(written, into(q, torch.empty_like(written)))
    if use_cuda_graph:  # FlashInfer's protocol: capture run() once, plan() again before each replay
        static = q.clone()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(3):
                compiled(static)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = compiled(static)
        assert _attention_plan(wrapper, kind, [6, 1, 4, 2], [4, 1, 6, 3]) == rows
        static.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, call(static)))


@pytest.mark.parametrize("kind, backend, use_cuda_graph", WRAPPERS)
def test_twenty_wrapper_steps_with_changing_batches_never_recompile(every_op, record_property, kind, backend,
                                                                    use_cuda_graph):
    import random

    _covered(every_op, kind)
    record_property("function", PUBLIC[kind])
    rng = random.Random(0)
    wrapper = _attention_wrapper(kind, backend, use_cuda_graph)
    cache = _attention_cache(kind)
    call = _attention_call(wrapper, kind, cache)
    torch._dynamo.reset()  # no eager run first: the first run of a process compiles once too
    compiled = torch.compile(call, fullgraph=True, backend="inductor", dynamic=not use_cuda_graph)
    with Compiles() as compiles:
        for step in range(20):
            batch = BATCH if use_cuda_graph else rng.randint(2, BATCH)
            rows = _attention_plan(wrapper, kind, [rng.randint(2, 12) for _ in range(batch)],
                                   [rng.randint(2, 9) if not use_cuda_graph else 3 for _ in range(batch)])
            q = _attention_query(kind, rows)
            assert all(torch.equal(a, b) for a, b in zip(compiled(q), call(q))), step
    record_property("compiles", compiles.count)
    record_property("recompiled_for", " | ".join(compiles.recompiled_for)[:2000])
    # torch's duck sizing gives two sizes equal at the first compile one symbol (a plan's page count that happened
    # to equal the page size did on the H100); the step that tells them apart recompiles once. That is torch's
    # default (torch.fx.experimental._config.use_duck_shape), not the batch: any other reason fails here.
    duck_sized = compiles.count == 2 and all("duck sizing" in reason for reason in compiles.recompiled_for)
    assert compiles.count == 1 or duck_sized, compiles.recompiled_for
