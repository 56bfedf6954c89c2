"""The FP4 layer's per-device record and its seam (fp4/devices.py): what configure() sets, what the seam accepts,
and that it always puts back what it changed."""

from __future__ import annotations

import dataclasses

import pytest

from _fp4_dynamo_shim.fp4 import devices, kernels


@pytest.fixture
def saved_state():
    saved = {field.name: getattr(devices.STATE, field.name) for field in dataclasses.fields(devices.DeviceState)}
    yield
    devices.replace(**saved)


def _launcher():
    def launch(*arguments):
        pass

    return launch


def _gpu(index, mode="kernel", direct=None, namespace=None):
    """What kernels.load records for one GPU (its LoadedDevice with the fields configure reads)."""
    device = kernels.LoadedDevice(index, f"GPU {index}", (10, 0), "100", True, True, mode)
    return kernels.Gpu(device, _launcher(), direct, namespace)


def test_configure_derives_every_lookup_from_one_record_per_gpu(saved_state):
    with_kernel, without, cpu, mm_fp4 = _gpu(0, direct=("kernel", True), namespace="ns"), _gpu(1, "error"), _launcher(), object()
    devices.configure("row", [with_kernel, without], cpu, mm_fp4)
    state = devices.STATE
    assert (state.target, state.launchers, state.direct_kernels, state.family_modules, state.mm_fp4) == (
        "row", {0: with_kernel.launch, 1: without.launch, -1: cpu}, {0: ("kernel", True)},
        {0: ("ns", "kernel"), 1: (None, "error")}, mm_fp4)


def test_replace_refuses_a_field_the_record_does_not_have_naming_each(saved_state):
    with pytest.raises(TypeError, match=r"^DeviceState has no field launcher, targets$"):
        devices.replace(targets=None, launcher=None)
    previous = devices.STATE.mm_fp4
    assert devices.replace(mm_fp4="new") == {"mm_fp4": previous} and devices.STATE.mm_fp4 == "new"


def test_overridden_puts_the_previous_values_back_even_when_the_block_raises(saved_state):
    devices.replace(target="before", mm_fp4="before")
    with pytest.raises(RuntimeError):
        with devices.overridden(target="during") as state:
            assert state is devices.STATE and state.target == "during" and state.mm_fp4 == "before"
            raise RuntimeError
    assert (devices.STATE.target, devices.STATE.mm_fp4) == ("before", "before")


def test_serving_cpu_as_sends_cpu_tensors_down_one_gpus_paths_and_only_those_it_has(saved_state):
    with_kernel, without = _gpu(0, direct=("kernel", True)), _gpu(1, "reference")
    devices.configure("row", [with_kernel, without], "reference", None)
    launchers = {0: with_kernel.launch, 1: without.launch}
    assert devices.serving_cpu_as(0) == {"launchers": {**launchers, -1: with_kernel.launch},
                                         "direct_kernels": {0: ("kernel", True), -1: ("kernel", True)}}
    assert devices.serving_cpu_as(1) == {"launchers": {**launchers, -1: without.launch}}
