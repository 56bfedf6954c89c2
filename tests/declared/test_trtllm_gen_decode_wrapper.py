"""FlashInfer's batch decode wrapper with ``backend="trtllm-gen"`` under ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on
CPU: ``plan()`` eager, ``run()`` compiled to the op built from ``get_trtllm_gen_decode_module``'s ``paged_run``.

Its plan is None (the kernel reads no plan vector); what ``plan()`` leaves for the kernel is tensors (the block
table, the KV lengths, the multi-CTA counter buffer) and one Python int (``_max_kv_len``).

Stand-ins, because the kernel needs a GPU: the JIT module ``gen_trtllm_gen_fmha_module`` returns (its
``trtllm_paged_attention_decode`` computes paged attention over the block table and KV lengths it is given, with
the scale it is given, writes ``out``, ``lse``, the workspace and the counter buffer, and is opaque to Dynamo as the
C++ function is); the device's SM count (a CUDA query). FlashInfer's ``TrtllmGenDecodeModule``, the getter and the
wrapper are FlashInfer's own code. Limits: the stand-in reads no sinks, block scales or window.
"""

from __future__ import annotations

import random
import sys

import flashinfer
import flashinfer.decode
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from helpers import Compiles, apply_with, eager_then_compiled
from stand_in_gpu import RecordingSpec

KEY = "flashinfer.decode.get_trtllm_gen_decode_module.paged_run"
HEADS, KV_HEADS, DIM, PAGE, SM_COUNT = 4, 2, 64, 4, 148  # a B200's SM count


class StandInFmhaModule:
    """Stands in for the built trtllm-gen FMHA module (module docstring); records each call with whether it came
    through one of the shim's op kernels."""

    def __init__(self, calls: list):
        self.calls = calls

    @torch._dynamo.disable  # FlashInfer's C++ function: Dynamo cannot trace it
    def trtllm_paged_attention_decode(self, out, out_sf, query, k_cache, v_cache, workspace, counter, block_tables,
                                      seq_lens, max_q_len, max_seq_len, bmm1_scale, bmm2_scale, *rest):
        frame, through_op = sys._getframe(1), False
        while frame is not None:
            through_op |= frame.f_code.co_name.startswith("_kernel_")
            frame = frame.f_back
        self.calls.append((through_op, int(max_seq_len)))
        lse = next((r for r in rest if isinstance(r, torch.Tensor) and r.dtype == torch.float32 and r.dim() == 2),
                   None)
        for b in range(query.shape[0] // max_q_len):
            length = int(seq_lens[b])
            pages = block_tables[b, :-(-length // PAGE)]
            keys, values = (c[pages].transpose(1, 2).reshape(-1, KV_HEADS, DIM)[:length].float()
                            .repeat_interleave(HEADS // KV_HEADS, 1) for c in (k_cache, v_cache))
            scores = torch.einsum("hd,khd->hk", query[b].float(), keys) * bmm1_scale
            out[b] = (torch.einsum("hk,khd->hd", scores.softmax(-1), values) * bmm2_scale).to(out.dtype)
            if lse is not None:
                lse[b] = scores.logsumexp(-1)
        workspace[:8].fill_(max_seq_len)
        counter[:4].fill_(query.shape[0])


class StandInFmhaSpec(RecordingSpec):
    def get_library_paths(self):
        return []


@pytest.fixture(scope="module")
def trtllm_gen():
    """Every declared op on (gate ``all``), with the stand-in module; yields its call record."""
    calls: list = []
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        module = StandInFmhaModule(calls)
        patch.setattr(flashinfer.decode, "gen_trtllm_gen_fmha_module", lambda: StandInFmhaSpec(module))
        patch.setattr(flashinfer.decode, "get_device_sm_count", lambda device: SM_COUNT)
        flashinfer.decode.get_trtllm_gen_decode_module.cache_clear()
        yield {"calls": calls, "status": status["flashinfer_ops"]}
        flashinfer.decode.get_trtllm_gen_decode_module.cache_clear()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _wrapper():
    """FlashInfer's wrapper on CPU (its pinned host buffer an ordinary one: CPU torch has no pinned memory)."""
    empty = torch.empty
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: empty(*a, **k))
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1 << 16, dtype=torch.uint8), "NHD",
                                                             backend="trtllm-gen")


def _plan(wrapper, pages_per_request, last_page_len=3) -> int:
    batch = len(pages_per_request)
    indptr = torch.tensor([0, *pages_per_request], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    indices = torch.randperm(int(indptr[-1]), generator=torch.Generator().manual_seed(batch)).to(torch.int32)
    last = torch.full((batch,), last_page_len, dtype=torch.int32)
    wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, q_data_type=torch.float16,
                 kv_data_type=torch.float16)
    return batch


def _cache(pages: int = 64):
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(pages, PAGE, KV_HEADS, DIM, dtype=torch.float16, generator=generator) for _ in range(2))


def _query(rows: int, seed: int = 1):
    return torch.randn(rows, HEADS, DIM, dtype=torch.float16, generator=torch.Generator().manual_seed(seed))


def _ops_in(backend) -> list:
    return [str(node.target) for graph in backend.graphs for node in graph.graph.nodes
            if node.op == "call_function" and declared_layer.NAMESPACE in str(node.target)]


def test_trtllm_gen_decode_run_traces_to_its_op_with_no_graph_break(trtllm_gen):
    wrapper, cache = _wrapper(), _cache()
    rows = _plan(wrapper, [2, 3, 1])
    torch._dynamo.reset()
    backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(lambda q: wrapper.run(q, cache, return_lse=True), fullgraph=True, backend=backend)(_query(rows))
    op = trtllm_gen["status"]["registered"][KEY].split("::")[1]
    assert _ops_in(backend) == [f"{declared_layer.NAMESPACE}.{op}.default"]
    assert "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper._plan_info" in trtllm_gen["status"]["helpers"]


@pytest.mark.parametrize("pair", [True, False], ids=["kv_pair", "kv_tensor"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_trtllm_gen_run_equals_eager_bit_for_bit_with_its_in_place_writes(trtllm_gen, backend, pair):
    """Outputs, the caller's ``out``/``lse``, the workspace and the counter buffer; the KV cache given as a (k, v)
    pair or as one tensor, as FlashInfer's ``run()`` takes it."""
    wrapper, cache = _wrapper(), _cache()
    cache = cache if pair else torch.stack(cache, 1)
    rows = _plan(wrapper, [2, 3, 1, 4])
    q = _query(rows)

    def call(q, out, lse):
        return wrapper.run(q, cache, out=out, lse=lse, return_lse=True)

    def prepare():
        wrapper._float_workspace_buffer.zero_()
        wrapper._trtllm_gen_multi_ctas_kv_counter_buffer.zero_()
        trtllm_gen["calls"].clear()
        return q, torch.full_like(q, -1), torch.full((rows, HEADS), -1.0)

    def record(compiled, returned, arguments):
        assert trtllm_gen["calls"] == [(compiled, wrapper._max_kv_len)]  # eager: FlashInfer's own call, no op
        counter = wrapper._trtllm_gen_multi_ctas_kv_counter_buffer.clone()
        assert counter.any() and not returned[0].isnan().any()  # the stand-in wrote: the comparison means something
        return (*returned, *arguments[1:], wrapper._float_workspace_buffer.clone(), counter)

    eager_then_compiled(call, backend, prepare, record)


@pytest.mark.parametrize("dynamic", [True, None])
def test_twenty_trtllm_gen_steps_with_changing_batches_recompile_only_for_new_shapes(trtllm_gen, dynamic):
    """Batch composition and lengths change every step. The plan is None and ``_max_kv_len`` (a Python int FlashInfer
    passes to the kernel) a symbol, so no plan value is a guard. With ``dynamic=True`` nothing recompiles; with the
    default, Dynamo's automatic dynamic shapes recompile at each shape's first change: q's batch size, then the
    block table plan() reallocates as [batch, most pages of a request], whose width first changes at a later step.
    (The multi-CTA counter buffer plan() reallocates keeps its size while batch x heads stays under the SM count.)"""
    wrapper, cache = _wrapper(), _cache()
    rng = random.Random(0)
    batches = [[rng.randint(2, 6) for _ in range(rng.randint(2, 9))] for _ in range(20)]
    flashinfer.utils._cache_buf.clear()  # as a new process has it: the first run of a process fills it
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: wrapper.run(q, cache, return_lse=True), fullgraph=True, backend="inductor",
                             dynamic=dynamic)
    trtllm_gen["calls"].clear()
    with Compiles() as compiles:
        for step, pages in enumerate(batches):
            q = _query(_plan(wrapper, pages, last_page_len=1 + step % PAGE), seed=step)
            out, lse = compiled(q)
            eager_out, eager_lse = wrapper.run(q, cache, return_lse=True)
            assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step
    assert compiles.count == (1 if dynamic else 3), compiles.recompiled_for
    assert all("size mismatch" in reason for reason in compiles.recompiled_for), compiles.recompiled_for
    assert len({length for _, length in trtllm_gen["calls"]}) > 5  # the lengths did change


def test_opcheck_holds_the_trtllm_gen_decode_op_with_the_stand_in_kernel(trtllm_gen):
    """torch.library.opcheck runs the op (FlashInfer's paged_run on the stand-in module) with the arguments the
    wrapper's run() passes, the KV cache as a pair, and checks its write claims, its fake and its registration."""
    wrapper, cache = _wrapper(), _cache()
    rows = _plan(wrapper, [2, 3])
    name = trtllm_gen["status"]["registered"][KEY].split("::")[1]
    op = getattr(getattr(torch.ops, declared_layer.NAMESPACE), name).default
    q = _query(rows)
    values = {"float_workspace_buffer": wrapper._float_workspace_buffer,
              "multi_ctas_kv_counter_buffer": wrapper._trtllm_gen_multi_ctas_kv_counter_buffer,
              "int_workspace_buffer": wrapper._int_workspace_buffer, "plan_info_vec": None,
              "q": q.unsqueeze(1), "paged_k_cache": cache[0].transpose(1, 2), "paged_v_cache": cache[1].transpose(1, 2),
              "qo_indptr": torch.arange(rows + 1, dtype=torch.int32), "paged_kv_indptr": wrapper._paged_kv_indptr_buf,
              "paged_kv_indices": wrapper._paged_kv_indices_buf,
              "paged_kv_last_page_len": wrapper._paged_kv_last_page_len_buf, "o": torch.empty_like(q),
              "maybe_lse": torch.empty(rows, HEADS), "paged_kv_cache": cache[0], "paged_kv_cache__v": cache[1],
              "num_qo_heads": HEADS, "num_kv_heads": KV_HEADS, "block_tables": wrapper._block_tables,
              "kv_lens_buffer": wrapper._kv_lens_buffer, "page_size": PAGE, "max_kv_len": wrapper._max_kv_len,
              "dtype_q": torch.float16, "dtype_kv": torch.float16, "dtype_o": torch.float16, "dtype_idx": torch.int32,
              "head_dim_qk": DIM, "head_dim_vo": DIM, "window_left": -1, "sm_scale": 0.125, "rope_scale": 1.0,
              "rope_theta": 1e4, "workspace_size": wrapper._float_workspace_buffer.numel(),
              "uses_shared_paged_kv_idx": True}
    arguments = [values.get(a.name.removeprefix("getter_"), None if isinstance(a.type, torch.OptionalType) else
                            {"bool": False, "float": 0.0}.get(str(a.type), 0)) for a in op._schema.arguments]
    torch.library.opcheck(op, arguments)


def test_under_the_default_gate_the_trtllm_gen_wrapper_does_not_trace_until_a_gpu_run_proves_it(monkeypatch):
    status = apply_with(monkeypatch, FLASHINFER_OPS=None)
    assert status["applied"], status["problem"]
    assert KEY not in status["flashinfer_ops"]["registered"]
