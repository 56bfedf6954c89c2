"""The FP4 layer's per-device record and its seam (fp4/devices.py): what configure() sets, what the seam accepts,
and that it always puts back what it changed."""

from __future__ import annotations

import dataclasses

import pytest

from _fp4_dynamo_shim.fp4 import devices


@pytest.fixture
def saved_state():
    saved = {field.name: getattr(devices.STATE, field.name) for field in dataclasses.fields(devices.DeviceState)}
    yield
    devices.replace(**saved)


def _launcher(direct=None):
    def launch(*arguments):
        pass

    if direct is not None:
        launch.direct = direct
    return launch


def test_configure_sets_every_field_from_what_apply_found(saved_state):
    with_kernel, without = _launcher(direct=("kernel", True)), _launcher()
    launchers, family, mm_fp4 = {0: with_kernel, 1: without, -1: without}, {0: ("namespace", "kernel")}, object()
    devices.configure("row", launchers, family, mm_fp4)
    state = devices.STATE
    assert (state.target, state.launchers, state.direct_kernels, state.family_modules, state.mm_fp4) == (
        "row", launchers, {0: ("kernel", True)}, family, mm_fp4)
    assert state.launchers is not launchers and state.family_modules is not family  # copies: apply owns its own


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
    with_kernel, without = _launcher(direct=("kernel", True)), _launcher()
    devices.configure("row", {0: with_kernel, 1: without, -1: "reference"}, {}, None)
    assert devices.serving_cpu_as(0) == {"launchers": {0: with_kernel, 1: without, -1: with_kernel},
                                         "direct_kernels": {0: ("kernel", True), -1: ("kernel", True)}}
    assert devices.serving_cpu_as(1) == {"launchers": {0: with_kernel, 1: without, -1: without}}
