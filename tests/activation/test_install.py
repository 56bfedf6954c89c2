"""Installing and uninstalling, in a real virtual environment with the project's wheel: a value of
``FP4_DYNAMO_SHIM`` the hook does not understand, and ``pip uninstall`` run before ``uninstall-hook``.

The uninstall test changes the environment for good, so it runs last in this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import venvs
from _fp4_dynamo_shim import startup_files


#: Every test here builds a virtual environment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> venvs.Environment:
    return venvs.create(tmp_path_factory.mktemp("install"))


def test_an_unknown_hook_value_is_replaced_by_the_imports_export_and_spawned_children_get_the_shim(installed,
                                                                                                  tmp_path):
    """With FP4_DYNAMO_SHIM=2 the import used to export nothing ("already set"): every spawned worker ran
    without the shim, with one stderr line to show for it."""
    script = tmp_path / "launcher.py"
    script.write_text(venvs.SPAWN_PARENT.replace(
        'assert "fp4_dynamo_shim" not in sys.modules and "torch" not in sys.modules',
        "import fp4_dynamo_shim; assert os.environ['FP4_DYNAMO_SHIM'] == '1'"))
    result = installed.command([str(script)], env={"FP4_DYNAMO_SHIM": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["patched"] is True
    assert "in place of '2', which the import hook does not understand" in result.stderr
    state = installed.run("import fp4_dynamo_shim, json, os; s = fp4_dynamo_shim.status(); fp4_dynamo_shim.revert(); "
                          "print(json.dumps([s['warnings'], os.environ.get('FP4_DYNAMO_SHIM')]))",
                          env={"FP4_DYNAMO_SHIM": "2"})
    warnings, after_revert = json.loads(state.stdout.strip().splitlines()[-1])
    assert any("FP4_DYNAMO_SHIM='2' is not understood" in warning for warning in warnings), warnings
    assert after_revert == "2"  # revert() puts the user's value back
    strict = installed.run("import fp4_dynamo_shim", env={"FP4_DYNAMO_SHIM": "2", "FP4_DYNAMO_SHIM_STRICT": "1"})
    assert strict.returncode != 0 and "ApplyError: FP4_DYNAMO_SHIM='2' is not understood" in strict.stderr


def test_pip_uninstall_before_uninstall_hook_leaves_every_interpreter_start_silent(installed, tmp_path):
    """Both routes install-hook writes (the .pth in site-packages, the sitecustomize block elsewhere) stay
    behind after ``pip uninstall fp4-dynamo-shim``; each interpreter start then printed a ModuleNotFoundError
    traceback, twice. Stand-in: torch and FlashInfer reach the venv from the running environment through
    dependencies.pth, which also holds this project in CI's environment; after the uninstall that file is
    rewritten without any directory that holds the hook module, as a venv with its own torch would be."""
    script = installed.root / "env" / "bin" / "fp4-dynamo-shim"
    assert installed.command([str(script), "install-hook"]).returncode == 0
    assert installed.command([str(script), "install-hook", "--site-dir", str(tmp_path)]).returncode == 0
    # The venv's own interpreter runs pip (found through dependencies.pth): it uninstalls the venv's copy only.
    removed = installed.command(["-m", "pip", "uninstall", "-y", "fp4-dynamo-shim"])
    assert removed.returncode == 0 and "Successfully uninstalled fp4-dynamo-shim" in removed.stdout, removed.stderr
    assert (installed.site / startup_files.HOOK_PTH).exists() and (tmp_path / "sitecustomize.py").exists()
    paths = [path for path in venvs.dependency_paths() if not (Path(path) / "fp4_dynamo_shim_hook.py").exists()]
    (installed.site / "dependencies.pth").write_text("".join(f"{path}\n" for path in paths))
    gone = installed.run("import importlib.util; print(importlib.util.find_spec('fp4_dynamo_shim_hook'))")
    assert gone.stdout.strip() == "None", gone.stdout
    for extra in ({}, {"PYTHONPATH": str(tmp_path)}):
        result = installed.run("print('alive')", env=extra)
        assert result.returncode == 0 and result.stdout == "alive\n" and result.stderr == "", (extra, result.stderr)
