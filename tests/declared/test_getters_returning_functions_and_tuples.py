"""FlashInfer's getters that do not return one ``SimpleNamespace``: the Blackwell softmax and tinygemm2 getters return
their declared function itself, 0.7.1's sm110 XQA decode getter a tuple of two (the second None under an ``if`` on
its parameter), the segment GEMM getter a namespace bound to a local name first. Under
``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all`` their functions are the shim's ops, on CPU.

Stand-ins, each named where used: the JIT module FlashInfer builds (its generator returns ``RecordingSpec`` of a
CPU module whose function is opaque to Dynamo, as FlashInfer's C++ is), and FlashInfer's device query answering
SM100 or SM90 under tracing (``declared_layer.CAPABILITIES``: a CPU-only torch has no device to ask).
"""

from __future__ import annotations

import flashinfer
import flashinfer.sampling
import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim.declared import scan
from _fp4_dynamo_shim.verify import checks
from helpers import apply_with
from stand_in_gpu import RecordingSpec

SOFTMAX = "flashinfer.sampling.get_blackwell_softmax_op.blackwell_softmax"
get_softmax_op = getattr(flashinfer.sampling, "get_blackwell_softmax_op", None)
needs_blackwell_softmax = pytest.mark.skipif(get_softmax_op is None, reason="this release has no Blackwell softmax")


class SoftmaxModule:
    """Stands in for the Blackwell softmax JIT module: softmax of logits / temperature into ``probs``, and a mark
    in the workspace (which FlashInfer declares written)."""

    @torch._dynamo.disable  # FlashInfer's C++ function: Dynamo cannot trace it
    def softmax(self, workspace, logits, probs, temperatures, temperature, enable_pdl, no_temperature, pdl_device):
        scale = 1.0 if no_temperature else (temperatures[:, None] if temperatures is not None else temperature)
        probs.copy_(torch.softmax(logits / scale, dim=-1))
        workspace[:8].fill_(logits.shape[0])


def _clear():
    for name in ("get_blackwell_softmax_module", "get_blackwell_softmax_op"):
        if hasattr(flashinfer.sampling, name):
            getattr(flashinfer.sampling, name).cache_clear()


@pytest.fixture(scope="module")
def layer():
    """Every declared op on, with the stand-in module and an SM100 answer (module docstring)."""
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        patch.setitem(declared_layer.CAPABILITIES, 0, (10, 0))
        if hasattr(flashinfer.sampling, "gen_blackwell_softmax_module"):
            patch.setattr(flashinfer.sampling, "gen_blackwell_softmax_module", lambda: RecordingSpec(SoftmaxModule()))
        _clear()
        yield status["flashinfer_ops"]
        _clear()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _trace(function, *args):
    backend = checks._TraceOnly()
    torch._dynamo.reset()
    torch.compile(function, fullgraph=True, backend=backend)(*args)
    return sorted({str(node.target) for graph in backend.graphs for node in graph.graph.nodes
                   if declared_layer.NAMESPACE in str(node.target)})


def test_each_return_shape_of_flashinfers_getters_is_read_as_the_polyfill_rebuilds_it():
    """The three shapes, written as FlashInfer writes them; a return under a test on the getter's parameter is kept
    under that test, and a value in a tuple is reached by its index."""
    source = '''
@functools.cache
def get_op():
    @register_custom_op("flashinfer::op", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return x
    return op

@functools.cache
def get_pair(route: str, fused: bool) -> tuple:
    @register_custom_op(f"flashinfer::{route}", mutates_args=("out",))
    def run(out: torch.Tensor) -> None:
        pass
    if fused:
        return run, None
    @register_custom_op("flashinfer::merge", mutates_args=("out",))
    def run_merge(out: torch.Tensor) -> None:
        pass
    return run, run_merge

@functools.cache
def get_module():
    @register_custom_op("flashinfer::gemm", mutates_args=("y",))
    def gemm(y: torch.Tensor) -> None:
        pass
    _module = SimpleNamespace(runner=functools.lru_cache(runner), gemm=gemm)
    return _module
'''
    read = {namespace.getter: namespace for namespace in scan.scan_source(source, "flashinfer.example")[1]}
    bare, pair, bound = read["get_op"], read["get_pair"], read["get_module"]
    assert (bare.entries, bare.returns, bare.problem) == ((("", "op"),), ("return _entry_0",), None)
    assert pair.entries == (("[0]", "run"), ("[1]", "run_merge"))
    assert pair.returns == ("if fused:", "    return (_entry_0, None)", "return (_entry_0, _entry_1)")
    assert bound.keys_of("gemm") == ("gemm",)
    assert bound.returns == ("return _Namespace({'runner': _entry_0, 'gemm': _entry_1})",)


@pytest.mark.release_independent
def test_a_return_the_polyfill_cannot_rebuild_is_listed_with_what_it_returns():
    source = '''
def get_module():
    @register_custom_op("flashinfer::op", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return x
    for _ in range(2):
        return op
'''
    (namespace,) = scan.scan_source(source, "flashinfer.example")[1]
    assert namespace.problem == "get_module returns inside a `for` statement"


@needs_blackwell_softmax
def test_flashinfers_softmax_on_a_blackwell_gpu_traces_to_the_blackwell_softmax_op(layer):
    with FakeTensorMode():
        logits = torch.randn(4, 256, device="cuda")
    ops = _trace(lambda logits: flashinfer.sampling.softmax(logits, temperature=0.5), logits)
    assert ops == [f"{declared_layer.NAMESPACE}.{layer['registered'][SOFTMAX].split('::')[1]}.default"]


@needs_blackwell_softmax
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_blackwell_softmax_op_compiled_equals_eager_with_its_workspace_write(layer, backend):
    """Called as ``flashinfer.sampling.softmax`` calls it: that function refuses CPU tensors before reaching the
    getter, so on CPU the getter's own call is compiled (the public path is traced above on fake CUDA tensors)."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))

    def call(workspace, logits, temperatures):
        return get_softmax_op()(workspace, logits, temperatures, 0.5, False, False, False)

    results = []
    for compiled in (False, True):
        workspace, temperatures = torch.zeros(64, dtype=torch.uint8), torch.tensor([0.5, 1.0, 2.0])
        torch._dynamo.reset()
        probs = (torch.compile(call, fullgraph=True, backend=backend) if compiled else call)(workspace, logits,
                                                                                           temperatures)
        results.append((probs, workspace))
    for eager, compiled in zip(*results):
        assert (compiled.shape, compiled.stride(), compiled.dtype) == (eager.shape, eager.stride(), eager.dtype)
        assert torch.equal(compiled, eager)
    assert results[1][1][0] == 3  # the workspace write reached the caller's buffer


@needs_blackwell_softmax
def test_opcheck_holds_the_blackwell_softmax_op(layer):
    op = getattr(getattr(torch.ops, declared_layer.NAMESPACE), layer["registered"][SOFTMAX].split("::")[1]).default
    torch.library.opcheck(op, [torch.zeros(64, dtype=torch.uint8), torch.randn(2, 16), None, 0.7, False, False, False])


@pytest.mark.parametrize("getter, capability", [("get_tinygemm2_wgmma_op", (9, 0)), ("get_tinygemm2_tcgen05_op", (10, 0))])
def test_tinygemm2s_getters_return_a_function_that_traces_to_its_op(layer, getter, capability, monkeypatch):
    """``tinygemm_bf16`` itself reads ``torch.version.cuda`` (None on a CPU-only torch) to pick its program, so the
    call it makes once it has one is traced: the getter's function, on fake CUDA tensors."""
    import flashinfer.gemm.routergemm as routergemm

    if not hasattr(routergemm, getter):
        pytest.skip(f"this release has no {getter}")
    monkeypatch.setitem(declared_layer.CAPABILITIES, 0, capability)
    with FakeTensorMode():
        x, weight = (torch.randn(rows, 256, dtype=torch.bfloat16, device="cuda") for rows in (8, 128))
        out = torch.empty(8, 128, dtype=torch.bfloat16, device="cuda")
    ops = _trace(lambda x, w, o: getattr(routergemm, getter)()("PROGRAM", x, w, None, o), x, weight, out)
    key = f"flashinfer.gemm.routergemm.{getter}.{getter.removeprefix('get_')}"
    assert ops == [f"{declared_layer.NAMESPACE}.{layer['registered'][key].split('::')[1]}.default"]


def test_status_lists_the_new_ops_and_says_what_covers_segment_gemm(layer):
    registered, listed = layer["registered"], layer["not_registered"]
    import flashinfer.gemm.gemm_base as gemm_base

    for module, getter, function in (("flashinfer.sampling", "get_blackwell_softmax_op", "blackwell_softmax"),
                                     ("flashinfer.gemm.routergemm", "get_tinygemm2_wgmma_op", "tinygemm2_wgmma_op"),
                                     ("flashinfer.gemm.routergemm", "get_tinygemm2_tcgen05_op", "tinygemm2_tcgen05_op"),
                                     ("flashinfer.decode", "get_trtllm_gen_decode_module", "paged_run")):
        key = f"{module}.{getter}.{function}"
        if hasattr(__import__(module, fromlist=["_"]), getter):
            assert key in registered and key not in listed, key
    segment = "flashinfer.gemm.gemm_base.get_gemm_module.cutlass_segment_gemm"
    assert hasattr(gemm_base, "get_gemm_module") and segment not in registered
    assert listed[segment]["kind"] == "covered by a wrapper's op"  # its kernel writes through addresses: the run is one op
    assert "SegmentGEMMWrapper.run is one op" in listed[segment]["reason"]
    assert not any("SimpleNamespace" in entry["reason"] for entry in listed.values())
