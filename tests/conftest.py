"""Shared fixtures. Tests use real FlashInfer, real torch.compile and real subprocesses; the few
stand-ins (for pieces that need a GPU) say so where they are used."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import site
import sys

import hypothesis
import pytest
import torch

import fp4_dynamo_shim
import helpers
import own_site
import stand_in_gpu
import venvs
from _fp4_dynamo_shim.activation import export, sglang_plugin
from _fp4_dynamo_shim.fp4 import devices
from _fp4_dynamo_shim import lifecycle, switches
from _fp4_dynamo_shim.settings import Settings

if "MUTANT_UNDER_TEST" in os.environ:  # mutmut's run (tools/mutation/run_mutmut.py)
    import mutmut_support
    from mutmut_support import pytest_collection_finish, pytest_runtest_logreport  # noqa: F401  (hooks)

    mutmut_support.install()

# Property tests (tests/fp4/test_properties.py, test_family_matches_the_oracle.py): fixed examples everywhere; "ci" bounds their number, "long" is
# the documented longer run (docs/testing.md). --hypothesis-profile=long picks it.
hypothesis.settings.register_profile("ci", max_examples=12, derandomize=True, deadline=None, database=None,
                                     print_blob=True, suppress_health_check=list(hypothesis.HealthCheck))
hypothesis.settings.register_profile("long", max_examples=400, derandomize=True, deadline=None, database=None,
                                     print_blob=True, suppress_health_check=list(hypothesis.HealthCheck))
# mutmut's run (tools/mutation/run_mutmut.py): the "ci" examples, but a failure is not shrunk or explained (a
# mutant's failing property test spent minutes shrinking; a kill needs one failing example, not the smallest).
hypothesis.settings.register_profile("mutmut", parent=hypothesis.settings.get_profile("ci"), report_multiple_bugs=False,
                                     phases=(hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate))
hypothesis.settings.load_profile("mutmut" if "MUTANT_UNDER_TEST" in os.environ else "ci")


def pytest_configure(config):
    """Each xdist worker takes its share of the cores for torch's threads, and hands it on to the interpreters
    it starts: with torch's default of one thread per core in every worker, the workers' threads wait on each
    other: on 2 cores the README command's pytest took 141 s against 112 s this way (the CPU reference on a
    128 x 2048 input about forty times as long). A user's OMP_NUM_THREADS stands."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_itemcollected(item):
    """Named in the JUnit report too: the FlashInfer matrix reads its installed release's leg from the README
    command's and the slow tier's reports (run_matrix.py --installed-leg-from) and leaves these out, as legs do."""
    if item.get_closest_marker("release_independent"):
        item.user_properties.append(("release_independent", "true"))


def pytest_runtest_setup(item):
    """Only the slow tier builds virtual environments (before this test's fixtures, which build them)."""
    venvs.building_allowed = item.get_closest_marker("slow") is not None


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_applied_shim():
    """Every test starts with the shim applied and an empty Dynamo cache, and leaves it that way."""
    torch._dynamo.reset()
    assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    yield
    torch._dynamo.reset()
    applied = lifecycle._applied
    if applied is not None and applied.settings != Settings.from_environment():
        fp4_dynamo_shim.revert()  # a test changed FP4_DYNAMO_SHIM_* and monkeypatch has put it back
    if not fp4_dynamo_shim.status()["applied"]:
        assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]


@pytest.fixture(autouse=True)
def _own_site_untouched():
    """No test changes the start-up files of this interpreter's own site directories (tests/support/own_site.py)."""
    with own_site.untouched():
        yield


@pytest.fixture
def unpatched():
    """FlashInfer as it is without the shim, for the duration of one test."""
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    fp4_dynamo_shim.apply()


@pytest.fixture
def sites(tmp_path, monkeypatch):
    """Two empty site directories, this interpreter's only ones (no user site, no sitecustomize loaded, no SGLang
    plugin entry point): start-up routes a test writes there are what ``status()["routes"]`` finds. A unique path
    per test, so that a warning naming them is said again (warnings are said once per message)."""
    directories = [tmp_path / "site-a", tmp_path / "site-b"]
    for directory in directories:
        directory.mkdir()
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(d) for d in directories])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    monkeypatch.delitem(sys.modules, "sitecustomize", raising=False)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    return directories


@pytest.fixture
def without_the_export(monkeypatch):
    """This process as if ``import fp4_dynamo_shim`` had exported nothing: ``revert()`` withdraws the export (and
    the shim), and FP4_DYNAMO_SHIM is unset. Afterwards the export is made again, as the import made it."""
    fp4_dynamo_shim.revert()
    monkeypatch.delenv("FP4_DYNAMO_SHIM", raising=False)
    yield
    fp4_dynamo_shim.revert()
    for name in switches.VARIABLES:  # as the import found them (a test may have set any)
        monkeypatch.delenv(name, raising=False)
    lifecycle.apply(route="import", layers=(export,))  # as the import did; monkeypatch then gives the variables back


@pytest.fixture
def said(monkeypatch, caplog):
    """What the shim says from now on, as ``said()``: (level, line) for each line on the project's logger (where
    its warnings and start-up lines go), in order. Every message counts as not yet said (the shim says each
    warning once per process)."""
    from _fp4_dynamo_shim import switches

    monkeypatch.setattr(switches, "warned", set())
    caplog.set_level(logging.INFO, logger="fp4_dynamo_shim")
    caplog.clear()
    return lambda: [(record.levelname, record.getMessage()) for record in caplog.records
                    if record.name == "fp4_dynamo_shim"]


@pytest.fixture
def hook_not_installed(monkeypatch):
    """The start-up hook as a fresh interpreter has it: not installed, no route recorded."""
    from _fp4_dynamo_shim.activation import startup

    monkeypatch.setattr(startup, "_installed", False)
    monkeypatch.setattr(startup, "route", None)


@pytest.fixture
def device_state():
    """``override(**fields)`` changes the FP4 layer's per-device record (``devices.overridden``) until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **fields: stack.enter_context(devices.overridden(**fields))


@pytest.fixture
def sglang_installed(monkeypatch):
    """``use(version)``: this environment as one where SGLang ``version`` is installed (None: none is), as its
    distribution's metadata says; SGLang itself is not importable here."""
    real = importlib.metadata.version

    def use(version):
        def version_of(name):
            if name != "sglang":
                return real(name)
            if version is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return version

        monkeypatch.setattr(importlib.metadata, "version", version_of)

    return use


@pytest.fixture
def applied_with(monkeypatch):
    """``apply(**environment)``: the shim re-applied under these variables (``FLASHINFER_OPS="all"`` names
    ``FP4_DYNAMO_SHIM_FLASHINFER_OPS``; None unsets) with an empty Dynamo cache; returns ``status()``. The
    autouse fixture applies again under the restored environment afterwards."""
    def apply(**environment):
        return helpers.apply_with(monkeypatch, **environment)

    return apply


@pytest.fixture
def target_row(device_state):
    """Temporarily make the op behave like another FlashInfer release's row of the targets table."""
    return lambda target: device_state(target=target)


@pytest.fixture
def kernel_stand_in(device_state):
    """The CPU launcher replaced by one that behaves like FlashInfer's JIT entry towards fake tensors: it reads
    every tensor's data pointer first (which raises for a FakeTensor), then computes with the reference.
    A stand-in because the JIT entry needs a GPU: on the H200 the same tests run with the real entry
    (tests/gpu, FP4_DYNAMO_SHIM_FALLBACK=launch). Counts the calls that reached it."""
    reference = devices.STATE.launchers[-1]
    calls = []

    def kernel_like(*arguments):
        for argument in arguments:
            if isinstance(argument, torch.Tensor):
                argument.data_ptr()
        calls.append(arguments[0].shape)
        return reference(*arguments)

    device_state(launchers={**devices.STATE.launchers, -1: kernel_like})
    return calls


@pytest.fixture
def direct_entry(device_state):
    """CPU tensors take the replacement's direct path to a stand-in for the GPU's JIT entry (it cannot run
    here; ``stand_in_gpu.reference_entry`` says what it does and its limits). Returns the calls it recorded."""
    calls = []
    device_state(**stand_in_gpu.direct_path_on_cpu(stand_in_gpu.reference_entry(calls)))
    return calls


@pytest.fixture
def stand_in_sm100(unpatched, monkeypatch, device_state):
    """FlashInfer's own function runs on CPU tensors as on an SM100 GPU whose JIT module records its calls
    (tests/support/stand_in_gpu.py says what is stood in). Yields (FlashInfer's module, the recorder, apply):
    ``apply(plugin=False)`` applies the shim (or runs SGLang's plugin entry) on that GPU and sends CPU tensors
    down its paths."""
    recorder = stand_in_gpu.RecordingModule()
    stand_in_gpu.install_sm100(monkeypatch.setattr, recorder)
    module = stand_in_gpu.fp4_module()

    def apply(plugin=False):
        if plugin:
            sglang_plugin.plugin()
        else:
            assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
        assert fp4_dynamo_shim.status()["devices"][0]["mode"] == "kernel"
        device_state(**devices.serving_cpu_as(0))
        return True

    yield module, recorder, apply
    fp4_dynamo_shim.revert()
    module.get_fp4_quantization_module.cache_clear()
