"""verify's worker check in this process: the verdict for every combination of what the two probe workers
report, what the probe reports, and what the check hands its probes and concludes.

The slow tier (``test_worker_check.py``) runs the check as users do, with real spawned children in a venv
with SGLang 0.5.9. Those children are the only place the probe runs there, and a child runs the module as
installed, not the changed code a generated mutant puts in this process. So here the probe's body runs in
this process against a list standing in for the queue, and the check runs with its two children replaced by
the reports they would send; what the stand-in cannot show (that spawn really runs no code of the parent's,
that a .pth really reaches a child) stays the slow tier's.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import re
import sys
import types

import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle, switches
from _fp4_dynamo_shim.verify import workers
from _fp4_dynamo_shim.verify.checks import Skip

SEE = 'see docs/usage.md, "Is it active in my SGLang workers?"'
NOT_APPLIED = {"active": False}
BY_PTH = {"active": True, "activated_by": "pth"}
START_WITH_THE_VARIABLE = ("Start the launch with FP4_DYNAMO_SHIM=1 (checked above: that works), or run "
                           f"`fp4-dynamo-shim install-hook`; {SEE}")


def _plain_launch_says(report):
    """What verify's worker line says of the plain launch's worker that sent ``report``."""
    line = workers.worker_verdict(report, BY_PTH, [], None)[1]
    return line[len("plain launch (this environment): "):line.index("; with FP4_DYNAMO_SHIM=1")]


@pytest.mark.parametrize("route, words", sorted(workers.ACTIVATED_BY.items()))
def test_each_route_a_worker_names_is_said_in_words(route, words):
    assert _plain_launch_says({"active": True, "activated_by": route}) == "applied by " + words


def test_a_route_the_check_does_not_know_and_a_failed_probe_are_said_as_they_are():
    assert _plain_launch_says({"active": True, "activated_by": "import"}) == "applied by import"
    assert _plain_launch_says({"active": False}) == "NOT applied"
    assert _plain_launch_says({"active": False, "error": "ImportError: x"}) == "NOT applied (ImportError: x)"


def test_a_plain_launch_whose_worker_has_the_shim_passes_whatever_sglang_needs():
    assert workers.worker_verdict(BY_PTH, BY_PTH, ["an always-on hook (/x.pth)"], "0.5.9") == (True, (
        "plain launch (this environment, an always-on hook (/x.pth)): applied by the package's .pth hook; "
        "with FP4_DYNAMO_SHIM=1: applied by the package's .pth hook; sglang 0.5.9 needs the shim in its "
        "schedulers (piecewise CUDA graph off unless --enable-piecewise-cuda-graph) and loads no plugins "
        "(before 0.5.11)"))


def test_no_route_to_a_worker_fails_even_where_nothing_asks_for_the_shim():
    passed, line = workers.worker_verdict(NOT_APPLIED, {"active": False, "error": "E: e"}, [], None)
    assert not passed
    assert line == ("plain launch (this environment): NOT applied; with FP4_DYNAMO_SHIM=1: NOT applied (E: e); "
                    "sglang not installed. No route reaches a spawned worker here (a .pth runs only from an "
                    "installed package, not from PYTHONPATH): install the package with pip (wheel or -e) or run "
                    f"`fp4-dynamo-shim install-hook`; {SEE}")


def test_what_asks_for_the_shim_is_named_and_fails_the_plain_launch_on_an_sglang_that_does_not_need_it():
    asked = ["FP4_DYNAMO_SHIM='2' (not understood)", "an always-on hook (/x.pth)"]
    assert workers.worker_verdict(NOT_APPLIED, BY_PTH, asked, "0.5.14") == (False, (
        "plain launch (this environment, FP4_DYNAMO_SHIM='2' (not understood) and an always-on hook (/x.pth)): "
        "NOT applied; with FP4_DYNAMO_SHIM=1: applied by the package's .pth hook; sglang 0.5.14 does not need "
        "it on a plain launch (tc_piecewise prefill graphs on by default; FlashInfer's FP4 calls are not traced "
        f"raw there). {START_WITH_THE_VARIABLE}"))


def test_without_sglang_and_with_nothing_asking_a_plain_launch_without_the_shim_passes():
    assert workers.worker_verdict(NOT_APPLIED, BY_PTH, [], None) == (True, (
        "plain launch (this environment): NOT applied; with FP4_DYNAMO_SHIM=1: applied by the package's .pth "
        "hook; sglang not installed; nothing here asks a plain launch for the shim"))


def test_the_probe_reports_whether_flashinfer_in_its_process_is_patched_and_by_which_route():
    sent = []

    class Queue:
        put = sent.append

    workers.probe_worker(Queue())
    assert sent == [{"hook_route": sent[0]["hook_route"], "plugin_ran": False,
                     "active": True, "activated_by": lifecycle.status()["activated_by"]}]
    assert sent[0]["activated_by"] is not None


def test_the_probe_reports_an_unpatched_flashinfer_and_a_failed_plugin_load(unpatched):
    sent = []

    class Queue:
        put = sent.append

    workers.probe_worker(Queue())
    assert sent[-1] == {"hook_route": sent[0]["hook_route"], "plugin_ran": False,
                        "active": False, "activated_by": lifecycle.status()["activated_by"]}
    try:
        import sglang.srt.plugins  # noqa: F401
    except ImportError as error:
        workers.probe_worker(Queue(), run_sglang_plugins=True)
        assert sent[-1] == {"hook_route": sent[0]["hook_route"], "plugin_ran": False, "active": False,
                            "error": f"{type(error).__name__}: {error}"}
    else:
        pytest.skip("SGLang is installed here: the failed plugin load needs it absent")


def test_the_probe_names_the_start_up_hooks_route(monkeypatch):
    sent = []

    class Queue:
        put = sent.append

    monkeypatch.setitem(sys.modules, "_fp4_dynamo_shim.activation.startup", types.SimpleNamespace(route="sitecustomize"))
    workers.probe_worker(Queue())
    assert sent[0]["hook_route"] == "sitecustomize"


@pytest.fixture
def sglang_plugins(monkeypatch):
    """A stand-in for ``sglang.srt.plugins`` (SGLang is not installed here, and the slow tier's SGLang 0.5.9
    loads no plugins): its ``load_plugins`` runs the shim's own plugin entry, as SGLang >= 0.5.11's does."""
    from _fp4_dynamo_shim.activation import sglang_plugin

    loaded = []

    def load_plugins():
        loaded.append(True)
        sglang_plugin.plugin()

    for name, module in (("sglang", types.ModuleType("sglang")), ("sglang.srt", types.ModuleType("sglang.srt")),
                         ("sglang.srt.plugins", types.SimpleNamespace(load_plugins=load_plugins))):
        monkeypatch.setitem(sys.modules, name, module)
    return loaded


def test_the_probe_loads_sglangs_plugins_only_where_flashinfer_is_not_patched_yet(unpatched, sglang_plugins):
    sent = []

    class Queue:
        put = sent.append

    workers.probe_worker(Queue(), run_sglang_plugins=True)
    assert sglang_plugins == [True]
    assert {key: sent[0][key] for key in ("plugin_ran", "active", "activated_by")} == {
        "plugin_ran": True, "active": True, "activated_by": "plugin"}
    workers.probe_worker(Queue(), run_sglang_plugins=True)
    assert sglang_plugins == [True] and sent[1]["plugin_ran"] is False and sent[1]["active"] is True


def test_a_plugin_load_that_does_not_apply_the_shim_reports_it_inactive(unpatched, sglang_plugins, monkeypatch):
    monkeypatch.setattr(sys.modules["sglang.srt.plugins"], "load_plugins", lambda: sglang_plugins.append(False))
    sent = []

    class Queue:
        put = sent.append

    workers.probe_worker(Queue(), run_sglang_plugins=True)
    assert sglang_plugins == [False]
    assert {key: sent[0].get(key) for key in ("plugin_ran", "active", "error")} == {
        "plugin_ran": True, "active": False, "error": None}


class SpawnContext:
    """Stands in for ``multiprocessing.get_context("spawn")``: its Process records the environment and ``__main__``
    it was started with (what a spawned child copies) and its Queue answers with the next of ``reports``."""

    def __init__(self, reports):
        self.reports, self.started, self.waits = list(reports), [], []

    def get_start_method(self):
        return "spawn"

    def Queue(self):
        context = self

        class Queue:
            def get(self, timeout):
                context.waits.append(("get", timeout))
                return context.reports[self.index]

        return Queue()

    def Process(self, target, args):
        context = self

        class Process:
            def start(self):
                queue, run_plugins = args
                queue.index = len(context.started)
                context.started.append((dict(os.environ), run_plugins, sys.modules["__main__"].__name__))
                assert target is workers.probe_worker

            def join(self, timeout):
                context.waits.append(("join", timeout))

        return Process()


@pytest.fixture
def probes(sites, without_the_export, monkeypatch):
    """The check in a process whose import exported nothing, with its two spawned children stood in (``probes``:
    a SpawnContext answering with ``probes.reports``, plain launch first), SGLang's installed version set with
    ``probes.sglang`` and start-up routes written to ``sites``."""
    context = SpawnContext([NOT_APPLIED, BY_PTH])
    context.sglang = "0.5.9"
    version = importlib.metadata.version

    def installed(name):
        if name != "sglang":
            return version(name)
        if context.sglang is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return context.sglang

    monkeypatch.setattr(multiprocessing, "get_context", lambda method: context)
    monkeypatch.setattr(importlib.metadata, "version", installed)
    return context


def plugin_installed(monkeypatch, installed=True):
    entry = importlib.metadata.EntryPoint("fp4_dynamo_shim", "_fp4_dynamo_shim.activation.sglang_plugin:plugin",
                                          "sglang.srt.plugins")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [entry] if installed else [])


def test_the_check_waits_for_each_probe_ten_minutes_and_for_its_exit_one(probes):
    with pytest.raises(AssertionError):
        workers.check_worker_activation("cpu")
    assert probes.waits == [("get", 600), ("join", 60)] * 2


def test_the_check_starts_a_plain_launch_as_the_user_set_it_and_one_with_the_variable(probes, monkeypatch):
    monkeypatch.setenv("SOMETHING_OF_THE_USERS", "kept")
    with pytest.raises(AssertionError) as failed:
        workers.check_worker_activation("cpu")
    (plain, plain_plugins, main), (with_variable, variable_plugins, _) = probes.started
    assert plain == dict(os.environ) and plain["SOMETHING_OF_THE_USERS"] == "kept" and switches.HOOK not in plain
    assert with_variable == {**plain, switches.HOOK: "1"}
    assert plain_plugins is variable_plugins is False  # 0.5.9 loads no plugins
    assert main == "__main__"  # a blank one: the child must not re-run this process's main module
    assert str(failed.value) == workers.worker_verdict(NOT_APPLIED, BY_PTH, [], "0.5.9")[1]


@pytest.mark.parametrize("version, runs_plugins", [("0.5.11", True), ("0.5.9", False), ("0.5.24", False),
                                                   (None, False)])
def test_the_probes_load_sglangs_plugins_where_the_release_does_and_the_plugin_is_installed(
        probes, version, runs_plugins, monkeypatch):
    probes.sglang = version
    probes.reports = [BY_PTH, BY_PTH]
    plugin_installed(monkeypatch)
    workers.check_worker_activation("cpu")
    assert [plugins for _, plugins, _ in probes.started] == [runs_plugins, runs_plugins]
    probes.started.clear()
    plugin_installed(monkeypatch, installed=False)
    workers.check_worker_activation("cpu")
    assert [plugins for _, plugins, _ in probes.started] == [False, False]


@pytest.mark.parametrize("value, hook, asked", [
    ("1", False, ["FP4_DYNAMO_SHIM='1'"]),
    ("2", False, ["FP4_DYNAMO_SHIM='2' (not understood)"]),
    ("0", False, []),
    (None, True, ["an always-on hook ({hook})"]),
    ("1", True, ["FP4_DYNAMO_SHIM='1'", "an always-on hook ({hook})"]),
])
def test_what_asks_a_plain_launch_for_the_shim_is_read_from_the_users_environment_and_hooks(
        probes, sites, monkeypatch, value, hook, asked):
    if value is not None:
        monkeypatch.setenv(switches.HOOK, value)
    if hook:
        (sites[1] / "fp4_dynamo_shim_hook.pth").write_text("import fp4_dynamo_shim_hook\n")
        asked = [line.format(hook=sites[1] / "fp4_dynamo_shim_hook.pth") for line in asked]
    probes.sglang = "0.5.14"
    if asked:
        with pytest.raises(AssertionError, match="Start the launch") as failed:
            workers.check_worker_activation("cpu")
        assert str(failed.value) == workers.worker_verdict(NOT_APPLIED, BY_PTH, asked, "0.5.14")[1]
    else:
        assert workers.check_worker_activation("cpu") == workers.worker_verdict(NOT_APPLIED, BY_PTH, [], "0.5.14")[1]


def test_a_sitecustomize_hook_counts_as_an_always_on_hook(probes, sites, monkeypatch):
    probes.sglang = "0.5.14"
    custom = types.ModuleType("sitecustomize")
    custom.__file__ = str(sites[0] / "sitecustomize.py")
    (sites[0] / "sitecustomize.py").write_text("import fp4_dynamo_shim_hook; fp4_dynamo_shim_hook.install()\n")
    monkeypatch.setitem(sys.modules, "sitecustomize", custom)
    with pytest.raises(AssertionError, match=f"this environment, an always-on hook \\({re.escape(custom.__file__)}\\)"):
        workers.check_worker_activation("cpu")


def test_under_the_kill_switch_the_check_is_skipped_and_starts_nothing(probes, monkeypatch):
    monkeypatch.setenv("FP4_DYNAMO_SHIM_DISABLE", "1")
    with pytest.raises(Skip, match="^FP4_DYNAMO_SHIM_DISABLE=1: workers do not apply the shim, as asked$"):
        workers.check_worker_activation("cpu")
    assert probes.started == []


@pytest.mark.slow
def test_two_workers_spawned_for_real_report_back_what_their_interpreters_did(without_the_export):
    """Two real spawned children (the slow tier runs the whole check in a venv, out of reach of a generated mutant
    of the check): a child runs only its start-up hooks, as SGLang's schedulers do, so FP4_DYNAMO_SHIM=1 applies the
    shim there through the package's .pth, and without it only an always-on hook would."""
    routes = fp4_dynamo_shim.status()["routes"]
    if not routes["pth"]:
        pytest.skip("the package's .pth is not installed in this environment (run from a pip install)")
    try:
        line = workers.check_worker_activation("cpu")
    except AssertionError as failed:  # an SGLang here that needs the shim fails a plain launch: the line is the same
        line = str(failed)
    assert "; with FP4_DYNAMO_SHIM=1: applied by the package's .pth hook;" in line
    always_on = bool(routes["hook_pth"] or routes["sitecustomize"])
    assert line.startswith("plain launch (this environment): NOT applied;") is not always_on, line
