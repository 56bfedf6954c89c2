"""FlashInfer's batch decode wrapper's ``run`` as the shim's op under ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on CPU.

``plan()`` runs eagerly, outside the compiled function, as FlashInfer's; ``run()`` is compiled. The module plan() built
reaches the op through the getter's polyfill for its arguments, and the plan's int list reaches it as a tensor, so a
new plan is a new argument, not a guard (``declared/wrappers.py``).

Stand-ins, because the kernels need a GPU: the JIT modules FlashInfer builds (``tests/support/attention_stand_ins.py``
says what they compute and what they leave to the GPU run); the pinned host buffer the wrapper allocates is an
ordinary one (CPU torch has no pinned memory). Everything between is FlashInfer's and the shim's real code.
"""

from __future__ import annotations

import random

import flashinfer
import flashinfer.decode
import flashinfer.prefill
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim.declared.proven import PROVEN
from attention_stand_ins import clear_getters, stand_in_modules
from helpers import Compiles, apply_with, eager_then_compiled

DECODE = "flashinfer.decode.get_batch_decode_module.run_batch_decode"
HEADS, KV_HEADS, DIM, PAGE = 4, 2, 64, 4
#: The batch's sizes FlashInfer's plan() keeps as ints and run() reads: symbols under tracing, each a property.
SIZES = ("_batch_size", "_max_q_len", "_max_kv_len", "_qo_indptr_last")


@pytest.fixture(scope="module")
def attention():
    """Every declared op on (gate ``all``), with the stand-in JIT modules; yields the stand-ins' call record."""
    calls: list = []
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        stand_in_modules(patch, calls)
        yield {"calls": calls, "status": status["flashinfer_ops"]}
        clear_getters()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _wrapper(kind: str = "decode", use_cuda_graph: bool = False, batch: int = 4, max_pages: int = 64):
    """FlashInfer's wrapper on CPU (its pinned host buffer an ordinary one: module docstring)."""
    empty = torch.empty
    buffers = {}
    if use_cuda_graph:  # the buffers plan() rewrites: FlashInfer's names, per wrapper
        indptr, indices, last = (torch.zeros(n, dtype=torch.int32) for n in (batch + 1, max_pages, batch))
        buffers = {"decode": dict(paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                                  paged_kv_last_page_len_buffer=last),
                   "prefill_paged": dict(qo_indptr_buf=indptr.clone(), paged_kv_indptr_buf=indptr,
                                         paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last),
                   "prefill_ragged": dict(qo_indptr_buf=indptr.clone(), kv_indptr_buf=indptr)
                   }[kind if kind in ("prefill_paged", "prefill_ragged") else "decode"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: empty(*a, **k))
        return CASES[kind].wrapper(torch.zeros(1 << 16, dtype=torch.uint8), "NHD", use_cuda_graph=use_cuda_graph,
                                   backend="fa2", **buffers, **CASES[kind].options)


def _plan(wrapper, pages_per_request, last_page_len=3, rows=None):
    """plan() for requests holding these numbers of pages (page ids in order; a prefill request has ``rows`` of q
    rows, 1 + its index by default), eagerly, as a serving loop does."""
    batch = len(pages_per_request)
    indptr = torch.tensor([0, *pages_per_request], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    qo_indptr = torch.tensor([0, *(rows or range(1, batch + 1))], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    indices = torch.arange(int(indptr[-1]), dtype=torch.int32)
    last = torch.full((batch,), last_page_len, dtype=torch.int32)
    dtypes = {"q_data_type": torch.float16, "kv_data_type": torch.float16}
    if isinstance(wrapper, flashinfer.BatchDecodeWithPagedKVCacheWrapper):
        wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, **dtypes)
    elif isinstance(wrapper, flashinfer.BatchPrefillWithPagedKVCacheWrapper):
        wrapper.plan(qo_indptr, indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, causal=True, **dtypes)
    else:  # ragged: request b holds pages * PAGE keys
        wrapper.plan(qo_indptr, indptr * PAGE, HEADS, KV_HEADS, DIM, causal=True, **dtypes)
    return int(qo_indptr[-1]) if not isinstance(wrapper, flashinfer.BatchDecodeWithPagedKVCacheWrapper) else batch


class Case:
    def __init__(self, key, wrapper, run, **options):
        self.key, self.wrapper, self.run, self.options = key, wrapper, run, options


CASES = {
    "decode": Case(DECODE, flashinfer.BatchDecodeWithPagedKVCacheWrapper,
                   lambda w, q, cache, **k: w.run(q, cache, **k)),
    "decode_tensor_cores": Case("flashinfer.prefill.get_batch_prefill_module.paged_run",
                                flashinfer.BatchDecodeWithPagedKVCacheWrapper,
                                lambda w, q, cache, **k: w.run(q, cache, **k), use_tensor_cores=True),
    "prefill_paged": Case("flashinfer.prefill.get_batch_prefill_module.paged_run",
                          flashinfer.BatchPrefillWithPagedKVCacheWrapper,
                          lambda w, q, cache, **k: w.run(q, cache, **k)),
    "prefill_ragged": Case("flashinfer.prefill.get_batch_prefill_module.ragged_run",
                           flashinfer.BatchPrefillWithRaggedKVCacheWrapper,
                           lambda w, q, cache, **k: w.run(q, *(c.flatten(0, 1) for c in cache), **k)),
}


def _cache(pages: int = 64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(pages, PAGE, KV_HEADS, DIM, dtype=torch.float16, generator=generator) for _ in range(2))


def _query(rows: int, seed: int = 1):
    return torch.randn(rows, HEADS, DIM, dtype=torch.float16, generator=torch.Generator().manual_seed(seed))


def _op_name(attention, kind: str = "decode") -> str:
    return attention["status"]["registered"][CASES[kind].key].split("::")[1]


@pytest.mark.parametrize("kind", CASES)
def test_wrapper_run_traces_to_its_op_with_no_graph_break(attention, kind):
    wrapper, cache = _wrapper(kind), _cache()
    rows = _plan(wrapper, [2, 3, 1])
    torch._dynamo.reset()
    backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(lambda q: CASES[kind].run(wrapper, q, cache, return_lse=True), fullgraph=True,
                  backend=backend)(_query(rows))
    targets = [str(node.target) for graph in backend.graphs for node in graph.graph.nodes
               if node.op == "call_function" and declared_layer.NAMESPACE in str(node.target)]
    assert targets == [f"{declared_layer.NAMESPACE}.{_op_name(attention, kind)}.default"]
    owner = CASES[kind].wrapper
    assert {f"{owner.__module__}.{owner.__name__}.{name}" for name in ("_plan_info", *SIZES)} <= set(
        attention["status"]["helpers"])
    # This torch has DynamicInt: no size stays a guard, so status() has no line saying one does.
    assert not [line for line in attention["status"]["helpers"] if "attention wrappers" in line]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind", CASES)
def test_compiled_run_equals_eager_bit_for_bit_with_its_in_place_writes(attention, kind, backend):
    """Outputs, the caller's ``out``/``lse`` buffers and both workspaces: a write the schema left out, or a plan
    read from the wrong place, would differ here."""
    wrapper, cache = _wrapper(kind), _cache()
    rows = _plan(wrapper, [2, 3, 1, 4])
    q = _query(rows)

    def call(q, out, lse):
        return CASES[kind].run(wrapper, q, cache, out=out, lse=lse, return_lse=True)

    def prepare():
        wrapper._float_workspace_buffer.zero_()
        wrapper._int_workspace_buffer.zero_()
        attention["calls"].clear()
        return q, torch.full_like(q, -1), torch.full((rows, HEADS), -1.0)

    def record(compiled, returned, arguments):
        assert attention["calls"] == [(compiled, list(wrapper._plan_info))]  # eager: FlashInfer's own call, no op
        return (*returned, *arguments[1:], wrapper._float_workspace_buffer.clone(),
                wrapper._int_workspace_buffer.clone())

    eager_then_compiled(call, backend, prepare, record)


def _steps(kind, wrapper, compiled, cache, batches, rows):
    """Plan eagerly, run compiled and eagerly, for each batch (pages per request; ``rows(pages)``: each request's
    query rows); every step equal."""
    for step, pages in enumerate(batches):
        q = _query(_plan(wrapper, pages, last_page_len=1 + step % PAGE, rows=rows(pages)), seed=step)
        out, lse = compiled(q)
        eager_out, eager_lse = CASES[kind].run(wrapper, q, cache, return_lse=True)
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step


def _as_in_a_new_process() -> None:
    """FlashInfer's per-process buffer cache (``flashinfer.utils._cache_buf``, its ALiBi slopes among them) empty,
    as a new process has it: the first run of a process fills it, and no public call empties it."""
    flashinfer.utils._cache_buf.clear()


def _changing_batches(seed: int, batch=None):
    """Twenty batches of 2 to 9 requests of 2 to 6 pages (or ``batch`` requests of 1 to 12 pages): composition and
    lengths change every step. Sizes stay >= 2 where they change, as Dynamo specialises 0 and 1."""
    rng = random.Random(seed)
    if batch:
        return [[rng.randint(1, 12) for _ in range(batch)] for _ in range(20)], rng
    return [[rng.randint(2, 6) for _ in range(rng.randint(2, 9))] for _ in range(20)], rng


@pytest.mark.parametrize("kind", CASES)
def test_twenty_steps_with_changing_batches_never_recompile_under_dynamic_shapes(attention, kind):
    """plan() leaves the plan vector as a tensor and the batch's sizes (``_max_q_len``, ``_max_kv_len``,
    ``_batch_size``, ``_qo_indptr_last``) as symbols, and fills FlashInfer's ALiBi cache that the first run would
    fill: with ``dynamic=True`` nothing a step changes is a guard. No eager warm-up run first."""
    wrapper, cache = _wrapper(kind), _cache()
    batches, rng = _changing_batches(0)
    _as_in_a_new_process()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: CASES[kind].run(wrapper, q, cache, return_lse=True), fullgraph=True,
                             backend="inductor", dynamic=True)
    with Compiles() as compiles:
        _steps(kind, wrapper, compiled, cache, batches, lambda pages: [rng.randint(2, 5) for _ in pages])
    assert compiles.count == 1, compiles.recompiled_for


@pytest.mark.parametrize("kind", CASES)
def test_under_automatic_dynamic_shapes_the_one_recompile_is_the_first_new_batch_size(attention, kind):
    """With torch.compile's default (``dynamic=None``) Dynamo compiles q's rows and the index buffers plan()
    allocates as constants, then once more as symbols when they first change, as for any function; nothing else
    the plan holds is a guard."""
    wrapper, cache = _wrapper(kind), _cache()
    batches, rng = _changing_batches(0)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: CASES[kind].run(wrapper, q, cache, return_lse=True), fullgraph=True,
                             backend="aot_eager")
    with Compiles() as compiles:
        _steps(kind, wrapper, compiled, cache, batches, lambda pages: [rng.randint(2, 5) for _ in pages])
    assert compiles.count == 2, compiles.recompiled_for
    assert "size mismatch at index 0" in compiles.recompiled_for[0], compiles.recompiled_for


@pytest.mark.parametrize("dynamic", [False, None, True])
@pytest.mark.parametrize("kind", CASES)
def test_twenty_cuda_graph_steps_with_changing_lengths_never_recompile(attention, kind, dynamic):
    """A ``use_cuda_graph=True`` wrapper keeps its batch and buffers; plan() rewrites them, the plan vector and the
    lengths. 0 recompilations under every ``dynamic=`` setting, ``False`` included (SGLang's), with no eager
    warm-up run first."""
    wrapper, cache = _wrapper(kind, use_cuda_graph=True, batch=4), _cache()
    batches, _ = _changing_batches(1, batch=4)
    attention["calls"].clear()
    _as_in_a_new_process()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: CASES[kind].run(wrapper, q, cache, return_lse=True), fullgraph=True,
                             backend="aot_eager", dynamic=dynamic)
    with Compiles() as compiles:
        _steps(kind, wrapper, compiled, cache, batches, lambda pages: [3] * len(pages))
    assert compiles.count == 1, compiles.recompiled_for
    assert len({tuple(plan) for _, plan in attention["calls"]}) > 10  # the plans did change


@pytest.mark.parametrize("kind", CASES)
def test_opcheck_holds_each_wrapper_op_with_the_stand_in_kernel(attention, kind):
    """torch.library.opcheck runs the op (FlashInfer's run on the stand-in module, the plan as a tensor) and checks
    its schema's write claims (both workspaces, o, lse), its fake and its registration."""
    wrapper, cache = _wrapper(kind), _cache()
    rows = _plan(wrapper, [2, 3])
    op = getattr(getattr(torch.ops, declared_layer.NAMESPACE), _op_name(attention, kind)).default
    q = _query(rows)
    keys, values = (c.flatten(0, 1) for c in cache) if kind == "prefill_ragged" else cache
    buffers = {name.lstrip("_").removesuffix("_buf"): getattr(wrapper, name)
               for name in vars(wrapper) if name.endswith(("_buf", "_buffer")) and isinstance(getattr(wrapper, name),
                                                                                            torch.Tensor)}
    values = {**buffers, "plan_info_vec": torch.tensor(wrapper._plan_info, dtype=torch.int64), "q": q,
              "paged_k_cache": keys, "paged_v_cache": values, "k": keys, "v": values, "o": torch.empty_like(q),
              "maybe_lse": torch.empty(rows, HEADS),
              "backend": "fa2", "dtype_q": torch.float16, "dtype_kv": torch.float16, "dtype_o": torch.float16,
              "dtype_idx": torch.int32, "head_dim_qk": DIM, "head_dim_vo": DIM, "window_left": -1,
              "sm_scale": 0.125, "rope_scale": 1.0, "rope_theta": 1e4}
    arguments = [values.get(a.name.removeprefix("getter_"), None if isinstance(a.type, torch.OptionalType) else
                            {"bool": False, "float": 0.0}.get(str(a.type), 0)) for a in op._schema.arguments]
    torch.library.opcheck(op, arguments)


@pytest.mark.parametrize("kind", CASES)
def test_a_wrong_out_buffer_raises_flashinfers_error_eager_and_compiled(attention, kind):
    """FlashInfer's own check runs before the op, in the traced code: compiled code raises its ValueError as eager
    does. Under fullgraph=True Dynamo (torch 2.13) reports any exception a traced callee raises as Unsupported, with
    FlashInfer's message: the class is torch's choice there, for every FlashInfer function alike."""
    wrapper, cache = _wrapper(kind), _cache()
    rows = _plan(wrapper, [2, 2])
    q, wrong = _query(rows), torch.empty(rows, HEADS, DIM, dtype=torch.float32)
    call = lambda q: CASES[kind].run(wrapper, q, cache, out=wrong)  # noqa: E731
    torch._dynamo.reset()
    for function in (call, torch.compile(call, backend="aot_eager")):
        with pytest.raises(ValueError, match="out"):
            function(q)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="out"):
        torch.compile(call, fullgraph=True, backend="aot_eager")(q)


def test_revert_takes_the_wrappers_back_and_compiling_fails_again_as_without_the_shim(attention):
    wrapper, cache = _wrapper(), _cache()
    _plan(wrapper, [2, 2])
    torch._dynamo.reset()
    torch.compile(lambda q: wrapper.run(q, cache), fullgraph=True, backend="aot_eager")(_query(2))  # carried now
    fp4_dynamo_shim.revert()
    try:
        assert not any(name in vars(case.wrapper) for case in CASES.values() for name in ("_plan_info", *SIZES))
        _plan(wrapper, [3, 2])
        assert wrapper._plan_info == [2, 5, 3, 0, 1]  # FlashInfer's own attribute again
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(lambda q: wrapper.run(q, cache), fullgraph=True, backend="aot_eager")(_query(2))
    finally:
        assert fp4_dynamo_shim.apply()  # under the fixture's gate, for the tests after this one
    assert wrapper._plan_info == [2, 5, 3, 0, 1]  # eagerly, the plan stored while reverted, not the one before
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=(  # a plan stored while reverted
            r"this BatchDecodeWithPagedKVCacheWrapper was planned before the shim applied: call plan\(\) again "
            r"before compiling run\(\)")):
        torch.compile(lambda q: wrapper.run(q, cache), fullgraph=True, backend="aot_eager")(_query(2))
    _plan(wrapper, [3, 1])
    torch.compile(lambda q: wrapper.run(q, cache), fullgraph=True, backend="aot_eager")(_query(2))


def test_a_wrapper_never_planned_has_no_plan_as_without_the_shim(attention):
    """FlashInfer's decode wrapper sets no ``_plan_info`` before plan(), and reads it with ``getattr(..., None)``:
    the property answers as a missing attribute does."""
    wrapper = _wrapper()
    assert getattr(wrapper, "_plan_info", "absent") == "absent"
    with pytest.raises(AttributeError, match="'BatchDecodeWithPagedKVCacheWrapper' object has no attribute '_plan_info'"):
        wrapper._plan_info


def _made_for_compiled_code(wrapper) -> list:
    """What the wrapper holds that FlashInfer's plan() does not make: symbols for its sizes, its plan as a tensor.
    Read from the instance: no public seam shows when the shim makes them, only what it costs plan()."""
    plan = wrapper.__dict__.get("_plan_info")
    return [value for value in vars(wrapper).values() if type(value).__name__ == "DynamicInt" or (
        isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.tolist() == list(plan or ()))]


def test_plan_makes_nothing_for_compiled_code_until_dynamo_first_traces_a_run(attention):
    """An eager program pays plan() no tensor and no symbol: they are made when Dynamo first traces a wrapper's run,
    for every wrapper planned until then (also one never compiled), and from then on as plan() stores."""
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()  # an application with nothing traced yet, under the fixture's gate
    first, second, third, cache = _wrapper(), _wrapper(), _wrapper(), _cache()
    _plan(first, [2, 2])
    _plan(second, [1, 3])
    assert _made_for_compiled_code(first) == _made_for_compiled_code(second) == []
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: first.run(q, cache), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(_query(2)), first.run(_query(2), cache))
    assert _made_for_compiled_code(first) and _made_for_compiled_code(second)
    _plan(third, [4])
    assert _made_for_compiled_code(third)


def test_under_the_default_gate_a_wrapper_traces_exactly_when_a_gpu_run_proved_its_run(monkeypatch):
    """A run the release's GPU record proves is an op under the default gate, and compiles to it; any other stays
    FlashInfer's (its wrapper unchanged), with the reason in status()."""
    status = apply_with(monkeypatch, FLASHINFER_OPS=None)
    assert status["applied"], status["problem"]
    ops, proven_keys = status["flashinfer_ops"], set(PROVEN.get(flashinfer.__version__, {}).get("declarations", ()))
    traced_classes = {case.wrapper for case in CASES.values() if case.key in proven_keys}
    for kind, case in CASES.items():
        assert (case.key in ops["registered"]) == (case.key in proven_keys), kind
        assert ("_plan_info" in vars(case.wrapper)) == (case.wrapper in traced_classes), kind
        if case.key not in proven_keys and case.key in ops["not_registered"]:
            assert "FLASHINFER_OPS=proven (the default)" in ops["not_registered"][case.key]["reason"], kind
    with pytest.MonkeyPatch.context() as patch:
        stand_in_modules(patch, [])
        for kind in [kind for kind, case in CASES.items() if case.key in proven_keys]:
            wrapper, cache = _wrapper(kind), _cache()
            rows = _plan(wrapper, [2, 3, 1])
            torch._dynamo.reset()
            backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
            torch.compile(lambda q: CASES[kind].run(wrapper, q, cache), fullgraph=True, backend=backend)(_query(rows))
            assert [str(node.target) for graph in backend.graphs for node in graph.graph.nodes
                    if declared_layer.NAMESPACE in str(node.target)] == [
                f"{ops['registered'][CASES[kind].key].replace('::', '.')}.default"], kind
    clear_getters()


@pytest.mark.parametrize("kind", ["decode", "prefill_paged"])
def test_a_kv_cache_of_one_tensor_compiles_equal_to_eager_under_dynamic_shapes(attention, kind):
    """FlashInfer's documented single-tensor KV layout, ``[pages, 2, page, heads, dim]``, which ``run()`` unbinds
    into its K and V halves (views of one tensor at two offsets). The op writes them (FlashInfer declares so), and
    Inductor rebuilds a written view from its base at its storage offset, which torch cannot lower by itself: the
    shim supplies the lowering (status()'s helpers say so), or V would be read at K's offset."""
    wrapper = _wrapper(kind)
    kv = torch.randn(48, 2, PAGE, KV_HEADS, DIM, dtype=torch.float16, generator=torch.Generator().manual_seed(0))
    q = _query(_plan(wrapper, [2, 3, 1, 4]))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, kv: wrapper.run(q, kv, return_lse=True), fullgraph=True, backend="inductor",
                             dynamic=True)
    assert all(torch.equal(a, b) for a, b in zip(compiled(q, kv), wrapper.run(q, kv, return_lse=True)))
