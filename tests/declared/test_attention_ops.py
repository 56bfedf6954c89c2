"""FlashInfer's single decode and single prefill as real ops under ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on CPU.

Their getters take ``*args`` (single prefill's also an unannotated ``backend``), so the declared layer reads their
parameters from the per-release attention table; single decode's run also writes ``maybe_lse``, which FlashInfer's
``mutates_args`` leaves out and the table adds.

Stand-ins, because the kernels need a GPU, each named where used: the JIT modules FlashInfer builds
(``gen_single_decode_module``/``gen_single_prefill_module`` return a spec whose ``build_and_load`` gives a CPU
module computing attention with the default scale, writing ``o``, ``lse`` and ``tmp`` as the C++ run functions
do); FlashInfer's device query answers SM90 for cuda:0 under tracing (``declared_layer.CAPABILITIES``) and, for the
``auto`` backend, ``torch.version.cuda`` answers as a CUDA build of torch does. Everything between is FlashInfer's
and the shim's real code. Limits: the stand-in reads none of the scalars (soft cap, scales, window), so the GPU
run (tests/gpu) holds the values; here it holds the graph, the writes and the eager path.
"""

from __future__ import annotations

import math
import sys

import flashinfer
import flashinfer.decode
import flashinfer.prefill
import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim.verify import checks
from helpers import apply_with
from stand_in_gpu import RecordingSpec

DECODE = "flashinfer.decode.get_single_decode_module.run_single_decode"
PREFILL = "flashinfer.prefill.get_single_prefill_module.run_single_prefill"
OPS = {DECODE: "run_single_decode", PREFILL: "run_single_prefill"}


class StandInModule:
    """Stands in for a built attention JIT module: ``run(q, k, v, tmp, o, maybe_lse, ...)`` as the C++ takes
    them, writing softmax(q k^T / sqrt(d)) v into ``o``, its log-sum-exp into ``maybe_lse`` and a pattern into
    ``tmp``; records whether the call came through one of the shim's op kernels."""

    def __init__(self, calls: list, decode: bool):
        self.calls, self.decode = calls, decode

    def run(self, q, k, v, tmp, o, maybe_lse, *scalars):
        frame, through_op = sys._getframe(1), False
        while frame is not None:
            through_op |= frame.f_code.co_name.startswith("_kernel_")
            frame = frame.f_back
        self.calls.append(through_op)
        q, o = (q.unsqueeze(0), o.unsqueeze(0)) if self.decode else (q, o)
        group = q.shape[1] // k.shape[1]
        keys, values = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
        scores = torch.einsum("nhd,khd->hnk", q.float(), keys) / math.sqrt(q.shape[-1])
        o.copy_(torch.einsum("hnk,khd->nhd", scores.softmax(-1), values).to(o.dtype))
        if maybe_lse is not None:
            maybe_lse.copy_(scores.logsumexp(-1).transpose(0, 1).reshape(maybe_lse.shape))
        tmp.fill_(7)


def _clear_getters():
    flashinfer.decode.get_single_decode_module.cache_clear()
    flashinfer.prefill.get_single_prefill_module.cache_clear()


@pytest.fixture(scope="module")
def attention():
    """Every declared op on (gate ``all``), with the stand-in JIT modules; yields the stand-ins' call record."""
    calls: list = []
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        patch.setitem(declared_layer.CAPABILITIES, 0, (9, 0))  # stand-in: no GPU to ask (module docstring)
        patch.setattr(flashinfer.decode, "gen_single_decode_module", lambda *a: RecordingSpec(StandInModule(calls, True)))
        patch.setattr(flashinfer.prefill, "gen_single_prefill_module",
                      lambda *a: RecordingSpec(StandInModule(calls, False)))
        _clear_getters()
        yield {"calls": calls, "status": status["flashinfer_ops"]}
        _clear_getters()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _inputs(device: str, decode: bool):
    torch.manual_seed(0)
    q = torch.randn(*((8,) if decode else (5, 8)), 64, dtype=torch.float16, device=device)
    return q, torch.randn(16, 2, 64, dtype=torch.float16, device=device), torch.randn(
        16, 2, 64, dtype=torch.float16, device=device)


CALLS = {  # name -> (decode inputs?, the public call, the op it must reach)
    "decode": (True, lambda q, k, v: flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True), DECODE),
    "decode_tensor_cores": (True, lambda q, k, v: flashinfer.single_decode_with_kv_cache(
        q, k, v, use_tensor_cores=True, return_lse=True), PREFILL),
    "prefill_fa2": (False, lambda q, k, v: flashinfer.single_prefill_with_kv_cache(
        q, k, v, causal=True, backend="fa2", return_lse=True), PREFILL),
    "prefill_fa3": (False, lambda q, k, v: flashinfer.single_prefill_with_kv_cache(
        q, k, v, backend="fa3", return_lse=True), PREFILL),
}


@pytest.mark.parametrize("name", [*CALLS, "prefill_auto"])
def test_single_attention_traces_to_its_op_with_no_graph_break(attention, monkeypatch, name):
    decode, call, op = CALLS.get(name, (False, lambda q, k, v: flashinfer.single_prefill_with_kv_cache(q, k, v),
                                        PREFILL))
    if name == "prefill_auto":  # stand-in: a CUDA build of torch, for FlashInfer's backend choice
        monkeypatch.setattr(torch.version, "cuda", "12.8")
    with FakeTensorMode():
        q, k, v = _inputs("cuda", decode)
    backend = checks._TraceOnly()
    torch.compile(call, fullgraph=True, backend=backend)(q, k, v)
    targets = [node for graph in backend.graphs for node in graph.graph.nodes if node.op == "call_function"
               and declared_layer.NAMESPACE in str(node.target)]
    assert [str(node.target) for node in targets] == [f"{declared_layer.NAMESPACE}.{OPS[op]}.default"]
    if name == "prefill_auto":
        assert targets[0].args[0] == "fa3"  # FlashInfer's choice on SM90, made while tracing


@pytest.mark.parametrize("name", list(CALLS))
def test_compiled_attention_equals_eager_bit_for_bit_and_runs_the_kernel_through_the_op(attention, name):
    decode, call, _ = CALLS[name]
    q, k, v = _inputs("cpu", decode)
    attention["calls"].clear()
    out, lse = call(q, k, v)
    assert attention["calls"] == [False]  # eager: FlashInfer's own call, no op on the way
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        attention["calls"].clear()
        compiled_out, compiled_lse = torch.compile(call, fullgraph=True, backend=backend)(q, k, v)
        assert attention["calls"] == [True], backend  # compiled: the kernel runs inside the op
        for eager, compiled in ((out, compiled_out), (lse, compiled_lse)):
            assert (compiled.shape, compiled.stride(), compiled.dtype) == (eager.shape, eager.stride(), eager.dtype)
            assert torch.equal(compiled, eager), backend  # a write the schema left out would be lost here


@pytest.mark.parametrize("marked", [False, True], ids=["automatic", "mark_dynamic"])
def test_twenty_decode_steps_with_growing_kv_recompile_at_most_once(attention, marked):
    """Nothing of the op's arguments becomes a guard beyond the shapes: Dynamo's automatic dynamic shapes recompile
    once, at the first new length; a KV length marked dynamic recompiles never."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(CALLS["decode"][1], fullgraph=True, backend=counter)
    q = _inputs("cpu", True)[0]
    for step in range(20):
        k, v = (torch.randn(16 + 7 * step, 2, 64, dtype=torch.float16) for _ in range(2))
        if marked:
            torch._dynamo.mark_dynamic(k, 0)
            torch._dynamo.mark_dynamic(v, 0)
        out, lse = compiled(q, k, v)
        eager_out, eager_lse = CALLS["decode"][1](q, k, v)
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step
    assert counter.frame_count == (1 if marked else 2)


def _op_arguments(op, values: dict) -> list:
    """The op's arguments, by name: the values given, else a neutral value of the schema's type."""
    arguments = []
    for argument in op._schema.arguments:
        name, kind = argument.name.removeprefix("getter_"), str(argument.type)
        neutral = None if isinstance(argument.type, torch.OptionalType) else {"bool": False, "float": 0.0}.get(kind, 0)
        arguments.append(values.get(name, neutral))
    return arguments


@pytest.mark.parametrize("key", [DECODE, PREFILL])
def test_opcheck_holds_each_op_with_the_stand_in_kernel(attention, key):
    """torch.library.opcheck runs the op (FlashInfer's run on the stand-in module) and checks its schema's write
    claims, its fake and its registration: an undeclared write to maybe_lse fails it."""
    op = getattr(getattr(torch.ops, declared_layer.NAMESPACE), OPS[key]).default
    decode = key == DECODE
    q, k, v = _inputs("cpu", decode)
    rows = 1 if decode else q.shape[0]
    values = {"q": q, "k": k, "v": v, "tmp": torch.empty(1024, dtype=torch.uint8),
              "o": torch.empty_like(q), "maybe_lse": torch.empty(*((8,) if decode else (rows, 8)), dtype=torch.float32),
              "backend": "fa2", "dtype_q": q.dtype, "dtype_kv": k.dtype, "dtype_o": q.dtype, "head_dim_qk": 64,
              "head_dim_vo": 64, "sm_scale": 0.125, "rope_scale": 1.0, "rope_theta": 1e4, "window_left": -1}
    torch.library.opcheck(op, _op_arguments(op, values))


def test_status_lists_both_as_registered_under_all_with_no_reason_left(attention):
    layer = attention["status"]
    assert {key: layer["registered"].get(key) for key in OPS} == {
        key: f"{declared_layer.NAMESPACE}::{name}" for key, name in OPS.items()}
    assert not set(OPS) & set(layer["not_registered"])


def test_under_the_default_gate_each_is_an_op_only_where_the_releases_gpu_record_proves_it(monkeypatch):
    status = apply_with(monkeypatch, FLASHINFER_OPS=None)
    assert status["applied"], status["problem"]
    layer = status["flashinfer_ops"]
    proven = set((layer["proven"] or {}).get("functions", ()))
    public = {DECODE: "decode.single_decode_with_kv_cache", PREFILL: "prefill.single_prefill_with_kv_cache"}
    expected = {key for key, function in public.items() if function in proven}
    assert set(OPS) & set(layer["registered"]) == expected
    if DECODE not in expected:
        q, k, v = _inputs("cpu", True)
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(CALLS["decode"][1], fullgraph=True, backend="aot_eager")(q, k, v)


def test_bad_input_raises_flashinfers_error_naming_the_argument_eager_and_compiled(attention):
    """FlashInfer's own check runs before the op, in the traced code: compiled code raises its KeyError as eager
    does. Under fullgraph=True, Dynamo (torch 2.13) reports any exception a traced callee raises as Unsupported,
    with FlashInfer's message: the class is torch's choice there, for every FlashInfer function alike."""
    q, k, v = _inputs("cpu", True)
    for function in (flashinfer.single_decode_with_kv_cache,
                     torch.compile(flashinfer.single_decode_with_kv_cache, backend="aot_eager")):
        with pytest.raises(KeyError, match="Invalid kv_layout XYZ"):
            function(q, k, v, kv_layout="XYZ")
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="Invalid kv_layout XYZ"):
        torch.compile(flashinfer.single_decode_with_kv_cache, fullgraph=True, backend="aot_eager")(
            q, k, v, kv_layout="XYZ")


def test_revert_removes_the_ops_and_the_polyfills_and_compiling_fails_again_as_without_the_shim(attention):
    q, k, v = _inputs("cpu", True)
    call = CALLS["decode"][1]
    fp4_dynamo_shim.revert()
    try:
        torch._dynamo.reset()
        assert not hasattr(getattr(torch.ops, declared_layer.NAMESPACE), "run_single_decode")
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(call, fullgraph=True, backend="aot_eager")(q, k, v)
    finally:
        assert fp4_dynamo_shim.apply()  # under the fixture's gate, for the tests after this one
    assert fp4_dynamo_shim.status()["flashinfer_ops"]["registered"][DECODE]
