"""The command line as a user installs it: ``fp4-dynamo-shim`` (the console script of a real wheel install) and
``python -m fp4_dynamo_shim[.verify]``.

Only ``verify`` applies the shim: ``--version``, ``--help``, ``status`` and the hook commands work, and stay
fast, whatever the environment holds (``FP4_DYNAMO_SHIM_STRICT=1`` with a value the shim does not
understand made every one of them die with ApplyError). A failed apply is verify's failed check, exit 2,
valid ``--json``. install-hook under the kill switch installs, checks and says the switch is set.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import pytest

import venvs
from _fp4_dynamo_shim import startup_files
from helpers import run_python

ROOT = Path(__file__).resolve().parents[2]
STRICT_AND_BAD = {"FP4_DYNAMO_SHIM_STRICT": "1", "FP4_DYNAMO_SHIM_FALLBACK": "bogus"}
PATCHED = "import flashinfer; print(getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False))"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> venvs.Environment:
    return venvs.create(tmp_path_factory.mktemp("cli"))


def console(environment: venvs.Environment, *arguments, env=None):
    """``fp4-dynamo-shim *arguments``: the console script pip wrote, run by the venv's interpreter (pip --prefix
    wrote the installing interpreter's shebang)."""
    return environment.command([str(environment.root / "env" / "bin" / "fp4-dynamo-shim"), *arguments], env=env)


def loaded(importtime_stderr: str) -> set:
    """Top-level packages that ``python -X importtime`` reports as imported."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("arguments", [["--version"], ["--help"], ["install-hook", "--help"],
                                       ["uninstall-hook", "--site-dir", "."], ["verify", "--help"]])
@pytest.mark.slow
def test_the_command_line_loads_neither_torch_nor_flashinfer_where_it_applies_nothing(installed, arguments):
    script = str(installed.root / "env" / "bin" / "fp4-dynamo-shim")
    for command in ([script, *arguments], ["-m", "fp4_dynamo_shim", *arguments]):
        result = installed.command(["-X", "importtime", *command])
        assert result.returncode == 0, result.stderr[-2000:]
        assert not loaded(result.stderr) & {"torch", "flashinfer"}, command


@pytest.mark.slow
def test_version_takes_well_under_300_ms(installed):
    seconds = []
    for _ in range(5):
        started = time.perf_counter()
        result = console(installed, "--version")
        seconds.append(time.perf_counter() - started)
        assert result.returncode == 0 and re.fullmatch(r"fp4-dynamo-shim \d+\.\d+\.\d+\n", result.stdout)
    assert min(seconds) < 0.3, seconds


@pytest.mark.slow
def test_strict_with_a_bad_value_every_command_but_verify_runs_and_applies_nothing(installed, tmp_path):
    for arguments in (["--version"], ["--help"], ["status"], ["install-hook", "--site-dir", str(tmp_path)],
                      ["uninstall-hook", "--site-dir", str(tmp_path)]):
        result = console(installed, *arguments, env=STRICT_AND_BAD)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (arguments, result.stderr[-2000:])
        if arguments == ["status"]:
            state = json.loads(result.stdout)
            assert not state["applied"] and state["problem"].startswith("not applied in this process")
            assert any("FP4_DYNAMO_SHIM_FALLBACK='bogus'" in warning for warning in state["warnings"])
    assert not (tmp_path / "sitecustomize.py").exists()  # installed, checked, and removed again


@pytest.mark.slow
def test_verify_reports_a_failed_apply_as_its_failed_check_and_exits_2(installed):
    result = console(installed, "verify", "--json", env=STRICT_AND_BAD)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["exit_code"] == 2 and not document["status"]["applied"]
    (check,) = document["checks"]
    assert check["name"] == "apply" and check["result"] == "fail"
    assert check["detail"].startswith("ApplyError: FP4_DYNAMO_SHIM_FALLBACK='bogus' is not understood")


@pytest.mark.slow
def test_install_hook_under_the_kill_switch_installs_checks_and_says_the_switch_is_set(installed):
    pth = installed.site / startup_files.HOOK_PTH
    try:
        result = console(installed, "install-hook", env={"FP4_DYNAMO_SHIM_DISABLE": "1"})
        assert result.returncode == 0, result.stderr
        assert pth.exists() and "pth route; checked" in result.stdout
        assert "FP4_DYNAMO_SHIM_DISABLE=1 is set" in result.stderr and "applies nothing" in result.stderr
        assert installed.run(PATCHED).stdout.strip() == "True"
        assert installed.run(PATCHED, env={"FP4_DYNAMO_SHIM_DISABLE": "1"}).stdout.strip() == "False"
    finally:
        assert console(installed, "uninstall-hook").returncode == 0
    assert not pth.exists()


# --- the same from the source tree (no install: fast) -------------------------------------------------------

def test_python_m_from_the_source_tree_applies_nothing_and_loads_neither_torch_nor_flashinfer():
    for arguments in (["--version"], ["--help"], ["uninstall-hook", "--site-dir", "."]):
        result = run_python(None, env=STRICT_AND_BAD, args=("-X", "importtime", "-m", "fp4_dynamo_shim", *arguments))
        assert result.returncode == 0 and "ApplyError" not in result.stderr, (arguments, result.stderr[-2000:])
        assert not loaded(result.stderr) & {"torch", "flashinfer"}, arguments


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
@pytest.mark.parametrize("output", ["--json", "text"])
def test_python_m_verify_from_the_source_tree_reports_a_failed_apply(output):
    result = run_python(None, env=STRICT_AND_BAD, args=("-m", "fp4_dynamo_shim.verify",
                                                        *(["--json"] if output == "--json" else [])))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    if output == "--json":
        assert [(c["name"], c["result"]) for c in json.loads(result.stdout)["checks"]] == [("apply", "fail")]
    else:
        assert re.search(r"^  FAIL  apply +ApplyError: FP4_DYNAMO_SHIM_FALLBACK='bogus'", result.stdout, re.M)
        assert "summary: 0 passed, 1 failed, 0 skipped; exit 2" in result.stdout


def test_requires_python_is_what_the_dependencies_need_and_the_readme_says_it():
    """torch 2.13 and flashinfer-python 0.5.3-0.7.4 exist for Python >= 3.10 only (pip download --python-version
    3.9 finds none): the project may not claim less. Read from the installed dependencies' metadata."""
    import importlib.metadata

    needed = max(_lower_bound(importlib.metadata.metadata(name)["Requires-Python"])
                 for name in ("torch", "flashinfer-python"))
    assert _lower_bound(declared_requires_python()) == needed, (declared_requires_python(), needed)
    assert f"Python >= {needed[0]}.{needed[1]}" in (ROOT / "README.md").read_text()


def declared_requires_python() -> str:
    return re.search(r'^requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def _lower_bound(specifier: str) -> tuple:
    """The lowest Python a Requires-Python specifier allows, as (major, minor)."""
    from packaging.specifiers import SpecifierSet

    allowed = [(3, minor) for minor in range(6, 30) if SpecifierSet(specifier).contains(f"3.{minor}")]
    return allowed[0]


@pytest.mark.slow
def test_the_wheel_declares_the_requires_python_of_pyproject(installed):
    wheel = installed.run("import importlib.metadata as m; print(m.metadata('fp4-dynamo-shim')['Requires-Python'])")
    assert wheel.stdout.strip() == declared_requires_python()


def _python39():
    """A working Python 3.9 interpreter, if this machine has one (a pyenv shim alone may not run)."""
    import glob
    import shutil
    import subprocess

    candidates = [shutil.which("python3.9"), *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.9*/bin/python")))]
    for candidate in filter(None, candidates):
        check = subprocess.run([candidate, "-c", "import sys, pip; assert sys.version_info[:2] == (3, 9)"],
                               capture_output=True)
        if check.returncode == 0:
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.skipif(_python39() is None, reason="no Python 3.9 interpreter on this machine")
def test_pip_on_python_3_9_refuses_the_wheel_by_its_requires_python(installed):
    """What a user of 3.9 sees now: pip names the Python requirement (before: "No matching distribution" for
    torch or flashinfer-python, after the shim itself was accepted)."""
    import os
    import subprocess

    wheel = os.environ.get("FP4_DYNAMO_SHIM_TEST_WHEEL") or str(next((installed.root / "wheels").glob("*.whl")))
    result = subprocess.run([_python39(), "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", wheel],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "requires a different Python: 3.9" in result.stderr, result.stderr[-1500:]


@pytest.mark.parametrize("command", ["install-hook", "uninstall-hook"])
def test_a_site_directory_that_cannot_be_written_fails_clearly_and_changes_nothing(command, tmp_path, monkeypatch,
                                                                                    capsys):
    """Stand-in: the write is refused by a patched ``tempfile.mkstemp``/``Path.unlink`` raising EACCES, because
    this runner is root, which permission bits do not stop. What is real: the CLI and the hook's writer."""
    from _fp4_dynamo_shim import cli
    from _fp4_dynamo_shim.activation import site_files

    if command == "uninstall-hook":
        (tmp_path / startup_files.HOOK_PTH).write_text(site_files.HOOK_PTH_TEXT)
    before = sorted(p.name for p in tmp_path.iterdir())

    def refused(*arguments, **keywords):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    monkeypatch.setattr(Path, "unlink", refused)
    assert cli.main([command, "--site-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert f"fp4-dynamo-shim {command}: cannot" in error and str(tmp_path) in error and "Permission denied" in error
    assert "Traceback" not in error and sorted(p.name for p in tmp_path.iterdir()) == before
