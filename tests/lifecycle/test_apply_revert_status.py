"""apply / revert / status: identity, idempotence, threads, refusals, and a machine without FlashInfer."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import flashinfer
import flashinfer.jit.cpp_ext as cpp_ext
import pytest
import torch
from packaging.version import Version

import fp4_dynamo_shim
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.fp4 import family
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import replacement
from fp4_dynamo_shim.errors import ApplyError

from helpers import installed_target


def _names_bound_to(objects):
    found = {}
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            for label, obj in objects.items():
                if value is obj:
                    found.setdefault(label, set()).add(f"{module_name}.{name}")
    return found


def _flashinfer_originals():
    """FlashInfer's own objects the shim replaces, read from FlashInfer while the shim is reverted."""
    assert not replacement.is_shim(flashinfer.fp4_quantize)
    return {
        "get_cuda_version": cpp_ext.get_cuda_version,
        "is_cuda_version_at_least": cpp_ext.is_cuda_version_at_least,
        **{m.name: getattr(flashinfer, m.name) for m in family.members_for(lifecycle.flashinfer_version())
           if hasattr(flashinfer, m.name)},
        "fp4_quantize": flashinfer.fp4_quantize,
    }


def test_no_module_of_the_shim_holds_an_original_once_applied():
    """A kept original in a module global of the shim's is what rebinding turned into the replacement
    (mm_fp4's op then called itself forever on a GPU). Originals live in closures and the applied record."""
    fp4_dynamo_shim.revert()
    originals = _flashinfer_originals()
    assert fp4_dynamo_shim.apply()
    held = sorted(
        f"{module_name}.{name}" for module_name, module in list(sys.modules.items())
        if module_name.lstrip("_") == "fp4_dynamo_shim" or module_name.lstrip("_").startswith("fp4_dynamo_shim.")
        for name, value in vars(module).items() if any(value is original for original in originals.values()))
    assert held == []
    assert not [name for name in fp4_dynamo_shim.status()["rebound"] if name.lstrip("_").startswith("fp4_dynamo_shim")]


def test_revert_restores_every_identical_original_object():
    fp4_dynamo_shim.revert()
    originals = _flashinfer_originals()
    before = _names_bound_to(originals)
    assert fp4_dynamo_shim.apply()
    assert replacement.is_shim(flashinfer.fp4_quantize)
    assert cpp_ext.get_cuda_version is not originals["get_cuda_version"]
    assert _names_bound_to(originals) == {}  # nothing still points at an original
    assert set(fp4_dynamo_shim.status()["rebound"]) == set().union(*before.values())
    assert fp4_dynamo_shim.revert()
    assert _names_bound_to(originals) == before
    assert not fp4_dynamo_shim.revert()  # second revert: nothing to do


def test_apply_is_idempotent():
    first = flashinfer.fp4_quantize
    assert fp4_dynamo_shim.apply() and fp4_dynamo_shim.apply()
    assert flashinfer.fp4_quantize is first
    assert not replacement.is_shim(first.__wrapped__)  # wraps FlashInfer's function, never a shim


def test_apply_from_many_threads_at_once_patches_once():
    fp4_dynamo_shim.revert()
    original = flashinfer.fp4_quantize
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append(fp4_dynamo_shim.apply())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 8
    assert flashinfer.fp4_quantize.__wrapped__ is original
    assert len(fp4_dynamo_shim.status()["rebound"]) == len(set(fp4_dynamo_shim.status()["rebound"]))


def test_replacement_has_the_installed_signature():
    import inspect

    shim = flashinfer.fp4_quantize
    assert inspect.signature(shim) == inspect.signature(shim.__wrapped__)
    assert shim.__name__ == "fp4_quantize" and shim.__doc__ == shim.__wrapped__.__doc__
    # Positional binding follows the installed release's parameter order.
    x = torch.randn(4, 64, dtype=torch.float16)
    by_position = shim(x, torch.tensor([1.0]), 16, False, False)
    by_keyword = shim(x, global_scale=torch.tensor([1.0]), is_sf_swizzled_layout=False)
    assert all(torch.equal(a, b) for a, b in zip(by_position, by_keyword))
    with pytest.raises(TypeError):
        shim(x, torch.tensor([1.0]), not_a_parameter=1)


def test_unsupported_version_warns_once_and_patches_nothing(monkeypatch, caplog):
    fp4_dynamo_shim.revert()
    original = flashinfer.fp4_quantize
    monkeypatch.setattr(lifecycle, "flashinfer_version", lambda: "0.4.1")
    switches.warned.clear()
    with caplog.at_level(logging.WARNING, logger="fp4_dynamo_shim"):
        assert not fp4_dynamo_shim.apply()
        assert not fp4_dynamo_shim.apply()
    warnings = [r.getMessage() for r in caplog.records if "0.4.1" in r.getMessage()]
    assert len(warnings) == 1 and ">=0.5.3, <=0.7.4" in warnings[0]
    assert flashinfer.fp4_quantize is original and cpp_ext.get_cuda_version.__module__ == "flashinfer.jit.cpp_ext"
    status = fp4_dynamo_shim.status()
    assert not status["applied"] and "not supported" in status["problem"]

    monkeypatch.setenv("FP4_DYNAMO_SHIM_STRICT", "1")
    with pytest.raises(ApplyError, match="0.4.1 is not supported"):
        fp4_dynamo_shim.apply()
    assert flashinfer.fp4_quantize is original


def test_a_failing_step_leaves_flashinfer_exactly_as_it_was(monkeypatch):
    fp4_dynamo_shim.revert()
    before = (flashinfer.fp4_quantize, cpp_ext.get_cuda_version, cpp_ext.is_cuda_version_at_least)

    def broken_build(*args, **kwargs):
        raise RuntimeError("nvcc exploded")

    monkeypatch.setattr("_fp4_dynamo_shim.fp4.kernels.load", broken_build)
    assert not fp4_dynamo_shim.apply()
    assert (flashinfer.fp4_quantize, cpp_ext.get_cuda_version, cpp_ext.is_cuda_version_at_least) == before
    assert "nvcc exploded" in fp4_dynamo_shim.status()["problem"]


def test_cuda_version_comes_from_torch_or_the_override_and_runs_no_subprocess(applied_with, monkeypatch):
    assert applied_with(CUDA_VERSION="12.8")["cuda_version"]["source"] == "environment"

    def no_subprocess(*args, **kwargs):
        raise AssertionError("subprocess called after apply")

    monkeypatch.setattr(subprocess, "check_output", no_subprocess)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert cpp_ext.get_cuda_version() == Version("12.8")
    assert cpp_ext.is_cuda_version_at_least("12.8") and not cpp_ext.is_cuda_version_at_least("12.9")
    assert cpp_ext.is_cuda_version_at_least("12") and not cpp_ext.is_cuda_version_at_least("13.0")

    def uses_flashinfer_version_checks(x):
        return x + 1 if cpp_ext.is_cuda_version_at_least("12.8") and cpp_ext.get_cuda_version().major == 12 else x

    compiled = torch.compile(uses_flashinfer_version_checks, fullgraph=True, backend="eager")
    assert compiled(torch.zeros(1)).item() == 1


def test_status_reports_the_settings_the_shim_applied_with_not_the_environment_of_the_moment(applied_with,
                                                                                             monkeypatch):
    """Settings are read once, by apply(): a variable changed afterwards changes nothing the shim does until
    the next apply(), so status() must not report it as if it did."""
    applied = applied_with(FALLBACK="reference", CUDA_VERSION="12.4", FLASHINFER_OPS="sglang", STRICT="0",
                           DISABLE="bogus")
    assert applied["applied"], applied["problem"]
    said = {key: applied[key] for key in ("fallback", "strict", "disabled", "warnings", "cuda_version",
                                          "flashinfer_ops")}
    assert (said["fallback"], said["strict"], said["disabled"]) == ("reference", False, False)
    assert len(said["warnings"]) == 1 and "FP4_DYNAMO_SHIM_DISABLE='bogus'" in said["warnings"][0]
    for name, value in (("FALLBACK", "launch"), ("CUDA_VERSION", "11.8"), ("FLASHINFER_OPS", "off"),
                        ("STRICT", "1"), ("DISABLE", "1")):
        monkeypatch.setenv(f"FP4_DYNAMO_SHIM_{name}", value)
    now = fp4_dynamo_shim.status()
    assert now["applied"] and {key: now[key] for key in said} == said
    assert cpp_ext.get_cuda_version() == Version("12.4")  # and what the shim does agrees with what it says


def test_default_cuda_version_is_torchs_when_torch_has_one():
    expected = torch.version.cuda or fp4_dynamo_shim.status()["cuda_version"]["nvcc"]
    assert fp4_dynamo_shim.status()["cuda_version"]["value"] == expected
    assert fp4_dynamo_shim.status()["cuda_version"]["source"] == ("torch" if torch.version.cuda else "nvcc")


def test_no_cuda_initialisation_without_a_gpu():
    if torch.cuda.device_count():
        pytest.skip("a GPU is visible")
    assert not torch.cuda.is_initialized()
    assert fp4_dynamo_shim.status()["devices"] == []


def test_status_is_json_and_names_what_was_patched():
    status = json.loads(json.dumps(fp4_dynamo_shim.status()))
    assert status["applied"] and status["op"] == "fp4_dynamo_shim::fp4_quantize"
    assert "flashinfer.fp4_quantize" in status["rebound"]
    assert status["target"]["module"] == installed_target().module


def _site_without_flashinfer(tmp_path: Path) -> Path:
    """A real site directory holding everything installed here except FlashInfer (symlinks)."""
    site = tmp_path / "site"
    site.mkdir()
    installed = Path(torch.__file__).resolve().parent.parent
    for entry in installed.iterdir():
        if entry.name.lower().startswith(("flashinfer", "fp4_dynamo_shim", "fp4-dynamo-shim", "fp4_dynamo", "_fp4_dynamo_shim")):
            continue
        (site / entry.name).symlink_to(entry)
    source = Path(fp4_dynamo_shim.__file__).resolve().parent
    (site / "fp4_dynamo_shim").symlink_to(source)
    (site / "_fp4_dynamo_shim").symlink_to(source.parent / "_fp4_dynamo_shim")
    (site / "fp4_dynamo_shim_hook.py").symlink_to(source.parent / "fp4_dynamo_shim_hook.py")
    return site


@pytest.mark.release_independent  # no FlashInfer at all
def test_import_without_flashinfer_installed_succeeds_and_says_so(tmp_path):
    site = _site_without_flashinfer(tmp_path)
    code = (
        "import json, fp4_dynamo_shim; print(json.dumps(fp4_dynamo_shim.status()));"
        "import importlib.util; assert importlib.util.find_spec('flashinfer') is None"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout.strip().splitlines()[-1])
    assert status == {**status, "applied": False, "problem": "flashinfer-python is not installed",
                      "flashinfer": {"version": None, "tested": None, "matched_row": None, "parts": None}}
    assert tuple(status) == lifecycle.STATUS_KEYS


def test_the_tested_range_is_spelled_once_and_pyproject_requires_its_first_release_only():
    """versions.py names the tested FlashInfer releases; the dependency users install keeps the lower bound and
    names no upper one, so installing the shim never changes a newer FlashInfer (a newer release is judged part
    by part at apply time)."""
    import re
    from pathlib import Path

    from packaging.specifiers import SpecifierSet

    from _fp4_dynamo_shim import versions

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (dependency,) = re.findall(r'"flashinfer-python([^"]*)"', pyproject)
    assert SpecifierSet(dependency) == SpecifierSet(f">={versions.FIRST_FLASHINFER}")
    assert versions.SUPPORTED_RANGE == "flashinfer-python >=0.5.3, <=0.7.4"
    assert fp4_dynamo_shim.status()["supported_flashinfer"] == versions.SUPPORTED_RANGE
    assert [version in versions.SUPPORTED_FLASHINFER for version in ("0.5.2", "0.5.3", "0.7.4.post1", "0.7.5")] == [
        False, True, True, False]


def test_a_replacement_pickles_by_name_like_the_function_it_stands_for():
    """A pickled reference (SGLang's server arguments travel to its schedulers pickled) resolves to whatever the
    name holds where it is loaded: the replacement here, FlashInfer's function where the shim is not applied."""
    import pickle

    data = pickle.dumps(flashinfer.fp4_quantize)
    assert pickle.loads(data) is flashinfer.fp4_quantize
    fp4_dynamo_shim.revert()
    assert pickle.loads(data) is flashinfer.fp4_quantize and not replacement.is_shim(flashinfer.fp4_quantize)
