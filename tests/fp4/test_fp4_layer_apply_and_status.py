"""The FP4 layer as one record: what ``fp4_layer.patch`` hands each of its steps, what it leaves behind when a
step fails, and the words its ``skipped()`` and ``describe()`` give ``status()`` for each kind of GPU.

The layer is applied here the way ``apply()`` applies it (the installed release's version, its row of
the targets table, the module that defines ``fp4_quantize``, a fallback), with FlashInfer as it is without the
shim (the ``unpatched`` fixture), and undone by ``layer.undo()`` before the test ends. There is no GPU here:
where a test needs one, its docstring names what is stood in.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types

import pytest
import torch

from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.errors import ApplyError
from _fp4_dynamo_shim.fp4 import devices, family, family_ops, flashinfer_op, kernels, quantize_op, fp4_releases, replacement
from _fp4_dynamo_shim.fp4 import fp4_layer
from nvfp4_inputs import nvfp4_input
import stand_in_gpu

VERSION = lifecycle.flashinfer_version()
TARGET = fp4_releases.target_for(VERSION)
OP_KEY = "torch.ops.flashinfer.fp4_quantize"
NO_GPU = "JIT build/load: no GPU visible (CPU tensors use the reference quantizer)"


def fp4_module():
    """FlashInfer's module that defines ``fp4_quantize``, as ``apply()`` imports it."""
    return importlib.import_module(TARGET.module)


def flashinfer_functions() -> dict:
    """Every callable module global of FlashInfer's modules, by (module, name): where the layer rebinds."""
    return {(name, key): value for name, module in list(sys.modules.items())
            if name == "flashinfer" or name.startswith("flashinfer.")
            for key, value in list(vars(module).items()) if callable(value)}


def changed_since(before: dict) -> list:
    after = flashinfer_functions()
    return sorted(f"{module}.{name}" for (module, name), value in before.items() if after.get((module, name)) is not value)


def four_over_six(function_name="fp4_quantize"):
    """(FlashInfer's 4over6 recipe with every code bit set, its code) where the release's ``function_name`` takes
    ``nvfp4_4over6`` (0.7.1+); the test is skipped elsewhere."""
    if "nvfp4_4over6" not in inspect.signature(getattr(fp4_module(), function_name)).parameters:
        pytest.skip(f"this FlashInfer's {function_name} has no nvfp4_4over6 (before 0.7.1)")
    utils = importlib.import_module("flashinfer.quantization.nvfp4_quantization_utils")
    recipe = utils.NVFP44Over6Config(e4m3_max=256, err_mode="MSE", err_use_fast_math=True)
    return recipe, utils.nvfp4_4over6_code(recipe)


def same(got, want) -> bool:
    return all(g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w) for g, w in zip(got, want))


# --- skipped() and describe(): status()'s words per GPU -----------------------------------------------------------
# Stand-ins: LoadedDevice records as kernels.load() makes them for GPUs this machine does not have (the mode is
# what load() gives each for the fallback named beside it). Only the records are stood in; the words are the
# layer's own. On a real GPU, load() makes the record (tests/gpu checks its mode).
B200 = kernels.LoadedDevice(0, "NVIDIA B200", (10, 0), "100", True, True, "kernel", 2.5)
H200 = kernels.LoadedDevice(1, "NVIDIA H200", (9, 0), "90", False, True, "error", 1.25)  # FALLBACK=error
L40S = kernels.LoadedDevice(2, "NVIDIA L40S", (8, 9), "89", False, False, "reference", None)  # FALLBACK=reference
H100 = kernels.LoadedDevice(3, "NVIDIA H100", (9, 0), "90", False, True, "launch", 1.5)  # FALLBACK=launch
REFUSING = ("cuda:1 NVIDIA H200 SM90: no FP4 kernel below SM100, calls raise "
            "(FP4_DYNAMO_SHIM_FALLBACK=reference runs the reference quantizer there)")
ON_THE_REFERENCE = "cuda:2 SM89: FlashInfer kernel not used, reference quantizer runs"

SKIPPED = [
    ("no GPU", [], [NO_GPU]),
    ("SM100 with the kernel", [B200], []),
    ("SM90 refusing", [H200], [REFUSING]),
    ("SM89 on the reference quantizer", [L40S], [ON_THE_REFERENCE]),
    ("SM90 launching the empty kernel", [H100], []),
    ("one of each, in device order", [B200, H200, L40S, H100], [REFUSING, ON_THE_REFERENCE]),
    ("the same, listed the other way round", [H100, L40S, H200, B200], [ON_THE_REFERENCE, REFUSING]),
]


@pytest.mark.parametrize("loaded, words", [case[1:] for case in SKIPPED], ids=[case[0] for case in SKIPPED])
def test_skipped_names_each_gpu_the_kernel_does_not_serve_and_why(loaded, words):
    """Only a GPU that refuses or runs the reference gets a line; no GPU at all gets the CPU line and nothing else.
    (Stand-ins: the LoadedDevice records above.)"""
    assert fp4_layer.Fp4Layer(TARGET, devices=list(loaded)).skipped() == words


def test_describe_gives_status_every_key_of_the_layer():
    """status() indexes these keys without guarding. (Stand-ins: an SM100 B200 with the kernel and an SM90 H200
    refusing, as LoadedDevice records.)"""
    report = {"nvfp4_quantize": "op-backed (a module)", OP_KEY: "repaired while applied (words)"}
    layer = fp4_layer.Fp4Layer(TARGET, devices=[B200, H200], family=report)
    described = layer.describe()
    assert described == {
        "target": fp4_releases.describe(TARGET),
        "op": "fp4_dynamo_shim::fp4_quantize",
        "family": {"nvfp4_quantize": "op-backed (a module)", OP_KEY: "repaired while applied (words)"},
        "devices": [
            {"index": 0, "name": "NVIDIA B200", "capability": (10, 0), "backend": "100", "has_fp4_kernel": True,
             "enable_pdl": True, "mode": "kernel", "load_seconds": 2.5},
            {"index": 1, "name": "NVIDIA H200", "capability": (9, 0), "backend": "90", "has_fp4_kernel": False,
             "enable_pdl": True, "mode": "error", "load_seconds": 1.25},
        ],
        "skipped": [REFUSING],
    }
    described["family"]["nvfp4_quantize"] = "changed by a caller"
    assert layer.family["nvfp4_quantize"] == "op-backed (a module)"  # status() hands out a copy


def test_status_carries_the_applied_layers_description():
    """status() is where these words reach users: the FP4 layer's keys verbatim, its skipped lines first."""
    described, status = lifecycle._applied.record(fp4_layer.Fp4Layer).describe(), lifecycle.status()
    assert {key: status[key] for key in ("target", "op", "family", "devices")} == {
        key: described[key] for key in ("target", "op", "family", "devices")}
    assert status["skipped"][:len(described["skipped"])] == described["skipped"]
    if kernels.visible_device_count() == 0:
        assert status["devices"] == [] and status["skipped"][0] == NO_GPU


# --- apply(): refusing, and undoing a failed step ------------------------------------------------------------------
def test_applying_over_a_replacement_raises_apply_error_and_changes_nothing(device_state):
    """The shim is applied (the autouse fixture): FlashInfer's fp4_quantize is already its replacement."""
    device_state(**{field.name: getattr(devices.STATE, field.name) for field in dataclasses.fields(devices.DeviceState)})
    module, before = fp4_module(), flashinfer_functions()
    try:
        layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    except ApplyError as error:
        assert str(error) == f"{TARGET.module}.fp4_quantize is already a fp4_dynamo_shim replacement"
    else:
        layer.undo()
        pytest.fail("apply() wrapped its own replacement")
    assert changed_since(before) == []


class Interrupted(BaseException):
    """Not an Exception (as KeyboardInterrupt is not): the layer undoes its steps for these too."""


FAILING_STEPS = [("kernels", "load"), ("devices", "configure"), ("flashinfer_op", "repair")]


@pytest.mark.parametrize("error_type", [RuntimeError, Interrupted])
@pytest.mark.parametrize("module_name, step", FAILING_STEPS, ids=[f"{m}.{s}" for m, s in FAILING_STEPS])
def test_a_failing_step_leaves_flashinfer_exactly_as_it_was_and_raises_its_own_error(
        unpatched, monkeypatch, module_name, step, error_type):
    """Stand-in: the step itself, replaced by one that raises (a JIT build failing on a GPU, a broken registration).
    The repair comes after the rebinding, so its failure shows the rebinding undone too."""
    error = error_type(f"{step} failed")

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(getattr(fp4_layer, module_name), step, failing)
    module, before = fp4_module(), flashinfer_functions()
    original = module.fp4_quantize
    try:
        layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    except error_type as raised:
        assert raised is error
    else:
        layer.undo()
        pytest.fail(f"apply() went on past the failing {module_name}.{step}")
    assert module.fp4_quantize is original and not replacement.is_shim(module.fp4_quantize)
    assert changed_since(before) == []


# --- apply(): what it hands each step -------------------------------------------------------------------------------
def test_a_stood_in_sm90_is_loaded_with_the_fallback_and_its_launcher_configured(unpatched, monkeypatch):
    """FP4_DYNAMO_SHIM_FALLBACK=reference on an SM90: the GPU runs the shim's reference quantizer, CPU tensors too,
    FlashInfer's module for it is kept for the family, and the ops get FlashInfer's own mm_fp4 to call.
    Stand-ins: one visible GPU answering as an H200 (capability 9.0), and FlashInfer's get_fp4_quantization_module
    returning a placeholder namespace for it (building the real one needs nvcc and the GPU). kernels.load and
    devices.configure are the real ones."""
    module = fp4_module()
    mm_fp4 = importlib.import_module("flashinfer.gemm").mm_fp4
    namespace, asked = object(), []

    def get_fp4_quantization_module(backend):
        asked.append(backend)
        return namespace

    monkeypatch.setattr(module, "get_fp4_quantization_module", get_fp4_quantization_module)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "stand-in H200")
    layer = fp4_layer.patch(VERSION, TARGET, module, "reference")
    try:
        assert asked == ["90"]
        (device,) = layer.devices
        assert device == kernels.LoadedDevice(0, "stand-in H200", (9, 0), "90", False, True, "reference",
                                              device.load_seconds)
        assert isinstance(device.load_seconds, float)
        assert devices.STATE.target is TARGET
        assert devices.STATE.launchers == {0: quantize_op.launch_reference, -1: quantize_op.launch_reference}
        assert devices.STATE.direct_kernels == {}
        assert devices.STATE.family_modules == {0: (namespace, "reference")}
        op_backed = layer.family.get("mm_fp4", "").startswith("op-backed")
        assert devices.STATE.mm_fp4 is (mm_fp4 if op_backed else None)
        assert layer.skipped() == ["cuda:0 SM90: FlashInfer kernel not used, reference quantizer runs"]
    finally:
        layer.undo()


def test_an_mm_fp4_the_release_leaves_alone_is_not_handed_to_the_ops(unpatched, monkeypatch):
    """Stand-in: family.build_replacements, wrapped so that it reports mm_fp4 as left alone (what it does when it
    cannot mirror the signature) instead of replacing it. The ops then have no mm_fp4 to call, and FlashInfer's
    stays where it is."""
    build_replacements = family.build_replacements

    def without_mm_fp4(*args):
        replaced, report = build_replacements(*args)
        replaced.pop("mm_fp4", None)
        report["mm_fp4"] = "left alone: stood in"
        return replaced, report

    monkeypatch.setattr(family, "build_replacements", without_mm_fp4)
    gemm = importlib.import_module("flashinfer.gemm")
    mm_fp4 = gemm.mm_fp4
    layer = fp4_layer.patch(VERSION, TARGET, fp4_module(), "error")
    try:
        assert devices.STATE.mm_fp4 is None
        assert layer.family["mm_fp4"] == "left alone: stood in" and gemm.mm_fp4 is mm_fp4
        assert replacement.is_shim(fp4_module().fp4_quantize)
    finally:
        layer.undo()


def test_the_family_report_is_the_releases_members_and_says_what_was_rebound(unpatched):
    """Every member of this release is reported, and each one reported op-backed is the shim's function in the
    module the report names."""
    layer = fp4_layer.patch(VERSION, TARGET, fp4_module(), "error")
    try:
        members = {member.name for member in family.members_for(VERSION)}
        assert set(layer.family) - {OP_KEY} == members
        for name, words in layer.family.items():
            if words.startswith("op-backed ("):
                module_name = words[len("op-backed ("):-1]
                assert replacement.is_shim(getattr(importlib.import_module(module_name), name)), name
    finally:
        layer.undo()


def test_the_installed_replacement_takes_the_direct_path_for_the_common_call(unpatched, device_state):
    """The replacement is built for the release's row of the targets table, which is what gives it the direct
    path to a GPU's JIT entry. Stand-in: that entry (``stand_in_gpu.reference_entry``: records the call, fills
    the buffers with the reference's bytes), reached by CPU tensors."""
    module = fp4_module()
    layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    try:
        calls = []
        device_state(**stand_in_gpu.direct_path_on_cpu(stand_in_gpu.reference_entry(calls)))
        x, scale = nvfp4_input(rows=4, columns=64)
        # FlashInfer's 4over6 sentinel (0.7.1+) sends a call down the general path; None is the common call.
        common = {"nvfp4_4over6": None} if "nvfp4_4over6" in inspect.signature(module.fp4_quantize).parameters else {}
        module.fp4_quantize(x, scale, **common)
        assert calls == [((4, 64), (4, 32), (128, 4))]
    finally:
        layer.undo()


def test_the_family_quantizes_through_the_layers_fp4_quantize(unpatched):
    """nvfp4_quantize's replacement calls the fp4_quantize replacement built in the same apply() (FlashInfer's own
    function has no CPU kernel): same bytes as calling that replacement."""
    module = fp4_module()
    layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    try:
        x, scale = nvfp4_input(rows=4, columns=64)
        assert same(module.nvfp4_quantize(x, scale), module.fp4_quantize(x, scale))
    finally:
        layer.undo()


# --- apply(): FlashInfer's own op -----------------------------------------------------------------------------------
def test_the_ops_repair_is_undone_with_the_layer_and_reported(unpatched):
    """Where the release has FlashInfer's op, the layer repairs it (on CPU tensors it runs, through the shim's
    reference) and reports it under the op's name; undo() gives FlashInfer's op its own kernel back, which needs
    a GPU."""
    if TARGET.flashinfer_op is None or not flashinfer_op.flashinfer_has_op():
        pytest.skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
    module = fp4_module()
    x, scale = nvfp4_input(rows=4, columns=64)
    layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    try:
        assert layer.family[OP_KEY] == flashinfer_op.describe(TARGET)
        torch.ops.flashinfer.fp4_quantize(x, scale, 16, False, True, False, None)
    finally:
        layer.undo()
    assert not replacement.is_shim(module.fp4_quantize)
    with pytest.raises(Exception, match="cuda"):
        torch.ops.flashinfer.fp4_quantize(x, scale, 16, False, True, False, None)


def test_a_release_with_nothing_to_repair_reports_no_op_and_keeps_no_restorer(unpatched, monkeypatch):
    """Stand-in: FlashInfer's op library without the op, as a release before 0.6.12 has it."""
    monkeypatch.setattr(torch.ops, "flashinfer", types.SimpleNamespace())
    layer = fp4_layer.patch(VERSION, TARGET, fp4_module(), "error")
    try:
        assert OP_KEY not in layer.family and len(layer.undo_steps) == 1  # the rebinding's undo alone
    finally:
        layer.undo()


def test_the_repaired_op_follows_its_own_4over6_code(unpatched):
    """The op's kernel is built from FlashInfer's module and the release's 4over6 recipe: the code the op is called
    with is the recipe the launch gets, as FlashInfer's function with that recipe."""
    if not flashinfer_op.flashinfer_has_op() or TARGET.flashinfer_op is None:
        pytest.skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
    recipe, code = four_over_six()
    module = fp4_module()
    layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    try:
        x, scale = nvfp4_input()
        with_code = torch.ops.flashinfer.fp4_quantize(x, scale, 16, False, True, False, None, code)
        assert same(with_code, module.fp4_quantize(x, scale, nvfp4_4over6=recipe))
        assert not same(with_code, module.fp4_quantize(x, scale, nvfp4_4over6=None))  # the recipe shows in the bytes
    finally:
        layer.undo()


def test_the_batched_family_member_follows_the_4over6_recipe_it_is_given(unpatched):
    """nvfp4_batched_quantize hands its op the code of the recipe the caller passed, as FlashInfer's does."""
    recipe, code = four_over_six("nvfp4_batched_quantize")
    module = fp4_module()
    layer = fp4_layer.patch(VERSION, TARGET, module, "error")
    try:
        x, scale = nvfp4_input(rows=8, columns=64, layout="3-D")
        got = module.nvfp4_batched_quantize(x, scale, nvfp4_4over6=recipe)
        assert same(got, family_ops.op("fp4_batched_quantize")(x, scale, 16, False, code))
        assert not same(got, module.nvfp4_batched_quantize(x, scale, nvfp4_4over6=None))
    finally:
        layer.undo()
