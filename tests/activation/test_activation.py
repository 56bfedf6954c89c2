"""Activation routes: the .pth import hook (in real spawned children), sitecustomize, the SGLang plugin, verify.

The ``installed`` fixture builds this project's wheel and installs it into a fresh virtual environment,
so the ``.pth`` file, the entry point and the console script are the ones a user gets. Its other
dependencies (torch, flashinfer, wrapt) come from the running environment through a path-only .pth.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import venvs
from _fp4_dynamo_shim.activation import site_files
from _fp4_dynamo_shim import startup_files
from _fp4_dynamo_shim.sglang import sglang_releases


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> venvs.Environment:
    environment = venvs.create(tmp_path_factory.mktemp("installed"))
    assert (environment.site / "fp4_dynamo_shim.pth").exists(), "the wheel must carry the .pth at its root"
    return environment


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["1", None])
def test_spawned_child_applies_the_shim_only_with_the_environment_variable(installed, variable, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(venvs.SPAWN_PARENT)
    env = {"FP4_DYNAMO_SHIM": variable} if variable else {}
    result = subprocess.run([str(installed.python), str(script)], capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    child = json.loads(result.stdout.strip().splitlines()[-1])
    if variable:
        assert child == {"patched": True, "shim_imported": True, "graphs": 1, "breaks": 0}
    else:
        assert child == {"patched": False, "shim_imported": False}


STARTUP_MODULES = (
    "import sys, json; print(json.dumps(sorted(m for m in sys.modules "
    "if m.split('.')[0] in ('torch', 'flashinfer', 'fp4_dynamo_shim', '_fp4_dynamo_shim', 'fp4_dynamo_shim_hook', 'wrapt'))))"
)


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["1", None])
def test_startup_imports_neither_torch_nor_flashinfer(installed, variable):
    result = installed.run(STARTUP_MODULES, env={"FP4_DYNAMO_SHIM": variable} if variable else {})
    assert result.returncode == 0 and result.stderr == ""
    loaded = json.loads(result.stdout)
    # The hook's start-up route and its switches are all that start-up loads; wrapt waits for flashinfer's import.
    assert loaded == (["_fp4_dynamo_shim", "_fp4_dynamo_shim.activation", "_fp4_dynamo_shim.activation.startup",
                       "_fp4_dynamo_shim.switches", "fp4_dynamo_shim_hook"] if variable else [])


@pytest.mark.slow
def test_a_broken_hook_module_does_not_stop_the_interpreter(installed, tmp_path):
    (tmp_path / "fp4_dynamo_shim_hook.py").write_text("raise RuntimeError('hook module is broken here')\n")
    result = installed.run("print('alive')", env={"FP4_DYNAMO_SHIM": "1", "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0 and result.stdout.strip() == "alive"
    # The .pth did run the hook: site.py reports the failure and goes on.
    assert "fp4_dynamo_shim.pth" in result.stderr and "hook module is broken here" in result.stderr


@pytest.mark.slow
def test_the_hook_follows_the_value_of_the_variable_not_its_presence(installed):
    code = "import flashinfer; print(getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False))"
    outcomes = {value: installed.run(code, env={"FP4_DYNAMO_SHIM": value}).stdout.strip()
                for value in ("1", "true", "0", "false")}
    assert outcomes == {"1": "True", "true": "True", "0": "False", "false": "False"}


@pytest.mark.slow
def test_importing_the_shim_exports_the_variable_that_activates_spawned_children(installed, tmp_path):
    """Route 1: a launcher that imports the shim and spawns a worker that never imports it. The import sits
    under the main guard: a spawned child re-imports the launcher's top level, which would import the shim
    there too and hide whether the variable did its work."""
    script = tmp_path / "launcher.py"
    script.write_text(venvs.SPAWN_PARENT.replace(
        'assert "fp4_dynamo_shim" not in sys.modules and "torch" not in sys.modules', "import fp4_dynamo_shim"))
    result = subprocess.run([str(installed.python), str(script)], capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["patched"] is True


@pytest.mark.slow
def test_a_failing_post_import_hook_is_one_warning_and_the_program_goes_on(installed, tmp_path):
    (tmp_path / "wrapt.py").write_text("raise RuntimeError('wrapt is broken here')\n")
    quiet = installed.run("print('alive')", env={"FP4_DYNAMO_SHIM": "1", "PYTHONPATH": str(tmp_path)})
    assert quiet.returncode == 0 and quiet.stdout.strip() == "alive" and quiet.stderr == ""  # nothing at start-up
    result = installed.run("import flashinfer; print('alive', flashinfer.__version__)",
                           env={"FP4_DYNAMO_SHIM": "1", "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0 and result.stdout.startswith("alive")
    warnings = [line for line in result.stderr.splitlines() if "fp4_dynamo_shim" in line]
    assert len(warnings) == 1 and "wrapt is broken" in warnings[0]


@pytest.mark.slow
def test_a_hook_that_raises_when_flashinfer_is_imported_does_not_stop_the_program(installed):
    """The implementation fails to import when the hook applies it (a broken install): one warning, and the
    program goes on. Stand-in for the breakage: ``None`` in sys.modules makes that import raise ModuleNotFoundError."""
    code = ("import sys; sys.modules['_fp4_dynamo_shim.lifecycle'] = None\n"
            "import flashinfer; print('alive', flashinfer.__version__)")
    result = installed.run(code, env={"FP4_DYNAMO_SHIM": "1"})
    assert result.returncode == 0 and result.stdout.startswith("alive"), result.stderr
    warnings = [line for line in result.stderr.splitlines() if "fp4_dynamo_shim" in line]
    assert len(warnings) == 1 and "applying the shim failed (ModuleNotFoundError" in warnings[0], warnings


def test_install_and_uninstall_hook_round_trip_keeps_an_existing_sitecustomize(tmp_path):
    existing = "import os\nos.environ.setdefault('SOMETHING', 'kept')\n"
    (tmp_path / "sitecustomize.py").write_text(existing)
    installed = site_files.install_hook(tmp_path)
    path = tmp_path / "sitecustomize.py"
    assert installed == site_files.Installed(path, True, "sitecustomize")  # not a site directory: the block route
    text = path.read_text()
    assert text.startswith(existing) and startup_files.BEGIN in text and text.count(startup_files.BEGIN) == 1
    assert site_files.install_hook(tmp_path) == site_files.Installed(path, False, "sitecustomize") and path.read_text() == text
    assert site_files.uninstall_hook(tmp_path) == [path]
    assert path.read_text() == existing
    assert site_files.uninstall_hook(tmp_path) == []


def test_uninstall_removes_a_sitecustomize_that_only_held_the_hook(tmp_path):
    site_files.install_hook(tmp_path)
    assert site_files.uninstall_hook(tmp_path) and not (tmp_path / "sitecustomize.py").exists()


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_sitecustomize_route_applies_the_shim_without_any_pth(tmp_path):
    from helpers import SRC

    result = subprocess.run([sys.executable, "-m", "fp4_dynamo_shim", "install-hook", "--site-dir", str(tmp_path)],
                            capture_output=True, text=True, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and str(tmp_path / "sitecustomize.py") in result.stdout
    code = "import flashinfer; print(getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False))"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": f"{tmp_path}:{SRC}", "PATH": "/usr/bin:/bin"})
    assert ran.stdout.strip() == "True", ran.stderr


def test_sglang_plugin_rebinds_an_original_bound_after_the_shim_applied(tmp_path, monkeypatch):
    """A lazy loader cached FlashInfer's function before the shim applied; a module bound it afterwards.
    apply() has already run (the hook did it), so only the plugin's rescan can reach that binding."""
    import fp4_dynamo_shim
    from _fp4_dynamo_shim.activation import sglang_plugin

    (tmp_path / "lazy_loader.py").write_text(
        "import functools\n@functools.cache\ndef fp4():\n    from flashinfer import fp4_quantize\n    return fp4_quantize\n")
    (tmp_path / "late_layer.py").write_text("import lazy_loader\nfp4_quantize = lazy_loader.fp4()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fp4_dynamo_shim.revert()
    import lazy_loader
    original = lazy_loader.fp4()
    assert fp4_dynamo_shim.apply()
    import late_layer
    try:
        assert late_layer.fp4_quantize is original
        sglang_plugin.plugin()
        assert getattr(late_layer.fp4_quantize, "__fp4_dynamo_shim__", False)
    finally:
        sys.modules.pop("late_layer", None)
        sys.modules.pop("lazy_loader", None)


@pytest.mark.slow
def test_sglang_plugin_entry_point_is_declared_and_rebinds_earlier_imports(installed, tmp_path):
    (tmp_path / "early_sglang_layer.py").write_text("from flashinfer import fp4_quantize as bound_early\n")
    code = textwrap.dedent("""
        import importlib.metadata, json
        import flashinfer, early_sglang_layer
        before = getattr(early_sglang_layer.bound_early, "__fp4_dynamo_shim__", False)
        (entry,) = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins") if e.name == "fp4_dynamo_shim"]
        entry.load()()   # what sglang.srt.plugins.load_plugins() does in each scheduler process
        after = getattr(early_sglang_layer.bound_early, "__fp4_dynamo_shim__", False)
        print(json.dumps([entry.value, before, after, early_sglang_layer.bound_early is flashinfer.fp4_quantize]))
    """)
    result = installed.run(code, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["_fp4_dynamo_shim.activation.sglang_plugin:plugin", False, True, True]


@pytest.mark.parametrize("version, wraps, check", [
    ("0.5.3.post1", False, False), ("0.5.3.post2", False, True), ("0.5.9", False, True), ("0.5.11", False, False),
    ("0.5.12", True, False), ("0.5.13.post1", True, False), ("0.5.14", True, False), ("0.5.23", True, False),
])
def test_sglang_releases_are_described_from_the_table(version, wraps, check):
    release = sglang_releases.release_for(version)
    assert (release.fp4_quantize_binding == "sglang-op", release.compile_path_check) == (wraps, check)


@pytest.mark.slow
def test_verify_cpu_run_passes_and_its_json_parses(installed):
    # The console script, run by the venv's interpreter (pip --prefix wrote the installing one's shebang).
    script = installed.root / "env" / "bin" / "fp4-dynamo-shim"
    result = subprocess.run([str(installed.python), str(script), "verify", "--json", "--device", "cpu"], capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(installed.root)})
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert document["exit_code"] == 0 and document["device"] == "cpu"
    assert {c["name"]: c["result"] for c in document["checks"]} == {
        "trace-static": "pass", "trace-dynamic": "pass", "opcheck": "pass", "compiled-vs-eager": "pass",
        "cuda-graph": "skip", "flashinfer-op": "pass", "sglang-release": "skip", "sglang-compile": "skip",
        "family": "pass", "flashinfer-ops": "pass",
        "worker-activation": "pass",
    }
    assert document["status"]["applied"] and document["environment"]["flashinfer"]
    assert all(set(c) == {"name", "result", "detail", "seconds"} for c in document["checks"])


@pytest.mark.slow
def test_verify_exits_2_when_the_shim_cannot_apply(installed):
    code = textwrap.dedent("""
        import sys, fp4_dynamo_shim
        from _fp4_dynamo_shim.fp4 import kernels
        from fp4_dynamo_shim import verify
        fp4_dynamo_shim.revert()
        def broken_build(*args):
            raise RuntimeError("nvcc exploded")
        kernels.load = broken_build
        fp4_dynamo_shim.apply()
        sys.exit(verify.main(["--json"]))
    """)
    result = installed.run(code)
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["exit_code"] == 2 and "nvcc exploded" in document["status"]["problem"]


@pytest.mark.slow
def test_verify_exits_1_when_a_check_fails(installed):
    # Fault injection: break the op's fake so that compiled outputs no longer match eager strides.
    code = textwrap.dedent("""
        import sys
        from _fp4_dynamo_shim.fp4 import quantize_op
        real = quantize_op.quantize
        def wrong_strides(*args, **kwargs):
            packed, sf = real(*args, **kwargs)
            return packed, sf.t().contiguous().t() if kwargs.get("launch") is None else sf
        quantize_op.quantize = wrong_strides
        from fp4_dynamo_shim import verify  # the front applies on import: after the fault is in place
        sys.exit(verify.main(["--json", "--device", "cpu"]))
    """)
    result = installed.run(code)
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(c["result"] == "fail" for c in json.loads(result.stdout)["checks"])
