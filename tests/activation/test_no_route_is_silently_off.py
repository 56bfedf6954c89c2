"""No route may be silently off: editable and Debian installs, the kill switch, strict mode, unknown values,
status()'s shape, revert, and verify's worker-activation check.

Real virtual environments throughout (built once per test run): an editable install made by
``pip install -e`` (with build isolation, as a user gets it), a venv of Debian's ``/usr/bin/python3.11``
(whose ``/usr/lib/python3.11/sitecustomize.py`` shadows any in the venv), and a venv where the package is
only on ``PYTHONPATH`` (as ``pip install --target`` leaves it), where no start-up hook can run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
import venvs
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim import settings
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.activation import sglang_plugin
from _fp4_dynamo_shim.activation import startup
from fp4_dynamo_shim.errors import ApplyError
from helpers import SRC, run_python

DEBIAN_PYTHON = "/usr/bin/python3.11"
DEBIAN_SITECUSTOMIZE = Path("/usr/lib/python3.11/sitecustomize.py")
PATCHED = "import flashinfer; print(getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False))"
VERIFY = ["-m", "fp4_dynamo_shim.verify", "--json", "--device", "cpu"]


def checks(result) -> dict:
    document = json.loads(result.stdout)
    return {check["name"]: check for check in document["checks"]}


@pytest.fixture(scope="session")
def editable(tmp_path_factory) -> venvs.Environment:
    return venvs.create(tmp_path_factory.mktemp("editable"), editable=True)


@pytest.fixture(scope="session")
def debian(tmp_path_factory) -> venvs.Environment:
    if not (os.path.exists(DEBIAN_PYTHON) and DEBIAN_SITECUSTOMIZE.exists()):
        pytest.skip(f"{DEBIAN_PYTHON} is not a Debian-style build with {DEBIAN_SITECUSTOMIZE}")
    return venvs.create(tmp_path_factory.mktemp("debian"), python=DEBIAN_PYTHON)


@pytest.fixture(scope="session")
def path_only(tmp_path_factory) -> venvs.Environment:
    """A venv without the package; the package comes from PYTHONPATH, where .pth files are never read."""
    return venvs.create(tmp_path_factory.mktemp("path_only"), with_project=False)


# --- every ordinary install runs the hook ---------------------------------------------------------------

@pytest.mark.slow
def test_an_editable_install_carries_the_hook_and_a_spawned_worker_applies_the_shim(editable):
    assert (editable.site / "fp4_dynamo_shim.pth").exists()
    assert editable.run(PATCHED, env={"FP4_DYNAMO_SHIM": "1"}).stdout.strip() == "True"
    result = editable.command(VERIFY, env={"FP4_DYNAMO_SHIM": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    worker = checks(result)["worker-activation"]
    assert worker["result"] == "pass" and "pth" in worker["detail"], worker


@pytest.mark.slow
def test_install_hook_in_a_debian_python_venv_writes_a_pth_that_runs(debian):
    installed = debian.command(["-m", "fp4_dynamo_shim", "install-hook"])
    assert installed.returncode == 0, installed.stderr
    assert "pth route" in installed.stdout and (debian.site / "fp4_dynamo_shim_hook.pth").exists()
    assert debian.run(PATCHED).stdout.strip() == "True"  # no variable: the installed hook is always on
    removed = debian.command(["-m", "fp4_dynamo_shim", "uninstall-hook"])
    assert removed.returncode == 0 and not (debian.site / "fp4_dynamo_shim_hook.pth").exists()
    assert debian.run(PATCHED).stdout.strip() == "False"


@pytest.mark.slow
def test_a_sitecustomize_that_a_system_file_shadows_is_refused_and_named(debian):
    result = debian.command(["-m", "fp4_dynamo_shim", "install-hook", "--sitecustomize"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert str(DEBIAN_SITECUSTOMIZE) in result.stderr and "fp4-dynamo-shim install-hook" in result.stderr
    assert not (debian.site / "sitecustomize.py").exists()  # taken back out
    assert debian.run(PATCHED).stdout.strip() == "False"


@pytest.mark.slow
def test_where_no_hook_can_run_the_import_warns_and_verify_fails_the_worker_check(path_only):
    environment = {"PYTHONPATH": SRC, "FP4_DYNAMO_SHIM": "1"}
    imported = path_only.run("import fp4_dynamo_shim", env={"PYTHONPATH": SRC})
    assert "no import hook is installed" in imported.stderr and "spawned workers" in imported.stderr
    result = path_only.command(VERIFY, env=environment)
    assert result.returncode == 1, result.stdout[-2000:]
    worker = checks(result)["worker-activation"]
    assert worker["result"] == "fail" and "plain launch (this environment, FP4_DYNAMO_SHIM='1'): NOT applied" in worker["detail"], worker


# --- one switch stops everything -------------------------------------------------------------------------

@pytest.fixture
def reverted(monkeypatch):
    fp4_dynamo_shim.revert()
    switches.warned.clear()
    yield monkeypatch


def test_the_kill_switch_stops_the_plugin_and_every_route_and_status_says_so(reverted, caplog):
    original = flashinfer.fp4_quantize
    reverted.setenv(settings.DISABLE, "1")
    with caplog.at_level(logging.INFO, logger="fp4_dynamo_shim"):
        sglang_plugin.plugin()
    assert flashinfer.fp4_quantize is original and not fp4_dynamo_shim.apply()
    state = fp4_dynamo_shim.status()
    assert state["disabled"] and not state["applied"] and "FP4_DYNAMO_SHIM_DISABLE=1 is set" in state["problem"]
    assert any("NOT active" in r.getMessage() and "DISABLE" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # asked for: not a warning


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
@pytest.mark.parametrize("route", ["import", "sitecustomize", "hook"])
def test_the_kill_switch_stops_the_import_the_hook_and_sitecustomize(route, tmp_path):
    code = {"import": "import fp4_dynamo_shim, os; print(os.environ.get('FP4_DYNAMO_SHIM'))", "hook": PATCHED,
            "sitecustomize": PATCHED}[route]
    env = {settings.DISABLE: "1", **({settings.HOOK: "1"} if route == "hook" else {})}
    if route == "sitecustomize":
        from _fp4_dynamo_shim.activation import site_files
        site_files.install_hook(tmp_path, check=False)
    result = run_python(code, env=env, extra_path=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] in ("None", "False")


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_verify_says_the_switch_is_set_and_exits_2():
    result = run_python("import sys; from fp4_dynamo_shim import verify; sys.exit(verify.main(['--json']))",
                        env={settings.DISABLE: "1"})
    assert result.returncode == 2
    assert "FP4_DYNAMO_SHIM_DISABLE=1 is set" in json.loads(result.stdout)["status"]["problem"]


# --- strict mode, unknown values ---------------------------------------------------------------------------

def test_strict_turns_an_unknown_value_into_an_apply_error(reverted):
    reverted.setenv(settings.STRICT, "1")
    reverted.setenv(settings.FALLBACK, "bogus")
    with pytest.raises(ApplyError, match="FP4_DYNAMO_SHIM_FALLBACK='bogus'.*error, reference, launch"):
        fp4_dynamo_shim.apply()
    reverted.setenv(settings.FALLBACK, "error")
    reverted.setenv(settings.HOOK, "2")
    with pytest.raises(ApplyError, match="FP4_DYNAMO_SHIM='2' is not understood"):
        fp4_dynamo_shim.apply()


@pytest.mark.parametrize("variable, value, accepted", [
    (settings.FALLBACK, "referense", "error, reference, launch"),
    (settings.CUDA_VERSION, "twelve", "torch, nvcc or a version"),
    (settings.STRICT, "2", "1, true, yes or on"),
    (settings.DISABLE, "enabled", "1, true, yes or on"),
    (settings.HOOK, "2", "1, true, yes or on"),  # the same rule for the hook's variable (issue 19)
])
def test_an_unknown_value_gets_one_warning_naming_the_variable_and_its_values(variable, value, accepted, reverted,
                                                                              caplog):
    reverted.setenv(variable, value)
    with caplog.at_level(logging.WARNING, logger="fp4_dynamo_shim"):
        assert fp4_dynamo_shim.apply()  # the default is used
        fp4_dynamo_shim.revert()
        fp4_dynamo_shim.apply()
    warned = [r.getMessage() for r in caplog.records if variable in r.getMessage()]
    assert len(warned) == 1 and repr(value) in warned[0] and accepted in warned[0], warned
    assert fp4_dynamo_shim.status()["warnings"] == [warned[0]]


@pytest.mark.slow
@pytest.mark.parametrize("value", ["2", "enabled"])
def test_an_unknown_value_of_the_hook_variable_warns_once_at_start_up(value, editable):
    result = editable.run(PATCHED, env={settings.HOOK: value})
    warned = [line for line in result.stderr.splitlines() if "FP4_DYNAMO_SHIM=" in line]
    assert result.stdout.strip() == "False"
    assert len(warned) == 1 and repr(value) in warned[0] and "1, true, yes or on" in warned[0], result.stderr


# --- a stable API ------------------------------------------------------------------------------------------

def test_status_has_the_same_keys_applied_not_applied_and_after_a_failed_apply(reverted):
    assert tuple(fp4_dynamo_shim.status()) == lifecycle.STATUS_KEYS  # not applied
    reverted.setattr("_fp4_dynamo_shim.fp4.kernels.load", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    assert not fp4_dynamo_shim.apply()
    failed = fp4_dynamo_shim.status()
    assert tuple(failed) == lifecycle.STATUS_KEYS and failed["cuda_version"] is None and "boom" in failed["problem"]
    reverted.undo()
    assert fp4_dynamo_shim.apply() and tuple(fp4_dynamo_shim.status()) == lifecycle.STATUS_KEYS
    assert fp4_dynamo_shim.status()["cuda_version"]["source"]


@pytest.mark.slow
def test_revert_withdraws_the_variable_the_import_set_and_says_whether_it_reverted():
    code = ("import os, fp4_dynamo_shim; a = os.environ.get('FP4_DYNAMO_SHIM'); r1 = fp4_dynamo_shim.revert(); "
            "b = os.environ.get('FP4_DYNAMO_SHIM'); r2 = fp4_dynamo_shim.revert(); print(a, r1, b, r2)")
    assert run_python(code).stdout.split() == ["1", "True", "None", "False"]
    kept = run_python(code, env={"FP4_DYNAMO_SHIM": "0"})  # set by the user: neither overwritten nor withdrawn
    assert kept.stdout.split() == ["0", "True", "0", "False"]


def test_the_replacement_says_it_is_the_shims_and_names_the_original():
    text = repr(flashinfer.fp4_quantize)
    original = lifecycle.original_function()
    assert text.startswith("<fp4_dynamo_shim replacement of ") and f"{original.__module__}.fp4_quantize" in text
    assert repr(flashinfer.mm_fp4).startswith("<fp4_dynamo_shim replacement of flashinfer.")


# --- CLI and docs ------------------------------------------------------------------------------------------

@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_usage_errors_exit_3_and_are_not_confused_with_not_applied():
    device = run_python("import sys; from fp4_dynamo_shim import verify; sys.exit(verify.main(['--device', 'cuda']))")
    if "no GPU visible" not in device.stderr:
        pytest.skip("a GPU is visible")
    assert device.returncode == 3
    assert run_python(None, args=("-m", "fp4_dynamo_shim", "no-such-command")).returncode == 3


def test_help_is_plain_text_and_version_is_printed():
    for arguments in (("-m", "fp4_dynamo_shim", "--help"), ("-m", "fp4_dynamo_shim.verify", "--help"),
                      ("-m", "fp4_dynamo_shim", "install-hook", "--help")):
        result = run_python(None, args=arguments)
        assert result.returncode == 0 and "``" not in result.stdout and "`" not in result.stdout.split("\n")[0]
        assert "Exit codes" in result.stdout or arguments[-2] == "install-hook"
    version = run_python(None, args=("-m", "fp4_dynamo_shim", "--version"))
    assert re.fullmatch(r"fp4-dynamo-shim \d+\.\d+\.\d+.*\n", version.stdout)


@pytest.mark.slow
def test_verify_groups_rebound_names_by_package_and_lists_modules_only_when_verbose():
    # Both reports from one interpreter: the listing is the same shim either way, and a second start costs seconds.
    both = run_python("from fp4_dynamo_shim import verify; verify.main(['--device', 'cpu']); print('@@'); "
                      "verify.main(['--device', 'cpu', '--verbose'])").stdout
    plain, verbose_text = both.split("\n@@\n")

    def rebound_block(output):
        lines = output.split("names rebound")[1].splitlines()[1:]
        return [line for line in lines[:next(i for i, line in enumerate(lines) if not line.startswith("    "))]]

    short, verbose = rebound_block(plain), rebound_block(verbose_text)
    assert short and all(re.fullmatch(r"    \w+: \d+ module\(s\): .*", line) for line in short), short
    assert any(line.startswith("    flashinfer: ") and "fp4_quantize" in line for line in short)
    assert not any(name.startswith("_") for line in short for name in line.split(": ")[-1].split(", "))
    assert any(re.match(r"    flashinfer\.\S+: .*fp4_quantize", line) for line in verbose) and len(verbose) > len(short)


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_benchmarks_write_results_only_when_asked(tmp_path):
    # Every benchmark saves through benchmarks/common.py; P1's smallest CPU run is the cheapest to start.
    name = f"p1_eager_overhead_cpu_torch{torch.__version__.split('+')[0]}.json"
    committed = ROOT / "benchmarks" / "results" / name
    before = committed.read_bytes() if committed.exists() else None
    command = (str(ROOT / "benchmarks" / "p1_eager_overhead.py"), "--device", "cpu", "--rows", "1", "--columns", "2048",
               "--calls", "5", "--rounds", "1")
    plain = run_python(None, args=command)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert (committed.read_bytes() if committed.exists() else None) == before and "not saved" in plain.stdout
    saved = run_python(None, args=(*command, "--save", str(tmp_path)))
    assert saved.returncode == 0 and (tmp_path / name).exists(), saved.stderr[-2000:]
    assert (committed.read_bytes() if committed.exists() else None) == before


def _pip_install_commands(text: str):
    """Every ``pip install ...`` command in fenced code blocks and inline code of a Markdown text."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`\n]*pip install[^`\n]*)`", re.sub(r"```.*?```", "", text, flags=re.S))
    for command in [line for block in blocks for line in block.splitlines()] + inline:
        for part in command.split("&&"):
            if "pip install" in part:
                yield part.split("#")[0].split("pip install", 1)[1].split()


def test_documented_install_lines_install_something_that_exists():
    found = 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for arguments in _pip_install_commands(path.read_text()):
            targets = [a for a in arguments if not a.startswith("-")]
            found += 1
            for target in targets:  # no bare project name: it is on no index
                assert target.startswith(("torch==", ".", '".', "dist/")) or target.endswith(".whl"), (path, arguments)
    assert found >= 4


def test_usage_docs_explain_how_to_see_whether_workers_are_active():
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert "## Is it active in my SGLang workers?" in usage and "worker-activation" in usage


@pytest.mark.slow
def test_the_sitecustomize_route_records_itself_and_honours_the_kill_switch(tmp_path):
    from _fp4_dynamo_shim.activation import site_files

    site_files.install_hook(tmp_path, check=False)  # the block calls install() with its default route
    code = ("import sys, flashinfer, _fp4_dynamo_shim.activation.startup as h; s = sys.modules.get('_fp4_dynamo_shim.lifecycle'); "
            "print(h.route, s.status()['activated_by'] if s else None)")
    assert run_python(code, extra_path=str(tmp_path)).stdout.split() == ["sitecustomize", "sitecustomize"]
    # FP4_DYNAMO_SHIM_DISABLE=1: install() puts no hook in place at all (not merely a refusing apply()).
    disabled = run_python(code, env={"FP4_DYNAMO_SHIM_DISABLE": "TRUE"}, extra_path=str(tmp_path))
    assert disabled.stdout.split() == ["None", "None"], disabled.stderr


def test_install_honours_the_kill_switch_in_process(monkeypatch, hook_not_installed):
    monkeypatch.setenv(switches.DISABLE, "Yes")
    before = list(sys.meta_path)
    startup.install()
    assert startup.route is None and sys.meta_path == before


def test_status_lists_what_the_plugin_rebound(tmp_path, monkeypatch):
    (tmp_path / "late_bound_layer.py").write_text("fp4_quantize = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_bound_layer

    try:
        late_bound_layer.fp4_quantize = lifecycle.original_function()
        sglang_plugin.plugin()
        assert getattr(late_bound_layer.fp4_quantize, "__fp4_dynamo_shim__", False)
        assert "late_bound_layer.fp4_quantize" in fp4_dynamo_shim.status()["rebound"]
    finally:
        sys.modules.pop("late_bound_layer", None)
