"""SGLang >= 0.5.12 wraps FlashInfer's ``fp4_quantize`` in its own op; the shim is harmless there, on every route.

SGLang's ``fp4_utils.py`` (0.5.14 and 0.5.21, run from verbatim copies: ``tests/support/sglang_wrapper.py`` says
which of its imports are stood in, and why) binds ``from flashinfer import fp4_quantize as
_flashinfer_fp4_quantize`` at import and calls it inside ``torch.ops.sglang.flashinfer_fp4_quantize`` with
``backend="cute-dsl"`` on SM100 and ``"cuda"`` elsewhere. Two ways the shim meets it:

* ``before``: the ``.pth`` hook, sitecustomize or ``import fp4_dynamo_shim`` applied the shim before SGLang
  imported, so SGLang binds the shim's replacement;
* ``after``: SGLang imported first and the plugin (``_fp4_dynamo_shim.activation.sglang_plugin.plugin``, what each SGLang
  scheduler runs) applied the shim later; it rebinds ``_flashinfer_fp4_quantize`` too (the choice, and why,
  is in docs/how-it-works.md, "SGLang's own FP4 ops"), so both routes run the same code.

Checked against ``off`` (no shim: SGLang's op calls FlashInfer's own function): the bytes, the arguments that
reach FlashInfer (its kernel entry for ``"cuda"``, its CuTe-DSL entry for ``"cute-dsl"``), the op namespace,
and the graph Dynamo records. There is no GPU here: where FlashInfer's own function has to run, its device
queries and its JIT module are stood in as in ``tests/fp4/test_parity.py`` (an SM100 answering, a recording module).
"""

from __future__ import annotations

import inspect

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.verify import checks
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.activation import sglang_plugin
from _fp4_dynamo_shim.fp4 import replacement

import sglang_facts
import sglang_wrapper  # noqa: E402
from helpers import describe
from nvfp4_inputs import nvfp4_input

VERSIONS = sglang_facts.SOURCE_RELEASES
ROUTES = ("before", "after")
BINDING = "sglang.srt.layers.quantization.fp4_utils._flashinfer_fp4_quantize"
FOUR_OVER_SIX = "FLASHINFER_NVFP4_4OVER6"
#: FlashInfer 0.7.x warns that the variable is deprecated each time it reads it; reading it is the point here.
four_over_six_read = pytest.mark.filterwarnings("ignore:The FLASHINFER_NVFP4_4OVER6:FutureWarning")

pytestmark = pytest.mark.skipif(
    "backend" not in inspect.signature(lifecycle.original_function() or flashinfer.fp4_quantize).parameters,
    reason="SGLang >= 0.5.12 passes backend= to fp4_quantize; this FlashInfer's has no such parameter "
           "(SGLang pins 0.6.11.post1 and later)")


class Imported:
    """SGLang fp4_utils modules imported by a test, newest last; ``unload`` drops the newest."""

    def __init__(self):
        self.loaded = []

    def load(self, version, sm100=False):
        self.loaded.append(sglang_wrapper.load(version, sm100))
        return self.loaded[-1].fp4_utils

    def unload(self):
        self.loaded.pop().unload()


@pytest.fixture
def sglang_import():
    imported = Imported()
    yield imported
    while imported.loaded:
        imported.unload()


def on_route(route, imported, version, sm100=False, apply=None):
    """SGLang's fp4_utils with the shim applied before it imported (hook, sitecustomize, import), or by the
    plugin after. ``apply(plugin)`` applies the shim (default: ``apply()``, or the plugin itself)."""
    apply = apply or _plain_apply
    if route == "before":
        assert apply(plugin=False)
        return imported.load(version, sm100)
    fp4_dynamo_shim.revert()
    fp4_utils = imported.load(version, sm100)
    assert fp4_utils._flashinfer_fp4_quantize is flashinfer.fp4_quantize  # FlashInfer's own, bound at import
    assert not replacement.is_shim(fp4_utils._flashinfer_fp4_quantize)
    assert apply(plugin=True)
    return fp4_utils


def _plain_apply(plugin=False):
    if plugin:
        sglang_plugin.plugin()  # what every SGLang scheduler runs: apply, then rebind what was bound before
        return lifecycle.status()["applied"]
    return fp4_dynamo_shim.apply()


def sglang_ops():
    return sorted(name for name in torch._C._dispatch_get_all_op_names() if name.startswith("sglang::"))


def _inputs():
    return [nvfp4_input(rows, columns, dtype=dtype, seed=18 + seed, spread=3)
            for seed, (rows, columns, dtype) in enumerate(((1, 64, torch.bfloat16), (37, 256, torch.bfloat16),
                                                           (128, 128, torch.float16), (300, 512, torch.bfloat16)))]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("route", ROUTES)
def test_sglangs_binding_is_the_shims_replacement_on_every_route(version, route, sglang_import):
    fp4_utils = on_route(route, sglang_import, version)
    assert replacement.is_shim(fp4_utils._flashinfer_fp4_quantize)
    assert fp4_utils._flashinfer_fp4_quantize is flashinfer.fp4_quantize
    if route == "after":
        assert BINDING in lifecycle.status()["rebound"]
    fp4_dynamo_shim.revert()  # and revert puts FlashInfer's own function back into SGLang's module
    assert not replacement.is_shim(fp4_utils._flashinfer_fp4_quantize)
    assert fp4_utils._flashinfer_fp4_quantize is flashinfer.fp4_quantize


@pytest.mark.parametrize("version", VERSIONS)
def test_sglangs_op_gives_the_same_bytes_on_both_routes_as_the_shims_fp4_quantize(version, sglang_import):
    """backend="cuda" (SM12x, SM90): SGLang's op runs the shim's quantizer (the reference on CPU)."""
    results = {}
    for route in ROUTES:
        fp4_utils = on_route(route, sglang_import, version)
        assert fp4_utils._flashinfer_fp4_quantize_backend == "cuda"
        results[route] = [fp4_utils.fp4_quantize(x, scale) for x, scale in _inputs()]
        sglang_import.unload()
    expected = [flashinfer.fp4_quantize(x, scale) for x, scale in _inputs()]
    for route, outputs in results.items():
        for got, want in zip(outputs, expected):
            for g, w in zip(got, want):
                assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype), route
                assert torch.equal(g, w), route


def _kernel_call(call):
    """A recorded kernel-entry call: inputs and scalars exactly, output buffers by size, dtype and layout
    (the shim allocates them in the shape it returns; every release's kernel reads only their pointers)."""
    return [describe(a) if i not in (2, 3) else (a.numel(), a.dtype, a.is_contiguous()) for i, a in enumerate(call)]


@four_over_six_read
@pytest.mark.parametrize("four_over_six", [None, "1"], ids=["4over6-unset", "4over6-from-environment"])
@pytest.mark.parametrize("enable_pdl", [None, False])  # None: both resolve the device's PDL default
@pytest.mark.parametrize("version", VERSIONS)
def test_flashinfers_kernel_gets_the_same_call_with_and_without_the_shim(version, enable_pdl, four_over_six,
                                                                          stand_in_sm100, sglang_import, monkeypatch):
    """backend="cuda": without the shim FlashInfer's Python resolves enable_pdl and the 4over6 recipe and calls
    its kernel; with it (either route) the shim does, and the kernel entry must see the identical call."""
    _, recorder, apply = stand_in_sm100
    if four_over_six:
        monkeypatch.setenv(FOUR_OVER_SIX, four_over_six)
    x, scale = _inputs()[1]
    calls = {}
    fp4_dynamo_shim.revert()
    off = sglang_import.load(version)
    off.fp4_quantize(x, scale, enable_pdl=enable_pdl)
    calls["off"] = recorder.calls[-1]
    sglang_import.unload()
    for route in ROUTES:
        count = len(recorder.calls)
        fp4_utils = on_route(route, sglang_import, version, apply=apply)
        fp4_utils.fp4_quantize(x, scale, enable_pdl=enable_pdl)
        assert len(recorder.calls) == count + 1, route
        calls[route] = recorder.calls[-1]
        sglang_import.unload()
        fp4_dynamo_shim.revert()
    assert _kernel_call(calls["before"]) == _kernel_call(calls["off"])
    assert _kernel_call(calls["after"]) == _kernel_call(calls["off"])


@pytest.fixture
def stand_in_cute_dsl(stand_in_sm100, monkeypatch):
    """The CuTe-DSL kernel (SM100 and the CUTLASS DSL) stood in by a recorder of the call FlashInfer makes."""
    module, _, apply = stand_in_sm100
    if not hasattr(module, "_fp4_quantize_cute_dsl"):
        pytest.skip("this FlashInfer has no CuTe-DSL fp4_quantize")
    calls = []

    def cute_dsl(*arguments):
        calls.append(arguments)
        x = arguments[0]
        return x.new_zeros((x.shape[0], x.shape[1] // 2), dtype=torch.uint8), x.new_zeros(1, dtype=torch.uint8)

    monkeypatch.setattr(module, "_fp4_quantize_cute_dsl", cute_dsl)
    return calls, apply


@four_over_six_read
@pytest.mark.parametrize("version", VERSIONS)
def test_on_sm100_sglangs_cute_dsl_call_reaches_flashinfer_unchanged(version, stand_in_cute_dsl, sglang_import,
                                                                     monkeypatch):
    """backend="cute-dsl" is not what the shim's op runs: the replacement hands the whole call to FlashInfer's
    own function, which must then make exactly the CuTe-DSL call it makes without the shim."""
    calls, apply = stand_in_cute_dsl
    monkeypatch.setenv(FOUR_OVER_SIX, "1")  # FlashInfer resolves the recipe from it on this path too
    x, scale = _inputs()[1]
    seen = {}
    fp4_dynamo_shim.revert()
    off = sglang_import.load(version, sm100=True)
    assert off._flashinfer_fp4_quantize_backend == "cute-dsl"
    off.fp4_quantize(x, scale, enable_pdl=True)
    seen["off"] = calls[-1]
    sglang_import.unload()
    for route in ROUTES:
        fp4_utils = on_route(route, sglang_import, version, sm100=True, apply=apply)
        assert replacement.is_shim(fp4_utils._flashinfer_fp4_quantize)
        fp4_utils.fp4_quantize(x, scale, enable_pdl=True)
        seen[route] = calls[-1]
        sglang_import.unload()
        fp4_dynamo_shim.revert()
    assert len(calls) == 3
    for route in ROUTES:
        assert [describe(a) for a in seen[route]] == [describe(a) for a in seen["off"]], route


def test_an_explicit_nvfp4_4over6_with_cute_dsl_reaches_flashinfer_unchanged(stand_in_cute_dsl):
    """The other FlashInfer-0.7 caller shape (SGLang 0.5.23's online NVFP4 passes a recipe with backend="cute-dsl")."""
    calls, apply = stand_in_cute_dsl
    if "nvfp4_4over6" not in inspect.signature(flashinfer.fp4_quantize).parameters:
        pytest.skip("this FlashInfer's fp4_quantize has no nvfp4_4over6")
    recipe = flashinfer.NVFP44Over6Config(e4m3_max=256, err_mode="MSE")
    x, scale = _inputs()[1]
    fp4_dynamo_shim.revert()
    flashinfer.fp4_quantize(x, scale, backend="cute-dsl", nvfp4_4over6=recipe, enable_pdl=False)
    apply()
    flashinfer.fp4_quantize(x, scale, backend="cute-dsl", nvfp4_4over6=recipe, enable_pdl=False)
    off, on = calls
    assert [describe(a) for a in on] == [describe(a) for a in off] and off[-1] == recipe


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("route", ROUTES)
def test_the_shim_registers_nothing_in_sglangs_op_namespace(version, route, sglang_import):
    fp4_dynamo_shim.revert()
    assert sglang_ops() == []
    assert fp4_dynamo_shim.apply()
    assert sglang_ops() == []  # the shim's own op lives in its own namespace
    assert "fp4_dynamo_shim::fp4_quantize" in torch._C._dispatch_get_all_op_names()
    on_route(route, sglang_import, version)
    assert sglang_ops() == ["sglang::flashinfer_fp4_quantize"]  # SGLang's, and only SGLang's


@pytest.mark.parametrize("version", VERSIONS)
def test_dynamo_records_the_same_graph_of_sglangs_op_with_and_without_the_shim(version, sglang_import):
    """SGLang's op is opaque to Dynamo: with or without the shim, one graph, SGLang's op in it, no graph break,
    and no node of the shim's own op (traced on fake tensors: FlashInfer cannot run on CPU without the shim)."""
    x, scale = _inputs()[1]
    graphs = {}
    for state in ("off", *ROUTES):
        if state == "off":
            fp4_dynamo_shim.revert()
            fp4_utils = sglang_import.load(version)
        else:
            fp4_utils = on_route(state, sglang_import, version)
        torch._dynamo.reset()
        backend = checks._TraceOnly()
        torch.compile(lambda x, s: fp4_utils.fp4_quantize(x, s), fullgraph=True, backend=backend)(x, scale)
        (graph,) = backend.graphs
        graphs[state] = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
        sglang_import.unload()
    assert [target for target in graphs["off"] if "getitem" not in target] == ["sglang.flashinfer_fp4_quantize"]
    assert graphs["before"] == graphs["after"] == graphs["off"]
    assert fp4_dynamo_shim.apply()
    fp4_utils = sglang_import.load(version)
    explanation = torch._dynamo.explain(lambda x, s: fp4_utils.fp4_quantize(x, s))(x, scale)  # runs it, too
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
