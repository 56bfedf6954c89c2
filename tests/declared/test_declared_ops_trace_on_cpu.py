"""FlashInfer's own declared ops as real ops while the shim is applied, on CPU.

No GPU here: calls are traced on fake CUDA tensors (``FakeTensorMode``, tensors made on "cuda" under it) with
a backend that evaluates the graph on fake tensors too, so nothing runs and FlashInfer's JIT is never built.
Stand-in, named where used: FlashInfer's device query answers SM90 for cuda:0 under tracing
(``declared_layer.CAPABILITIES``), since a CPU-only torch has no device to ask. The kernels run on the GPU
machine (``tests/gpu/test_gpu_declared.py``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import flashinfer
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_dynamo_shim
from _fp4_dynamo_shim.verify import checks
from _fp4_dynamo_shim.declared import scan
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.declared import polyfill
from fp4_dynamo_shim.errors import ApplyError

import declared_examples
from helpers import apply_with, run_python, torch_refuses_declared_ops

TABLE = Path(__file__).resolve().parents[1] / "data" / "declared_releases.json"
GATE = "FP4_DYNAMO_SHIM_FLASHINFER_OPS"
#: 0.7.x's top-k paths ask torch.cuda.is_current_stream_capturing(), which only a GPU answers: a CPU-only torch
#: has no such call ("dummy base class _cuda_isCurrentStreamCapturing"), a CUDA torch with no driver fails it
#: ("CUDA driver version is insufficient" from the FX node calling is_current_stream_capturing).
NO_GPU_TO_ASK = ("_cuda_isCurrentStreamCapturing", "is_current_stream_capturing")


def _reapply(monkeypatch, gate):
    status = apply_with(monkeypatch, FLASHINFER_OPS=gate)
    assert status["applied"], status["problem"]
    return status["flashinfer_ops"]


@pytest.fixture(scope="module")
def every_op():
    """Every declared op on for the module (one apply: each costs about a second); a test that sets another
    gate has it put back by the conftest fixture when its own monkeypatch restores the variable."""
    with pytest.MonkeyPatch.context() as patch:
        layer = _reapply(patch, "all")
        patch.setitem(declared_layer.CAPABILITIES, 0, (9, 0))  # stand-in: no GPU to ask (module docstring)
        yield layer
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


class _TraceOnly(checks._TraceOnly):
    """verify's trace-only backend (records graphs, runs them on fake tensors), with the shim ops it reached."""

    def ops(self):
        return sorted({str(node.target) for graph in self.graphs for node in graph.graph.nodes
                       if node.op == "call_function" and declared_layer.NAMESPACE in str(node.target)})


def _fake_call(example):
    function = example.resolve()
    if function is None:
        pytest.skip(f"flashinfer {lifecycle.flashinfer_version()} has no {example.module}.{example.function}")
    with FakeTensorMode():
        args, kwargs = example.arguments("cuda")
    return function, args, kwargs


def _trace(function, args, kwargs):
    backend = _TraceOnly()
    torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend=backend)(*args)
    return backend


def test_every_declaration_in_the_installed_flashinfer_is_registered_or_listed_with_a_reason(every_op):
    package = Path(flashinfer.__file__).parent
    # Counted from the text, independently of the ast scan: a declaration the scan misses fails here.
    texts = [path.read_text(encoding="utf-8") for path in package.rglob("*.py")]
    written = sum(len(re.findall(r"^\s*@register_custom_op\(", text, re.M)) for text in texts)
    # Plus the run of the module MLA's getter returns built, beside the wrapper that runs it (0.5.3-0.6.x): no
    # declaration in the text, the shim's from the attention table.
    written += sum("class BatchMLAPagedAttentionWrapper" in text and "\ndef get_batch_mla_module(" in text
                   for text in texts)
    assert every_op["counts"]["declared"] == written
    assert len(every_op["registered"]) + len(every_op["not_registered"]) == written
    assert all(entry["reason"] and entry["kind"] for entry in every_op["not_registered"].values())
    assert every_op["counts"]["failed"] == 0, every_op["failed"]
    assert every_op["counts"]["registered"] > 0


def test_the_release_table_row_matches_what_the_shim_does_with_this_release(every_op):
    """tests/data/declared_releases.json is written by tools/matrix/declared_table.py from each release's wheel; the
    matrix runs this test against each release installed."""
    table = json.loads(TABLE.read_text())["releases"]
    version = lifecycle.flashinfer_version()
    if version not in table:
        pytest.skip(f"no row for flashinfer-python {version}; run python tools/matrix/declared_table.py")
    assert every_op["registered"] == table[version]["registered"]
    assert every_op["not_registered"] == table[version]["not_registered"]


@pytest.mark.parametrize("example", declared_examples.EXAMPLES, ids=lambda e: e.name)
def test_public_function_traces_to_the_declared_op_with_no_graph_break(every_op, example):
    function, args, kwargs = _fake_call(example)
    try:
        backend = _trace(function, args, kwargs)
    except Exception as error:  # only the one thing a CPU-only torch cannot answer is a skip
        if not torch.cuda.is_available() and any(text in str(error) for text in NO_GPU_TO_ASK):
            pytest.skip("asks torch.cuda.is_current_stream_capturing(): only a GPU answers (GPU test)")
        raise
    assert len(backend.graphs) == 1  # fullgraph: a break would have raised
    assert backend.ops(), f"{example.name} traced without reaching any {declared_layer.NAMESPACE} op"
    # Each op's fake outputs sit on the inputs' device: opcheck on the H200 found FlashInfer's merge_states
    # fake allocating on the CPU (declared/rules.py REPLACED_FAKES), which tracing alone lets through.
    for graph in backend.graphs:
        for node in graph.graph.nodes:
            if node.op == "call_function" and declared_layer.NAMESPACE in str(node.target):
                devices = {value.device.type for value in torch.utils._pytree.tree_leaves(node.meta.get("example_value"))
                           if isinstance(value, torch.Tensor)}
                assert devices <= {"cuda"}, (str(node.target), devices)


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_the_nsa_indexer_layernorm_call_traces_under_the_default_gate():
    """The call SGLang's NSA indexer makes (sglang 0.5.9 srt/layers/layernorm.py LayerNorm.forward_cuda, the
    indexer's k_norm = LayerNorm(head_dim, dtype=torch.float32)): module-level `from flashinfer.norm import
    layernorm`, bf16 keys, float32 weight and bias, called positionally. Run in a fresh interpreter so that
    the binding exists before the shim applies, as in SGLang's scheduler with the plugin route."""
    completed = run_python(NSA_CALL, env={GATE: ""}, timeout=600)  # empty: the default gate
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == "unpatched: failed; shim: 1 graph, fp4_dynamo_shim_flashinfer.layernorm.default"


NSA_CALL = r"""
import torch
from flashinfer.norm import layernorm  # SGLang binds it at import, before any shim applies
from torch._subclasses.fake_tensor import FakeTensorMode

class LayerNorm(torch.nn.Module):  # sglang 0.5.9 LayerNorm, forward_cuda's FlashInfer branch
    def __init__(self, hidden_size, eps=1e-6, dtype=torch.float32):
        super().__init__()
        self.variance_epsilon = eps
        self.dtype = dtype
        # requires_grad=False: an autograd edge on a fake CUDA tensor aborts a CPU-only torch (SGLang serves
        # without gradients anyway)
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device="cuda"), requires_grad=False)
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype, device="cuda"), requires_grad=False)

    def forward(self, x):
        if x.dtype == torch.bfloat16 and self.dtype == torch.float32:
            return layernorm(x, self.weight, self.bias, self.variance_epsilon)
        raise AssertionError("not the FlashInfer branch")

class TraceOnly:
    def __init__(self):
        self.graphs = []
    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        def run(*args):
            with FakeTensorMode(allow_non_fake_inputs=True):
                return gm(*args)
        return run

with FakeTensorMode(allow_non_fake_inputs=True):
    norm = LayerNorm(128)
    key = torch.empty(64, 128, dtype=torch.bfloat16, device="cuda")
try:
    torch.compile(norm, fullgraph=True, backend=TraceOnly())(key)
    unpatched = "traced"
except Exception:
    unpatched = "failed"
torch._dynamo.reset()
import fp4_dynamo_shim
assert fp4_dynamo_shim.status()["flashinfer_ops"]["gate"] == "proven"
backend = TraceOnly()
out = torch.compile(norm, fullgraph=True, backend=backend)(key)
assert out.shape == (64, 128) and out.dtype == torch.bfloat16
ops = sorted({str(n.target) for g in backend.graphs for n in g.graph.nodes if "fp4_dynamo_shim" in str(n.target)})
print(f"unpatched: {unpatched}; shim: {len(backend.graphs)} graph, {', '.join(ops)}")
"""


def _flashinfer_globals():
    """FlashInfer's module globals that are not the FP4 layer's replacements (those are new objects per apply)."""
    return {(name, key): value for name, module in list(sys.modules.items())
            if name.startswith("flashinfer") and module is not None
            for key, value in list(vars(module).items())
            if callable(value) and not str(getattr(value, "__module__", "") or "").startswith("_fp4_dynamo_shim")
            and not getattr(value, "__fp4_dynamo_shim__", False)}


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
@pytest.mark.release_independent  # the shim's lazy registration; each release's declarations are test_every_declaration's
def test_nothing_is_registered_before_torch_dynamo_is_imported():
    """Start-up pays nothing for the layer: it reads and registers once torch._dynamo is imported."""
    completed = run_python(
        "import json, sys, fp4_dynamo_shim\n"
        "before = fp4_dynamo_shim.status()['flashinfer_ops']\n"
        "dynamo_before = 'torch._dynamo' in sys.modules\n"
        "import torch._dynamo\n"
        "after = fp4_dynamo_shim.status()['flashinfer_ops']\n"
        "print(json.dumps([dynamo_before, before['state'], before['counts']['declared'], after['state'],"
        " sorted(after['registered'])]))", env={GATE: "all"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    dynamo_before, state_before, declared_before, state_after, registered = json.loads(
        completed.stdout.strip().splitlines()[-1])
    assert (dynamo_before, state_before, declared_before) == (False, "waiting for torch._dynamo to be imported", 0)
    assert state_after == "registered" and "flashinfer.norm.layernorm" in registered


def test_eager_calls_keep_flashinfers_own_function_objects(every_op):
    """With every declared op on, no FlashInfer global is one of the shim's generated callers and none differs
    from the reverted state: eager calls run FlashInfer's own functions (no wrapper frame, no dispatcher),
    whatever module bound them."""
    applied = _flashinfer_globals()
    generated = sorted(f"{n}.{k}" for (n, k), v in applied.items()
                       if getattr(getattr(v, "__code__", None), "co_filename", "").startswith(f"<{declared_layer.NAMESPACE}"))
    assert generated == []
    fp4_dynamo_shim.revert()
    reverted = _flashinfer_globals()
    assert fp4_dynamo_shim.apply()
    assert sorted(f"{n}.{k}" for (n, k), v in applied.items() if reverted.get((n, k)) is not v) == []
    assert len(applied) > 1000  # FlashInfer's functions, not an empty comparison


def test_revert_destroys_every_op_and_takes_every_polyfill_back(every_op):
    import flashinfer.norm

    registered = list(every_op["registered"].values())
    assert polyfill.is_polyfilled(flashinfer.norm.layernorm)
    fp4_dynamo_shim.revert()
    namespace = getattr(torch.ops, declared_layer.NAMESPACE)
    left = [op for op in registered if hasattr(namespace, op.split("::")[1])]
    assert left == []
    assert not polyfill.is_polyfilled(flashinfer.norm.layernorm)
    assert fp4_dynamo_shim.apply()


def test_a_compiled_function_recompiles_after_revert_and_traces_flashinfer_again(every_op):
    function, args, kwargs = _fake_call(declared_examples.by_name("norm.layernorm"))
    backend = _TraceOnly()
    compiled = torch.compile(lambda *a: function(*a), fullgraph=True, backend=backend)
    compiled(*args)
    fp4_dynamo_shim.revert()
    # Dynamo traces again, FlashInfer's own function this time, and fails on it (its JIT module loader);
    # reusing the graph would instead call the op revert() destroyed.
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        compiled(*args)
    assert fp4_dynamo_shim.apply()
    compiled(*args)
    assert len(backend.graphs) == 2


def test_unpatched_flashinfer_does_not_trace_the_same_calls(unpatched):
    function, args, kwargs = _fake_call(declared_examples.by_name("norm.rmsnorm"))
    with pytest.raises(Exception):
        _trace(function, args, kwargs)


def test_the_proven_gate_adds_what_the_gpu_record_proved_for_the_installed_release(monkeypatch):
    """With a record for the installed release: SGLang's set plus exactly the recorded declarations, each
    function the record names traced to its op; without one (0.7.4 has none): SGLang's set, and the status
    and every gated-off reason say there is no record. A stand-in record for the installed release shows
    the first case on any release (the real records' releases run in the matrix and on the GPU)."""
    from _fp4_dynamo_shim.declared import proven

    version = lifecycle.flashinfer_version()
    sglang_only = _reapply(monkeypatch, "sglang")["registered"]
    if version not in proven.PROVEN:
        layer = _reapply(monkeypatch, "proven")
        assert layer["registered"] == sglang_only and layer["proven"] is None
        assert all(f"no GPU record for FlashInfer {version}" in entry["reason"]
                   for entry in layer["not_registered"].values() if entry["kind"] == "off under the gate")
        present = set(_reapply(monkeypatch, "all")["registered"])
        chosen = {key: name for key, name in (("flashinfer.norm._rmsnorm_impl", "norm.rmsnorm"),
                                              ("flashinfer.rope._apply_rope", "rope.apply_rope")) if key in present}
        assert chosen, "the stand-in record needs declarations this release has"
        record = {**dict.fromkeys(proven.MEASURED, "a stand-in record"), "declarations": {
            key: {"module": key.rsplit(".", 1)[0], "op": None, "functions": [name]} for key, name in chosen.items()}}
        monkeypatch.setitem(proven.PROVEN, version, record)
    record = proven.PROVEN[version]
    layer = _reapply(monkeypatch, "proven")
    assert set(layer["registered"]) == set(sglang_only) | set(record["declarations"])
    assert layer["proven"]["flashinfer"] == version and layer["proven"]["declarations"] == len(record["declarations"])
    assert {field: layer["proven"][field] for field in proven.MEASURED} == \
        {field: record[field] for field in proven.MEASURED}
    assert all("not proven on a GPU for this release" in entry["reason"]
               for entry in layer["not_registered"].values() if entry["kind"] == "off under the gate")
    for name in layer["proven"]["functions"]:
        example = next((e for e in declared_examples.EXAMPLES if e.name == name), None)
        if example is not None and example.resolve() is not None:
            function, args, kwargs = _fake_call(example)
            torch._dynamo.reset()  # one traced code object for every call: a recompile would make floats dynamic
            with monkeypatch.context() as patch:
                patch.setitem(declared_layer.CAPABILITIES, 0, (9, 0))
                try:
                    assert _trace(function, args, kwargs).ops(), name
                except Exception as error:
                    if not any(text in str(error) for text in NO_GPU_TO_ASK):
                        raise AssertionError(name) from error


def _break_layernorm(monkeypatch):
    """torch refuses to define the shim's layernorm op (helpers.torch_refuses_declared_ops)."""
    torch_refuses_declared_ops(monkeypatch, ops=("layernorm",))


def test_one_op_failing_to_register_is_listed_and_the_shim_stays_applied(monkeypatch, every_op, caplog):
    _break_layernorm(monkeypatch)
    try:
        with caplog.at_level("WARNING"):
            layer = _reapply(monkeypatch, "all")
        assert fp4_dynamo_shim.status()["applied"]
        assert layer["failed"] == ["flashinfer.norm.layernorm"]
        assert "injected define failure" in layer["not_registered"]["flashinfer.norm.layernorm"]["reason"]
        assert layer["counts"]["registered"] == every_op["counts"]["registered"] - 1
        assert any("failed to register" in record.getMessage() for record in caplog.records)
    finally:  # the module's other tests expect every op
        monkeypatch.undo()
        _reapply(monkeypatch, "all")


def test_one_op_failing_to_register_under_strict_refuses_the_whole_shim(monkeypatch):
    _break_layernorm(monkeypatch)
    with pytest.raises(ApplyError, match="flashinfer.norm.layernorm"):
        apply_with(monkeypatch, STRICT="1", FLASHINFER_OPS="all")
    import flashinfer.norm

    assert not polyfill.is_polyfilled(flashinfer.norm.fused_add_rmsnorm)  # registered before the refusal, undone
    assert not hasattr(getattr(torch.ops, declared_layer.NAMESPACE), "fused_add_rmsnorm")


def test_a_number_or_a_tensor_parameter_reaches_the_op_either_way(every_op):
    """rmsnorm_quant(scale: Union[float, Tensor]) (0.6.12+): two optional op parameters carry it."""
    example = declared_examples.by_name("norm.rmsnorm_quant")
    function, args, kwargs = _fake_call(example)
    import inspect

    if inspect.signature(function).parameters["scale"].annotation in (float, "float"):
        pytest.skip("this release takes a float scale only")
    for scale in (args[3], 0.5):
        with torch._dynamo.config.patch(specialize_float=True):  # 0.5 a constant, not a 0-d graph input
            backend = _trace(function, (*args[:3], scale, *args[4:]), kwargs)
        node = next(n for n in backend.graphs[0].graph.nodes if "rmsnorm_quant" in str(n.target))
        tensor_part, number_part = node.args[3], node.args[4]
        assert (number_part == 0.5 and tensor_part is None) if isinstance(scale, float) else (number_part is None)


def test_a_generator_under_compile_is_refused_with_a_clear_error(every_op):
    function, args, kwargs = _fake_call(declared_examples.by_name("sampling.top_k_sampling_from_probs"))
    generator = torch.Generator()
    with pytest.raises(Exception, match="torch.Generator cannot cross a custom op"):
        _trace(function, args, {"generator": generator})


def test_declarations_are_read_from_the_source_not_from_decoration(tmp_path):
    """A module written like FlashInfer's: the scan finds a module-level op, a getter's nested op with a key
    computed from the getter's parameter, and their fakes."""
    source = '''
import functools
from types import SimpleNamespace

@register_custom_op("flashinfer::plain", mutates_args=("out",))
def _plain(out: torch.Tensor, x: torch.Tensor) -> None:
    pass

@register_fake_op("flashinfer::plain")
def _plain_fake(out: torch.Tensor, x: torch.Tensor) -> None:
    pass

@functools.cache
def get_module(kind: str):
    fname = f"{kind}_op"

    @register_custom_op(f"flashinfer::{fname}", mutates_args=())
    def _op(x: torch.Tensor) -> torch.Tensor:
        return x

    @register_fake_op(f"flashinfer::{fname}")
    def _fake_op(x: torch.Tensor) -> torch.Tensor:
        return x

    return SimpleNamespace(**{fname: _op})
'''
    declarations, namespaces = scan.scan_source(source, "flashinfer.example")
    plain, nested = declarations
    assert (plain.name, plain.mutates, plain.scope, plain.fake.function) == ("plain", ("out",), (), "_plain_fake")
    assert (nested.name, nested.getter, nested.getter_parameters, nested.fake.function) == (
        None, "get_module", "kind: str", "_fake_op")
    assert namespaces[0].keys_of("_op") == ("=f'{kind}_op'",)
