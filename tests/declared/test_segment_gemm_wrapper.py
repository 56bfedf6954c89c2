"""FlashInfer's ``SegmentGEMMWrapper.run`` as one shim op under ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on CPU.

Its GEMM writes through the pointer table ``y_data`` that a triton kernel computed from ``out``'s address, and is never
handed ``out`` to write: the whole run is the op (``declared/segment_gemm.py``), whose schema says ``out`` and both
workspaces are written.

Stand-ins, because both kernels need a GPU (triton does not even import here), each as little as the run allows:
* the triton kernels ``compute_sm80_group_gemm_args`` / ``compute_sm90_group_gemm_args`` (``flashinfer.triton.gemm``,
  imported inside FlashInfer's ``launch_compute_*_group_gemm_args``, which stay FlashInfer's): they fill the problem
  sizes and the x / w / y address tables as the triton source does, and note the tensors whose addresses they wrote
  (the live tensors the addresses can point into);
* the built JIT module (``gen_gemm_module`` / ``gen_gemm_sm90_module`` return a spec whose ``build_and_load`` gives
  it): its GEMM reads each segment's x and w and writes y = x @ w at the addresses in the tables, found among those
  live tensors, so it writes what the GPU kernel writes and nothing it is handed as ``y``; it also writes its
  workspaces, and records whether it ran inside the shim's op. Opaque to Dynamo, as FlashInfer's C++ function is.
Everything between is FlashInfer's and the shim's real code.
"""

from __future__ import annotations

import sys
import types

import flashinfer
import flashinfer.gemm.gemm_base as gemm_base
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import fp4_dynamo_shim
from helpers import DECLARED_NAMESPACE, apply_with
from stand_in_gpu import RecordingSpec

#: FlashInfer's own run, as the class holds it before the shim applies under a gate that covers it.
FLASHINFER_RUN = flashinfer.SegmentGEMMWrapper.__dict__["run"]
DECLARATIONS = ("flashinfer.gemm.gemm_base.get_gemm_module.cutlass_segment_gemm",
                "flashinfer.gemm.gemm_base.get_gemm_sm90_module.cutlass_segment_gemm_sm90")
SEGMENTS, D_IN, D_OUT = [1, 2, 3, 4], 16, 8


class ArgsKernel:
    """Stands in for a triton args kernel, launched as ``kernel[(batch_size,)](...)`` (module docstring)."""

    def __init__(self, live: dict):
        self.live = live

    def __getitem__(self, grid):
        def launch(all_problems, x_ptr, w_ptr, y_ptr, x_ld, w_ld, y_ld, x, w, y, indptr, w_indices, d_in, d_out,
                   w_column_major):
            self.live.clear()
            self.live.update({tensor.data_ptr(): tensor for tensor in (x, w, y)})
            for i in range(grid[0]):
                start, end = int(indptr[i]), int(indptr[i + 1])
                w_i = int(w_indices[i]) if w_indices is not None and w_indices.numel() else i
                all_problems[i] = torch.tensor([end - start, d_out, d_in])
                x_ptr[i] = x.data_ptr() + start * d_in * x.element_size()
                w_ptr[i] = w.data_ptr() + w_i * d_in * d_out * w.element_size()
                y_ptr[i] = y.data_ptr() + start * d_out * y.element_size()
                x_ld[i], w_ld[i], y_ld[i] = d_in, d_in if w_column_major else d_out, d_out

        return launch


class StandInGemmModule:
    """Stands in for the built segment GEMM modules (module docstring)."""

    def __init__(self, live: dict, calls: list, op_name: str):
        self.live, self.calls, self.op_name = live, calls, op_name

    def _at(self, address: int, rows: int, columns: int) -> torch.Tensor:
        for base, tensor in self.live.items():
            if base <= address < base + tensor.numel() * tensor.element_size():
                offset = (address - base) // tensor.element_size()
                return tensor.view(-1)[offset:offset + rows * columns].view(rows, columns)
        raise RuntimeError(f"no live tensor at address {address:#x}")

    def _gemm(self, workspace, all_problems, x_data, w_data, y_data, y_dtype, w_column_major):
        frame, through_op = sys._getframe(2), False
        while frame is not None:
            through_op |= frame.f_code.co_name == self.op_name
            frame = frame.f_back
        self.calls.append(through_op)
        for i, (m, n, k) in enumerate(all_problems.tolist()):
            w = self._at(int(w_data[i]), n, k).t() if w_column_major else self._at(int(w_data[i]), k, n)
            y = self._at(int(x_data[i]), m, k).float() @ w.float()
            self._at(int(y_data[i]), m, n).copy_(y.to(y_dtype))
        workspace[:4].fill_(len(all_problems))

    @torch._dynamo.disable  # FlashInfer's C++ function: Dynamo cannot trace it
    def cutlass_segment_gemm(self, workspace, all_problems, x_data, w_data, y_data, x_ld, w_ld, y_ld, empty_x_data,
                             w_column_major):
        self._gemm(workspace, all_problems, x_data, w_data, y_data, empty_x_data.dtype, w_column_major)

    @torch._dynamo.disable
    def cutlass_segment_gemm_sm90(self, float_workspace, int_workspace, all_problems, x_data, w_data, y_data,
                                  x_stride, w_stride, y_stride, empty_x_data, empty_y_data, w_column_major):
        int_workspace[:4].fill_(-1)
        self._gemm(float_workspace, all_problems, x_data, w_data, y_data, empty_y_data.dtype, w_column_major)


def _op_name(status) -> str:
    """The op ``status()`` names among the layer's helpers for the wrapper's run ("" where none)."""
    named = [helper for helper in status["helpers"] if helper.startswith("flashinfer.gemm.gemm_base.SegmentGEMMWrapper")]
    return named[0].split("::")[-1].rstrip(")") if named else ""


def _clear_getters():
    gemm_base.get_gemm_module.cache_clear()
    gemm_base.get_gemm_sm90_module.cache_clear()


@pytest.fixture
def apply_all(monkeypatch):
    """``apply_all()``: every declared op on (gate ``all``), with the stand-ins; returns the GEMM's call record, the
    op's name and the status. Tests call it in their body: what the layer makes at apply time (the op's kernel, the
    traced run) then belongs to the test's call phase, where mutmut maps which test reaches which function."""

    def apply():
        live, calls = {}, []
        status = apply_with(monkeypatch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        op_name = _op_name(status["flashinfer_ops"])
        module = StandInGemmModule(live, calls, op_name)
        for name in ("gen_gemm_module", "gen_gemm_sm90_module"):
            monkeypatch.setattr(gemm_base, name, lambda: RecordingSpec(module))
        triton, kernels = types.ModuleType("flashinfer.triton"), types.ModuleType("flashinfer.triton.gemm")
        kernels.compute_sm80_group_gemm_args = kernels.compute_sm90_group_gemm_args = ArgsKernel(live)
        triton.gemm = kernels
        monkeypatch.setitem(sys.modules, "flashinfer.triton", triton)
        monkeypatch.setitem(sys.modules, "flashinfer.triton.gemm", kernels)
        _clear_getters()
        return {"calls": calls, "op": op_name, "status": status["flashinfer_ops"]}

    yield apply
    _clear_getters()
    monkeypatch.undo()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _inputs(dtype=torch.float16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(SEGMENTS), D_IN, generator=generator).to(dtype)
    weights = torch.randn(len(SEGMENTS), D_OUT, D_IN, generator=generator).to(dtype)  # column major: (d_out, d_in)
    return x, weights, torch.tensor(SEGMENTS), torch.tensor([3, 0, 1, 3])


def _wrapper(backend):
    return flashinfer.SegmentGEMMWrapper(torch.zeros(1 << 12, dtype=torch.int8), backend=backend)


def _ops(graphs) -> list:
    return [str(node.target) for graph in graphs for node in graph.graph.nodes
            if node.op == "call_function" and DECLARED_NAMESPACE in str(node.target)]


@pytest.mark.parametrize("backend", ["sm80", "sm90"])
def test_run_traces_to_exactly_one_shim_op_with_no_graph_break(apply_all, backend):
    segment_gemm = apply_all()
    wrapper, (x, weights, seg_lens, indices) = _wrapper(backend), _inputs()
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(lambda x: wrapper.run(x, weights, len(SEGMENTS), True, seg_lens=seg_lens, weight_indices=indices),
                  fullgraph=True, backend=counter)(x)
    assert _ops(counter.graphs) == [f"{DECLARED_NAMESPACE}.{segment_gemm['op']}.default"]


@pytest.mark.parametrize("given_out", [False, True], ids=["out_allocated", "caller_out"])
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.parametrize("backend", ["sm80", "sm90"])
def test_compiled_run_equals_eager_bit_for_bit_with_its_writes_and_eager_never_passes_the_op(
        apply_all, backend, compiler, given_out):
    """The result, the caller's ``out`` and both workspaces. The eager call is FlashInfer's own, never the op's."""
    segment_gemm = apply_all()
    wrapper, (x, weights, seg_lens, indices) = _wrapper(backend), _inputs()
    indptr = torch.tensor([0, *SEGMENTS]).cumsum(0)

    def call(x, out):
        return wrapper.run(x, weights, len(SEGMENTS), True, out=out, seg_indptr=indptr, weight_indices=indices)

    results = []
    for compiled in (False, True):
        wrapper._float_workspace_buffer.zero_()
        wrapper._int_workspace_buffer.zero_()
        segment_gemm["calls"].clear()
        out = torch.full((x.size(0), D_OUT), -1.0, dtype=x.dtype) if given_out else None
        torch._dynamo.reset()
        function = torch.compile(call, fullgraph=True, backend=compiler) if compiled else call
        returned = function(x, out)
        assert segment_gemm["calls"] == [compiled]
        assert not given_out or returned is out or compiled  # FlashInfer hands back the caller's out eagerly
        results.append((returned, *([out] if given_out else []), wrapper._float_workspace_buffer.clone(),
                        wrapper._int_workspace_buffer.clone()))
    expected = torch.cat([x[a:b].float() @ weights[i].float().t() for a, b, i in
                          zip(indptr[:-1].tolist(), indptr[1:].tolist(), indices.tolist())]).to(x.dtype)
    assert torch.equal(results[0][0], expected)
    for eager, compiled in zip(*results):
        assert (compiled.shape, compiled.stride(), compiled.dtype) == (eager.shape, eager.stride(), eager.dtype)
        assert torch.equal(compiled, eager)


def test_row_major_weights_and_segment_lengths_compile_equal_to_eager(apply_all):
    """FlashInfer's other forms: weights (num_weights, d_in, d_out) and ``seg_lens`` in place of ``seg_indptr``."""
    apply_all()
    wrapper, (x, weights, seg_lens, indices) = _wrapper("sm80"), _inputs()
    row_major = weights.transpose(1, 2).contiguous()
    call = lambda x: wrapper.run(x, row_major, len(SEGMENTS), False, seg_lens=seg_lens, weight_indices=indices)  # noqa: E731
    eager = call(x)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="inductor")(x)
    assert eager.shape == (x.size(0), D_OUT) and torch.equal(compiled, eager)


def test_flashinfers_checks_run_in_the_traced_run_before_the_op(apply_all):
    """No segments given, or an ``out`` of the wrong shape: FlashInfer's ValueError, raised while tracing (Dynamo
    reports it as Unsupported under fullgraph, with FlashInfer's message), where the call reaches the op otherwise."""
    segment_gemm = apply_all()
    wrapper, (x, weights, seg_lens, _) = _wrapper("sm80"), _inputs()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    torch.compile(lambda x: wrapper.run(x, weights, len(SEGMENTS), True, seg_lens=seg_lens), fullgraph=True,
                  backend=counter)(x)
    assert _ops(counter.graphs) == [f"{DECLARED_NAMESPACE}.{segment_gemm['op']}.default"]
    wrong = torch.empty(x.size(0), D_OUT + 1, dtype=x.dtype)
    for call, message in ((lambda x: wrapper.run(x, weights, len(SEGMENTS), True), "Either seg_lens or seg_indptr"),
                          (lambda x: wrapper.run(x, weights, len(SEGMENTS), True, out=wrong, seg_lens=seg_lens),
                           "Output tensor shape mismatch, expected")):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported, match=message):
            torch.compile(call, fullgraph=True, backend="aot_eager")(x)


def test_fp8_input_gets_a_bfloat16_output_as_flashinfer_allocates_it(apply_all):
    apply_all()
    wrapper, (x, weights, seg_lens, indices) = _wrapper("sm80"), _inputs(torch.float8_e4m3fn)
    call = lambda x: wrapper.run(x, weights, len(SEGMENTS), True, seg_lens=seg_lens)  # noqa: E731
    eager = call(x)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(x)
    assert compiled.dtype == eager.dtype == torch.bfloat16 and torch.equal(compiled, eager)


def test_opcheck_holds_the_op_with_the_stand_in_kernels(apply_all):
    """torch.library.opcheck runs the op (FlashInfer's run on the stand-ins) and checks its schema's write claims
    (out, both workspaces), its fake and its registration."""
    segment_gemm = apply_all()
    wrapper, (x, weights, _, indices) = _wrapper("sm90"), _inputs(torch.float32)
    op = getattr(getattr(torch.ops, DECLARED_NAMESPACE), segment_gemm["op"]).default
    torch.library.opcheck(op, (wrapper._float_workspace_buffer, wrapper._int_workspace_buffer, x, weights,
                               len(SEGMENTS), True, torch.zeros(x.size(0), D_OUT), torch.tensor([0, *SEGMENTS]).cumsum(0),
                               indices, "sm90"))


def test_status_says_which_op_covers_the_two_declarations_under_the_gate_all(apply_all):
    segment_gemm = apply_all()
    listed = segment_gemm["status"]["not_registered"]
    assert {key: listed[key]["kind"] for key in DECLARATIONS} == dict.fromkeys(DECLARATIONS, "covered by a wrapper's op")
    assert all(listed[key]["reason"] == f"SegmentGEMMWrapper.run is one op, {DECLARED_NAMESPACE}::{segment_gemm['op']}, "
               "which computes the addresses from the output it writes" for key in DECLARATIONS)


def test_revert_restores_flashinfers_run_and_compiling_fails_again_as_without_the_shim(apply_all):
    apply_all()
    assert flashinfer.SegmentGEMMWrapper.__dict__["run"] is not FLASHINFER_RUN
    wrapper, (x, weights, seg_lens, _) = _wrapper("sm80"), _inputs()
    fp4_dynamo_shim.revert()
    try:
        assert flashinfer.SegmentGEMMWrapper.__dict__["run"] is FLASHINFER_RUN
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(lambda x: wrapper.run(x, weights, len(SEGMENTS), True, seg_lens=seg_lens), fullgraph=True,
                          backend="aot_eager")(x)
    finally:
        assert fp4_dynamo_shim.apply()  # under the fixture's gate, for the tests after this one
    torch._dynamo.reset()
    torch.compile(lambda x: wrapper.run(x, weights, len(SEGMENTS), True, seg_lens=seg_lens), fullgraph=True,
                  backend="aot_eager")(x)


def test_under_the_default_gate_nothing_changes_until_a_gpu_run_proves_it_and_the_gate_all_turns_it_on(monkeypatch):
    status = apply_with(monkeypatch, FLASHINFER_OPS=None)
    assert status["applied"], status["problem"]
    listed = status["flashinfer_ops"]["not_registered"]
    assert {listed[key]["kind"] for key in DECLARATIONS if key in listed} <= {"off under the gate"}
    assert flashinfer.SegmentGEMMWrapper.__dict__["run"] is FLASHINFER_RUN
    try:
        assert apply_with(monkeypatch, FLASHINFER_OPS="all")["applied"]
        run = flashinfer.SegmentGEMMWrapper.__dict__["run"]
        assert run is not FLASHINFER_RUN and run.__wrapped__ is FLASHINFER_RUN
    finally:
        apply_with(monkeypatch, FLASHINFER_OPS=None)


def _another_body(self, x, weights, batch_size, weight_column_major, out=None, seg_lens=None, seg_indptr=None,
                  weight_indices=None):
    return FLASHINFER_RUN(self, x, weights, batch_size, weight_column_major, out, seg_lens, seg_indptr, weight_indices)


_NO_SOURCE: dict = {}
exec("def run(self, *arguments, **keywords):\n    return FLASHINFER_RUN(self, *arguments, **keywords)\n",  # noqa: S102
     {"FLASHINFER_RUN": FLASHINFER_RUN}, _NO_SOURCE)


@pytest.mark.parametrize("run, reason", [
    (_another_body, "SegmentGEMMWrapper.run differs from the body the shim's traced run reproduces"),
    (_NO_SOURCE["run"], "SegmentGEMMWrapper.run cannot be read (OSError: "),
], ids=["another_body", "no_source"])
def test_a_run_that_is_not_flashinfers_as_read_keeps_the_declarations_not_expressible(monkeypatch, run, reason):
    """The traced run reproduces FlashInfer's run before its op (0.5.3-0.7.4 share the body): a release whose run is
    another, or cannot be read, is left alone, and says why."""
    apply_with(monkeypatch, FLASHINFER_OPS=None)  # FlashInfer's class as it is, for this test to replace its run
    monkeypatch.setattr(flashinfer.SegmentGEMMWrapper, "run", run)
    try:
        status = apply_with(monkeypatch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        listed = status["flashinfer_ops"]["not_registered"]
        assert {listed[key]["kind"] for key in DECLARATIONS} == {"not expressible"}
        assert all(f"the wrapper's run is not one op either: {reason}" in listed[key]["reason"] for key in DECLARATIONS)
        assert flashinfer.SegmentGEMMWrapper.__dict__["run"] is run
    finally:
        apply_with(monkeypatch, FLASHINFER_OPS=None)


def test_an_op_that_fails_to_register_fails_both_declarations_and_leaves_the_class_alone(monkeypatch):
    """Registering goes wrong (here torch refuses the schema): listed as failed with the error, as any op's failure
    is, and FlashInfer's run stays on the class."""
    define = torch.library.Library.define

    def refusing(self, schema, *arguments, **keywords):
        if schema.startswith("segment_gemm_run("):
            raise RuntimeError("refused by the test")
        return define(self, schema, *arguments, **keywords)

    apply_with(monkeypatch, FLASHINFER_OPS=None)
    monkeypatch.setattr(torch.library.Library, "define", refusing)
    try:
        status = apply_with(monkeypatch, FLASHINFER_OPS="all")
        listed = status["flashinfer_ops"]["not_registered"]
        assert {listed[key]["kind"] for key in DECLARATIONS} == {"failed"}
        assert all(listed[key]["reason"] == "SegmentGEMMWrapper.run's op: RuntimeError: refused by the test"
                   for key in DECLARATIONS)
        assert flashinfer.SegmentGEMMWrapper.__dict__["run"] is FLASHINFER_RUN
    finally:
        monkeypatch.undo()
        apply_with(monkeypatch, FLASHINFER_OPS=None)
