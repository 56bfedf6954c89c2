"""The declared-ops layer's own decisions, case by case: what status() says of each gate, each refusal's words, the
wait for torch._dynamo's import and a failure there, the device-query helpers and their polyfills, a failure or an
interruption while registering, and revert (the cases a release may declare are
test_declared_cases_on_a_stand_in_release.py's).

test_declared_ops_trace_on_cpu.py holds the layer's work on the installed release as a whole (every declaration registered or
listed, traced calls); most of the cases here do not occur in it (0.7.4 has no computed module-level name, no
non-literal ``mutates_args``, no op FlashInfer registered itself), or occur only on a GPU. Stand-ins, each
named where used: a FlashInfer-like package written to a temporary directory (its modules executed with no-op
decorators, as FlashInfer's are when its custom ops are off), the import of torch._dynamo (wrapt's
notification, which its import finder sends), a second GPU's capability, and a clock.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import wrapt

import flashinfer
import flashinfer.norm
import flashinfer.sampling
import flashinfer.utils
import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim.declared import polyfill
from _fp4_dynamo_shim.declared import proven

from helpers import apply_with, torch_refuses_declared_ops

VERSION = lifecycle.flashinfer_version()
GATE = "FP4_DYNAMO_SHIM_FLASHINFER_OPS"
#: What the default set (``declared_rules.SGLANG``) registers from 0.7.4, and the files the narrow gates read.
SGLANG_KEYS = {"flashinfer.norm.layernorm", "flashinfer.norm.rmsnorm_quant",
               "flashinfer.fused_moe.fused_routing_dsv3.get_dsv3_fused_routing_module.NoAuxTc"}
SGLANG_MODULES = "flashinfer.fused_moe.fused_routing_dsv3, flashinfer.norm"
LOG_LINES = [f"flashinfer.jit.core.FlashInferJITLogger.{level}_once (skipped in compiled code)"
             for level in ("debug", "info", "warning")]
HELPERS = ["flashinfer.utils.get_compute_capability", "flashinfer.sampling._blackwell_softmax_capability",
           "flashinfer.utils._get_cache_alibi_slopes_buf", *LOG_LINES]
LOGGER = "fp4_dynamo_shim.declared.declared_layer"
WARNED = "fp4_dynamo_shim"  # the one warn-once logs under the package's logger


def _reapply(monkeypatch, gate):
    status = apply_with(monkeypatch, FLASHINFER_OPS=gate)
    assert status["applied"], status["problem"]
    return status["flashinfer_ops"]


def _namespace():
    return getattr(torch.ops, declared_layer.NAMESPACE)


# --- status() under the real release -----------------------------------------------------------------------


def test_the_default_set_reports_its_files_helpers_fakes_and_counts_per_module(monkeypatch):
    layer = _reapply(monkeypatch, "sglang")
    # Every field status() documents, under its name (verify and the docs read them).
    assert set(layer) == {"gate", "scanned", "registered", "not_registered", "fakes_not_flashinfers_own", "failed",
                          "helpers", "compiler", "unproven", "state", "counts", "by_module", "seconds", "proven"}
    assert layer["state"] == "registered" and set(layer["registered"]) == SGLANG_KEYS
    assert layer["scanned"] == f"the sglang gate's modules: {SGLANG_MODULES}"
    # Both of 0.7.4's cached device queries get a traced stand-in (FlashInfer imports both modules).
    assert layer["helpers"] == HELPERS
    # layernorm's and rmsnorm_quant's fakes are FlashInfer's own, so only NoAuxTc's is listed; a gated-off
    # declaration has no fake at all and is not listed either.
    assert layer["fakes_not_flashinfers_own"] == {
        "flashinfer.fused_moe.fused_routing_dsv3.get_dsv3_fused_routing_module.NoAuxTc": "none needed (returns None)"}
    assert sorted(layer["by_module"]) == ["flashinfer.fused_moe.fused_routing_dsv3", "flashinfer.norm"]
    norm = [key for key in (*layer["registered"], *layer["not_registered"]) if key.startswith("flashinfer.norm.")]
    assert layer["by_module"]["flashinfer.norm"]["declared"] == len(norm) == 12
    assert layer["by_module"]["flashinfer.norm"]["registered"] == 2
    assert layer["by_module"]["flashinfer.fused_moe.fused_routing_dsv3"]["registered"] == 1
    assert sum(counts["declared"] for counts in layer["by_module"].values()) == layer["counts"]["declared"]


def test_the_seconds_are_the_time_registration_took_to_the_millisecond(monkeypatch):
    # Stand-in clock: registration starts at 1000 s and ends 123.4567 ms later (a real one would make the
    # rounding and the difference depend on the machine's speed).
    readings = [1000.0, 1000.1234567]
    monkeypatch.setattr(declared_layer, "time", types.SimpleNamespace(
        perf_counter=lambda: readings.pop(0) if len(readings) > 1 else readings[0]))
    layer = _reapply(monkeypatch, "sglang")
    assert layer["seconds"] == 0.123 and isinstance(layer["seconds"], float)


def test_a_gated_off_declaration_says_which_gate_left_it_off_and_how_to_turn_it_on(monkeypatch):
    """The words differ by gate: the default is named as such, and under ``proven`` they say what the GPU
    record holds (none for 0.7.4; a stand-in record for the installed release shows the other case)."""
    off = "flashinfer.norm._rmsnorm_impl"  # declared in a file the narrow gates read, in no set
    layer = _reapply(monkeypatch, "sglang")
    assert layer["not_registered"][off] == {"kind": "off under the gate",
                                            "reason": f"off under {GATE}=sglang: set it to all"}
    monkeypatch.delitem(proven.PROVEN, VERSION, raising=False)
    layer = _reapply(monkeypatch, "proven")
    assert layer["not_registered"][off]["reason"] == (
        f"off under {GATE}=proven (the default): the shim has no GPU record for FlashInfer {VERSION}: "
        "set it to all")
    record = {**dict.fromkeys(proven.MEASURED, "a stand-in record"), "declarations": {
        "flashinfer.norm.fused_add_rmsnorm": {"module": "flashinfer.norm", "op": "fused_add_rmsnorm",
                                              "functions": ["norm.fused_add_rmsnorm"]}}}
    monkeypatch.setitem(proven.PROVEN, VERSION, record)
    layer = _reapply(monkeypatch, "proven")
    assert "flashinfer.norm.fused_add_rmsnorm" in layer["registered"]
    assert layer["not_registered"][off]["reason"] == (
        f"off under {GATE}=proven (the default): not proven on a GPU for this release (the shim's GPU record): "
        "set it to all")


def test_the_gate_off_reads_nothing_and_says_so(monkeypatch):
    layer = _reapply(monkeypatch, "off")
    assert (layer["state"], layer["scanned"], layer["counts"]["declared"], layer["helpers"]) == (
        "off", "nothing (the gate is off)", 0, [])


def test_a_reverted_layer_says_so():
    """What a layer's import hook reads when torch._dynamo comes after revert (and what describe() shows)."""
    layer = declared_layer.start("off", VERSION)
    declared_layer.revert(layer)
    assert declared_layer.describe(layer)["state"] == "reverted"


# --- the wait for torch._dynamo --------------------------------------------------------------------------------


def _applied_before_dynamo(apply, monkeypatch, gate="sglang"):
    """A layer applied as at start-up, while torch._dynamo is not imported yet. The test process imported it
    long ago: it is out of sys.modules while the layer applies, and wrapt's notification, which its import
    finder sends when the import completes, stands in for the import."""
    with monkeypatch.context() as patch:
        patch.delitem(sys.modules, "torch._dynamo")
        layer = apply(gate)
        before = declared_layer.describe(layer)
    return layer, before


def test_a_layer_applied_before_torch_dynamo_waits_then_registers_when_it_is_imported(own_layers, monkeypatch):
    layer, before = _applied_before_dynamo(own_layers, monkeypatch)
    assert (before["state"], before["scanned"], before["counts"]["declared"], before["registered"]) == (
        "waiting for torch._dynamo to be imported", "not yet", 0, {})
    wrapt.notify_module_loaded(sys.modules["torch._dynamo"])
    after = declared_layer.describe(layer)
    assert (after["state"], after["scanned"], set(after["registered"])) == (
        "registered", f"the sglang gate's modules: {SGLANG_MODULES}", SGLANG_KEYS)


def test_a_failure_when_torch_dynamo_is_imported_is_logged_and_recorded_not_raised(own_layers, monkeypatch, caplog):
    """The user's program is importing torch._dynamo (typically inside torch.compile): the layer's failure must
    not become theirs. It is in status() and in one warning."""
    layer, _ = _applied_before_dynamo(own_layers, monkeypatch)

    torch_refuses_declared_ops(monkeypatch, error=NO_FRAGMENT)
    switches.warned.clear()  # said once per process: the same failure may have been said by another test
    with caplog.at_level("WARNING", logger=WARNED):
        wrapt.notify_module_loaded(sys.modules["torch._dynamo"])  # returns: the import goes on
    state = "failed: RuntimeError: injected: the fragment could not be made"
    assert declared_layer.describe(layer)["state"] == state
    assert [r.getMessage() for r in caplog.records if r.name == WARNED] == [
        f"fp4_dynamo_shim: FlashInfer's declared ops were not registered: {state}"]


# --- failures while registering -----------------------------------------------------------------------------


#: What torch says, in the stand-in, when it will not make the fragment of the shim's declared ops.
NO_FRAGMENT = RuntimeError("injected: the fragment could not be made")


def test_a_failure_while_registering_with_torch_dynamo_imported_refuses_the_apply(monkeypatch):
    """Not a failure of one op (those are listed): with torch._dynamo already imported the layer registers
    inside apply(), so the failure is apply's, which undoes the layers before it and reports it."""
    torch_refuses_declared_ops(monkeypatch, error=NO_FRAGMENT)
    status = apply_with(monkeypatch, FLASHINFER_OPS="sglang")
    assert not status["applied"]
    assert "RuntimeError: injected: the fragment could not be made" in status["problem"]


class _Interrupted(BaseException):
    """What a KeyboardInterrupt is to the layer: no Exception, so no per-op handler takes it."""


def test_an_interruption_while_registering_takes_back_what_was_already_done(own_layers, monkeypatch):
    """Interrupted while handing the polyfills to Dynamo: the one already installed is taken back and the
    ops are destroyed, so Dynamo does not go on tracing FlashInfer's function into an op of a layer nobody
    holds."""
    substitute, installed = torch._dynamo.substitute_in_graph, []

    def interrupted_at_the_second(original, **options):  # Dynamo's own entry, which each polyfill goes through
        installed.append(original)
        if len(installed) == 2:
            raise _Interrupted()
        return substitute(original, **options)

    monkeypatch.setattr(torch._dynamo, "substitute_in_graph", interrupted_at_the_second)
    with pytest.raises(_Interrupted):
        own_layers("sglang")
    assert installed[0] is flashinfer.norm.rmsnorm_quant  # installed before the interruption...
    assert not polyfill.is_polyfilled(flashinfer.norm.rmsnorm_quant)  # ...and taken back
    assert not hasattr(_namespace(), "rmsnorm_quant") and not hasattr(_namespace(), "layernorm")


# --- the device-query helpers ---------------------------------------------------------------------------------


def test_a_release_without_one_helper_polyfills_the_other(monkeypatch):
    """``_blackwell_softmax_capability`` is 0.7.x's only: an earlier release has no such function."""
    monkeypatch.delattr(flashinfer.sampling, "_blackwell_softmax_capability")
    layer = _reapply(monkeypatch, "sglang")
    assert layer["helpers"] == ["flashinfer.utils.get_compute_capability", "flashinfer.utils._get_cache_alibi_slopes_buf",
                                *LOG_LINES] and layer["failed"] == []


def test_a_helper_flashinfer_did_not_cache_is_polyfilled_itself(monkeypatch):
    plain = flashinfer.utils.get_compute_capability.__wrapped__
    monkeypatch.setattr(flashinfer.utils, "get_compute_capability", plain)  # no functools.cache around it
    layer = _reapply(monkeypatch, "sglang")
    assert layer["failed"] == [] and layer["helpers"] == HELPERS
    assert polyfill.is_polyfilled(plain)


def test_a_helper_another_library_already_substitutes_fails_every_op_it_serves(monkeypatch, caplog):
    """Dynamo holds one polyfill per function: the ops that reach the device query under tracing are listed as
    failed, with the helper's name, and the shim stays applied (not STRICT)."""
    original = flashinfer.utils.get_compute_capability.__wrapped__
    fp4_dynamo_shim.revert()
    undo = polyfill.install(original, lambda device: (8, 0))  # the other library's
    try:
        with caplog.at_level("WARNING", logger=LOGGER):
            layer = _reapply(monkeypatch, "sglang")
        assert layer["registered"] == {} and layer["failed"] == sorted(SGLANG_KEYS)
        for key in SGLANG_KEYS:
            assert layer["not_registered"][key]["kind"] == "failed"
            assert layer["not_registered"][key]["reason"].startswith(
                "polyfill for flashinfer.utils.get_compute_capability: ValueError: "), key
    finally:
        fp4_dynamo_shim.revert()
        undo()
    assert fp4_dynamo_shim.apply()


def test_capabilities_read_at_apply_answer_the_traced_device_query_for_every_visible_gpu(own_layers, monkeypatch):
    """Only the layer's apply asks torch for every GPU's capability; what Dynamo traces for
    ``get_compute_capability`` answers from those: the device's index, the current device for a bare "cuda", and
    FlashInfer's own error for any other device. Stand-ins: two GPUs of different capabilities and the current
    device (1), which a CPU-only torch cannot give."""
    gpus = {0: (9, 0), 1: (10, 0)}
    for index in gpus:  # unknown until apply reads them; the layer's table is as before once the test ends
        monkeypatch.setitem(declared_layer.CAPABILITIES, index, None)
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "device_count", lambda: 2)
        patch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpus[0 if device is None else device])
        layer = own_layers("sglang")
    assert declared_layer.describe(layer)["failed"] == []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    query = flashinfer.utils.get_compute_capability

    def capabilities(x):
        try:
            query(torch.device("cpu"))
        except ValueError as error:
            refused = error.args
        return x + 1, query(torch.device("cuda", 0)), query(torch.device("cuda")), refused

    assert polyfill.is_polyfilled(query.__wrapped__)
    _, first, current, refused = torch.compile(capabilities, fullgraph=True, backend="eager")(torch.zeros(1))
    assert (first, current, refused) == ((9, 0), (10, 0), ("device must be a cuda device",))
