"""FlashInfer's MLA paged wrapper's ``run`` (fa2/fa3 backends, 0.5.3-0.6.x) as the shim's op under
``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on CPU.

Its getter returns the built JIT module, whose ``run`` is the C++ function: the op is built from the attention
table's row, and the wrapper's ``_cached_module`` reaches compiled code as the traced getter's namespace for the
module's getter arguments (``declared/built_modules.py``, ``declared/wrappers.py``). On 0.7.x MLA runs through backend
objects the table has no row for: there only the status test runs, and it states that MLA is not covered.

Stand-ins, because the kernels need a GPU: the JIT module FlashInfer builds (``gen_batch_mla_module`` returns a spec
whose ``build_and_load`` gives a CPU module: ``plan`` writes the batch's indptrs and lengths into the int workspace,
as FlashInfer's plan copies its plan there, and returns a plan vector of their offsets; ``run`` reads them back
through the plan vector it is given (a plan baked into the graph would read the wrong batch), computes MLA attention
from the q_nope/q_pe rows and the ckv/kpe pages, writes ``o``, ``lse`` when given and the float workspace, and is
opaque to Dynamo as FlashInfer's C++ function is); the pinned host buffer the wrapper allocates is an ordinary one.
Everything between is FlashInfer's and the shim's real code.
"""

from __future__ import annotations

import math
import random
import sys

import flashinfer
import flashinfer.mla
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim.declared.proven import PROVEN
from helpers import Compiles, apply_with, eager_then_compiled
from stand_in_gpu import RecordingSpec

WRAPPER = flashinfer.mla.BatchMLAPagedAttentionWrapper
MODULE = sys.modules[WRAPPER.__module__]
RUN = f"{WRAPPER.__module__}.get_batch_mla_module.run"
HEADS, CKV, KPE, PAGE = 4, 32, 16, 4


def _through_op() -> bool:
    """Whether the stand-in's caller is one of the shim's op kernels (the compiled path) or FlashInfer's run()."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name.startswith("_kernel_"):
            return True
        frame = frame.f_back
    return False


class StandInMLAModule:
    """Stands in for the built MLA JIT module (module docstring)."""

    def __init__(self, calls: list):
        self.calls = calls

    def plan(self, float_workspace, int_workspace, pinned, qo_indptr, kv_indptr, kv_lens, num_heads, head_dim_o,
             causal):
        batch = len(kv_lens)
        packed = torch.cat([qo_indptr, kv_indptr, kv_lens]).to(torch.int32)
        start = 16 * (1 + len(self.calls) % 7)  # each plan elsewhere: a plan read from the wrong place fails
        int_workspace[start * 4:(start + len(packed)) * 4].view(torch.int32).copy_(packed)
        return [batch, int(qo_indptr[-1]), start, start + batch + 1, start + 2 * (batch + 1)]

    @torch._dynamo.disable  # FlashInfer's C++ run: Dynamo cannot trace it
    def run(self, float_workspace, int_workspace, plan_info, q_nope, q_pe, ckv, kpe, kv_indices, o, lse, mask_mode,
            num_heads, page_size, sm_scale, return_lse_base_on_e, *rest):
        if not all(type(value) is int for value in plan_info):
            raise TypeError(f"plan_info_vec must hold ints, got {plan_info!r}")
        self.calls.append((_through_op(), list(plan_info)))
        batch, rows, qo_at, kv_at, lens_at = plan_info
        if q_nope.shape[0] != rows:
            raise RuntimeError(f"plan for {rows} rows, q holds {q_nope.shape[0]}")
        ints = int_workspace.view(torch.int32)
        qo, kv, lens = (ints[at:at + n].tolist() for at, n in ((qo_at, batch + 1), (kv_at, batch + 1),
                                                                (lens_at, batch)))
        for b in range(batch):
            pages = kv_indices[kv[b]:kv[b + 1]]
            keys, positions = ckv[pages].flatten(0, 1)[:lens[b]].float(), kpe[pages].flatten(0, 1)[:lens[b]].float()
            queries = slice(qo[b], qo[b + 1])
            scores = (torch.einsum("nhd,kd->nhk", q_nope[queries].float(), keys)
                      + torch.einsum("nhd,kd->nhk", q_pe[queries].float(), positions)) * sm_scale
            if mask_mode == 1:  # causal: query i of n sees the keys up to lens - n + i
                n = qo[b + 1] - qo[b]
                visible = torch.arange(lens[b])[None, :] <= (lens[b] - n + torch.arange(n))[:, None]
                scores = scores.masked_fill(~visible[:, None, :], -math.inf)
            o[queries] = torch.einsum("nhk,kd->nhd", scores.softmax(-1), keys).to(o.dtype)
            if lse is not None:
                lse[queries] = scores.logsumexp(-1) / (1.0 if return_lse_base_on_e else math.log(2))
        float_workspace[:8].fill_(rows)


@pytest.fixture
def mla():
    """Every declared op on (gate ``all``), with the stand-in MLA module; yields the stand-in's call record. Applied
    per test (a second each): what the layer does at apply time is then part of every test, as mutmut counts it."""
    calls: list = []
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        if hasattr(MODULE, "gen_batch_mla_module"):  # 0.7.x builds MLA's module elsewhere: nothing to stand in for
            patch.setattr(MODULE, "gen_batch_mla_module", lambda *a: RecordingSpec(StandInMLAModule(calls)))
            MODULE.get_batch_mla_module.cache_clear()
        yield {"calls": calls, "status": status["flashinfer_ops"]}
        if hasattr(MODULE, "gen_batch_mla_module"):
            MODULE.get_batch_mla_module.cache_clear()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


@pytest.fixture
def covered(mla):
    if RUN not in mla["status"]["registered"]:
        pytest.skip(f"FlashInfer {flashinfer.__version__}'s MLA wrapper is not covered: "
                    "test_status_says_what_of_the_mla_wrapper_is_covered_and_what_stays_flashinfers states it")
    return mla


def _wrapper(use_cuda_graph: bool = False, batch: int = 4):
    """FlashInfer's wrapper on CPU; with ``use_cuda_graph`` the buffers its plan() rewrites, for ``batch`` requests."""
    buffers = {}
    if use_cuda_graph:
        buffers = dict(zip(("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"),
                           (torch.zeros(n, dtype=torch.int32) for n in (batch + 1, batch + 1, 64, batch))))
    empty = torch.empty
    with pytest.MonkeyPatch.context() as patch:  # CPU torch has no pinned memory
        patch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: empty(*a, **k))
        return WRAPPER(torch.zeros(1 << 12, dtype=torch.uint8), use_cuda_graph=use_cuda_graph, backend="fa2",
                       **buffers)


def _plan(wrapper, pages_per_request, rows=None, causal=True, use_profiler=False) -> int:
    """plan() for requests holding these numbers of pages (the last one 1 to PAGE full) and ``rows`` query rows
    each (1 by default: decode), eagerly as a serving loop does; returns the q rows."""
    batch = len(pages_per_request)
    rows = rows or [1] * batch
    kv_indptr = torch.tensor([0, *pages_per_request], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    qo_indptr = torch.tensor([0, *rows], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kv_lens = torch.tensor([(p - 1) * PAGE + 1 + b % PAGE for b, p in enumerate(pages_per_request)], dtype=torch.int32)
    kv_lens = torch.maximum(kv_lens, torch.tensor(rows, dtype=torch.int32))
    indices = torch.randperm(64, generator=torch.Generator().manual_seed(batch))[:int(kv_indptr[-1])].int()
    wrapper.plan(qo_indptr, kv_indptr, indices, kv_lens, HEADS, CKV, KPE, PAGE, causal, 1 / math.sqrt(CKV + KPE),
                 torch.float16, torch.float16, use_profiler=use_profiler)
    return int(qo_indptr[-1])


def _cache(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(64, PAGE, dim, dtype=torch.float16, generator=generator) for dim in (CKV, KPE))


def _query(rows: int, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, HEADS, dim, dtype=torch.float16, generator=generator) for dim in (CKV, KPE))


def _run(wrapper, q, cache, **options):
    return wrapper.run(*q, *cache, return_lse=True, **options)


def _op_name(mla) -> str:
    return mla["status"]["registered"][RUN].split("::")[1]


def test_status_says_what_of_the_mla_wrapper_is_covered_and_what_stays_flashinfers(mla):
    """Nothing of MLA is left out silently: the fa2/fa3 run is an op (0.5.3-0.6.x) and the profiler's module and the
    cutlass backend are listed as not covered; on a release whose MLA the attention table has no row for (0.7.x),
    the wrapper is listed as not covered."""
    status = mla["status"]
    uncovered = [line for line in status["helpers"] if line.startswith("not covered:")]
    if RUN in status["registered"]:
        assert status["registered"][RUN] == f"{declared_layer.NAMESPACE}::batch_mla_run"
        assert any("get_batch_mla_module(..., use_profiler=True).run" in line for line in uncovered), uncovered
        assert any("backend='cutlass'" in line and "cutlass_mla_paged_attention" in line for line in uncovered)
        assert "flashinfer.mla.BatchMLAPagedAttentionWrapper._cached_module" in status["helpers"]
    else:
        assert not any("batch_mla" in key for key in status["registered"])
        assert uncovered == [f"not covered: {WRAPPER.__module__}.BatchMLAPagedAttentionWrapper.run stays FlashInfer's: "
                             f"the attention table has no row for it in FlashInfer {flashinfer.__version__} (0.7.x "
                             "runs MLA through backend objects, flashinfer.mla._batch_mla, which the table does not "
                             "read)"]


def test_run_traces_to_its_op_with_no_graph_break(covered):
    wrapper, cache = _wrapper(), _cache()
    rows = _plan(wrapper, [2, 3, 1], rows=[1, 2, 1])
    torch._dynamo.reset()
    backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend=backend)(_query(rows))
    targets = [str(node.target) for graph in backend.graphs for node in graph.graph.nodes
               if node.op == "call_function" and declared_layer.NAMESPACE in str(node.target)]
    assert targets == [f"{declared_layer.NAMESPACE}.{_op_name(covered)}.default"]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_run_equals_eager_bit_for_bit_with_its_in_place_writes(covered, backend, causal):
    """Outputs, the caller's ``out``/``lse`` buffers and both workspaces; eagerly FlashInfer's run calls the module
    itself (no op), compiled it goes through the op."""
    wrapper, cache = _wrapper(), _cache()
    rows = _plan(wrapper, [2, 3, 1, 4], rows=[1, 3, 1, 2], causal=causal)
    q = _query(rows)

    def call(q, out, lse):
        return _run(wrapper, q, cache, out=out, lse=lse)

    def prepare():
        wrapper._float_workspace_buffer.zero_()
        covered["calls"].clear()
        return q, torch.full_like(q[0], -1), torch.full((rows, HEADS), -1.0)

    def record(compiled, returned, arguments):
        assert covered["calls"] == [(compiled, list(wrapper._plan_info))]
        return (*returned, *arguments[1:], wrapper._float_workspace_buffer.clone(),
                wrapper._int_workspace_buffer.clone())

    eager_then_compiled(call, backend, prepare, record)


def test_a_run_without_lse_passes_none_where_the_schema_takes_an_optional_tensor(covered):
    wrapper, cache = _wrapper(), _cache()
    q = _query(_plan(wrapper, [2, 3], rows=[2, 1]))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: wrapper.run(*q, *cache), fullgraph=True, backend="aot_eager")(q)
    assert torch.equal(compiled, wrapper.run(*q, *cache))


def test_twenty_plan_and_run_steps_with_changing_batches_compile_once_under_dynamic_shapes(covered):
    """plan() leaves the plan vector as a tensor and the module as the same traced namespace for the same getter
    arguments: with ``dynamic=True`` nothing a step changes is a guard."""
    wrapper, cache = _wrapper(), _cache()
    rng = random.Random(0)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend="inductor", dynamic=True)
    with Compiles() as compiles:
        for step in range(20):
            pages = [rng.randint(2, 4) for _ in range(rng.randint(2, 6))]
            q = _query(_plan(wrapper, pages, rows=[rng.randint(2, 3) for _ in pages]), seed=step)
            out, lse = compiled(q)
            eager_out, eager_lse = _run(wrapper, q, cache)
            assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step
    assert compiles.count == 1, compiles.recompiled_for


@pytest.mark.parametrize("dynamic", [False, None, True])
def test_twenty_cuda_graph_steps_with_changing_lengths_compile_once_under_every_dynamic_setting(covered, dynamic):
    """A ``use_cuda_graph=True`` wrapper keeps its batch and buffers; plan() rewrites them and the plan vector. The
    plan reaches the op as a tensor: under ``dynamic=False`` (SGLang's) too, a new plan is a new argument, not a
    recompile."""
    wrapper, cache = _wrapper(use_cuda_graph=True, batch=4), _cache()
    rng = random.Random(1)
    covered["calls"].clear()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend="aot_eager", dynamic=dynamic)
    with Compiles() as compiles:
        for step in range(20):
            q = _query(_plan(wrapper, [rng.randint(1, 4) for _ in range(4)]), seed=step)
            out, lse = compiled(q)
            eager_out, eager_lse = _run(wrapper, q, cache)
            assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step
    assert compiles.count == 1, compiles.recompiled_for
    assert len({tuple(plan) for _, plan in covered["calls"]}) > 5  # the plans did change


def test_opcheck_holds_the_op_with_the_stand_in_kernel(covered):
    """torch.library.opcheck runs the op (the stand-in module's run through the getter, the plan as a tensor) and
    checks its schema's write claims (both workspaces, o, lse), its fake and its registration."""
    wrapper, cache = _wrapper(), _cache()
    rows = _plan(wrapper, [2, 3], rows=[1, 2])
    op = getattr(getattr(torch.ops, declared_layer.NAMESPACE), _op_name(covered)).default
    q_nope, q_pe = _query(rows)
    values = {"backend": "fa2", "dtype_q": torch.float16, "dtype_kv": torch.float16, "dtype_o": torch.float16,
              "dtype_idx": torch.int32, "head_dim_ckv": CKV, "head_dim_kpe": KPE, "use_profiler": False,
              "float_workspace_buffer": wrapper._float_workspace_buffer,
              "int_workspace_buffer": wrapper._int_workspace_buffer,
              "plan_info_vec": torch.tensor(wrapper._plan_info, dtype=torch.int64), "q_nope": q_nope, "q_pe": q_pe,
              "ckv_cache": cache[0], "kpe_cache": cache[1], "kv_indices": wrapper._kv_indices_buf,
              "o": torch.zeros_like(q_nope), "maybe_lse": torch.zeros(rows, HEADS), "mask_mode_code": 1,
              "num_heads": HEADS, "page_size": PAGE, "sm_scale": 0.125, "return_lse_base_on_e": False,
              "ckv_scale": 1.0, "kpe_scale": 1.0}
    # Optional where the table marks it (``?``) and where the plan crosses (None for a plan its kernel does not read).
    optional = {a.name for a in op._schema.arguments if isinstance(a.type, torch.OptionalType)}
    assert optional - {"maybe_ckv_scale_arr"} == {"plan_info_vec", "maybe_lse"}  # 0.6.18 adds the scale array
    torch.library.opcheck(op, [values.get(a.name.removeprefix("getter_")) for a in op._schema.arguments])


def test_a_wrapper_planned_with_the_profiler_refuses_to_compile_and_says_why(covered):
    wrapper, cache = _wrapper(), _cache()
    rows = _plan(wrapper, [2, 2], use_profiler=True)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"use_profiler=True\)\.run stays FlashInfer's: .*profiler buffer"):
        torch.compile(lambda q: _run(wrapper, q, cache, profiler_buffer=torch.empty(8, dtype=torch.uint64)),
                      fullgraph=True, backend="aot_eager")(_query(rows))


def test_revert_takes_the_wrapper_back_and_compiling_fails_again_as_without_the_shim(covered):
    wrapper, cache = _wrapper(), _cache()
    _plan(wrapper, [2, 2])
    fp4_dynamo_shim.revert()
    try:
        assert not {"_plan_info", "_cached_module"} & set(vars(WRAPPER))
        rows = _plan(wrapper, [3, 1])
        assert isinstance(wrapper._cached_module, StandInMLAModule)  # FlashInfer's own attribute again
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend="aot_eager")(_query(rows))
    finally:
        assert fp4_dynamo_shim.apply()  # under the fixture's gate, for the tests after this one
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="was planned before the shim applied"):
        torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend="aot_eager")(_query(rows))
    rows = _plan(wrapper, [3, 1])
    torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend="aot_eager")(_query(rows))


def test_under_the_default_gate_the_run_is_an_op_exactly_where_a_gpu_run_proved_it(monkeypatch):
    """The default gate registers the run where the release's GPU record proves it (0.6.12), and a compiled run
    then reaches the op; elsewhere the wrapper stays FlashInfer's."""
    status = apply_with(monkeypatch, FLASHINFER_OPS=None)
    assert status["applied"], status["problem"]
    proven = RUN in PROVEN.get(flashinfer.__version__, {}).get("declarations", {})
    assert (RUN in status["flashinfer_ops"]["registered"]) == proven
    assert ("_cached_module" in vars(WRAPPER)) == proven
    if proven:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(MODULE, "gen_batch_mla_module", lambda *a: RecordingSpec(StandInMLAModule([])))
            MODULE.get_batch_mla_module.cache_clear()
            wrapper, cache = _wrapper(), _cache()
            rows = _plan(wrapper, [2, 3, 1], rows=[1, 2, 1])
            backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
            torch.compile(lambda q: _run(wrapper, q, cache), fullgraph=True, backend=backend)(_query(rows))
            targets = [str(node.target) for graph in backend.graphs for node in graph.graph.nodes
                       if declared_layer.NAMESPACE in str(node.target)]
            assert targets == [f"{declared_layer.NAMESPACE}.batch_mla_run.default"]
        MODULE.get_batch_mla_module.cache_clear()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()
