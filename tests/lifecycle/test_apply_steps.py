"""``apply()``'s steps and ``revert()``'s record in this process: what each layer is handed from the settings,
the line it logs, the refusal when FlashInfer cannot be imported, and what ``status()`` says after each.

The matrix legs meet the import failure with the releases that query a GPU at import (0.6.8-0.6.18 on a
CPU torch); here one import is made to fail on the installed release, so the words are held on every run.
"""

from __future__ import annotations

import importlib
import logging
import types

import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.errors import ApplyError
from _fp4_dynamo_shim.fp4 import replacement


def test_every_layer_gets_the_settings_and_the_release_and_is_undone_newest_first(unpatched, monkeypatch):
    """A layer the caller adds (as the import adds the export to children) is applied after the shim's own,
    with the same context, and revert() undoes it first: while it is undone the FP4 layer is still in place."""
    import flashinfer

    seen, undone = [], []

    class Recorder:
        @staticmethod
        def apply(context):
            seen.append(context)
            return types.SimpleNamespace(
                undo=lambda: undone.append(replacement.is_shim(flashinfer.fp4_quantize)), describe=lambda: {})

    for name, value in (("FALLBACK", "reference"), ("FLASHINFER_OPS", "off"), ("STRICT", "1")):
        monkeypatch.setenv(f"FP4_DYNAMO_SHIM_{name}", value)
    assert lifecycle.apply(route="a test", layers=(Recorder,))
    assert lifecycle.apply(route="a second route", layers=(Recorder,))  # applied already: nothing added
    [context] = seen
    assert (context.settings.fallback, context.settings.flashinfer_ops, context.settings.strict) == \
        ("reference", "off", True)
    assert (context.version, context.row, context.left) == (lifecycle.flashinfer_version(),) * 2 + ({},)
    assert fp4_dynamo_shim.status()["activated_by"] == "a test"
    assert fp4_dynamo_shim.status()["flashinfer_ops"]["gate"] == "off"
    assert fp4_dynamo_shim.revert() and undone == [True] and not replacement.is_shim(flashinfer.fp4_quantize)


def test_a_layer_that_fails_leaves_flashinfer_as_it_was(unpatched):
    """The layers already applied are undone, newest first, and apply() says why."""
    import flashinfer

    original = flashinfer.fp4_quantize

    class Failing:
        @staticmethod
        def apply(context):
            assert replacement.is_shim(flashinfer.fp4_quantize)  # the shim's own layers came first
            raise RuntimeError("a layer that fails")

    assert lifecycle.apply(route="a test", layers=(Failing,)) is False
    assert fp4_dynamo_shim.status()["problem"] == "RuntimeError: a layer that fails; FlashInfer was left untouched"
    assert flashinfer.fp4_quantize is original


def test_apply_logs_one_line_with_what_it_did_and_status_has_no_problem(unpatched, caplog):
    with caplog.at_level(logging.INFO, logger="fp4_dynamo_shim.lifecycle"):
        assert lifecycle.apply(route="a test")
    status = fp4_dynamo_shim.status()
    assert status["problem"] is None and status["activated_by"] == "a test"
    cuda = status["cuda_version"]
    assert [r.getMessage() for r in caplog.records if r.name == "fp4_dynamo_shim.lifecycle"] == [
        f"fp4_dynamo_shim applied to flashinfer {status['flashinfer']['version']} (by a test): {len(status['rebound'])} names "
        f"rebound, CUDA {cuda['value']} ({cuda['source']}), {len(status['devices'])} GPU(s)"]


def test_revert_says_so_in_status(unpatched):
    assert fp4_dynamo_shim.status()["problem"] == "revert() was called"


@pytest.mark.parametrize("failing", ["the FP4 module", "the JIT's CUDA lookups"])
def test_flashinfer_that_cannot_be_imported_is_refused_with_its_error_and_left_untouched(unpatched, monkeypatch,
                                                                                        failing):
    import flashinfer

    original = flashinfer.fp4_quantize
    failing_module = (lifecycle.fp4_releases.target_for(lifecycle.flashinfer_version()).module
                      if failing == "the FP4 module" else lifecycle.cuda_version.CPP_EXT)
    real_import = importlib.import_module

    def import_module(name, *args):
        if name == failing_module:
            raise RuntimeError("no GPU to ask")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert lifecycle.apply() is False
    assert fp4_dynamo_shim.status()["problem"] == (
        "ApplyError: importing flashinfer failed (RuntimeError: no GPU to ask); FlashInfer was left untouched")
    assert flashinfer.fp4_quantize is original
    monkeypatch.setenv("FP4_DYNAMO_SHIM_STRICT", "1")
    with pytest.raises(ApplyError, match=r"importing flashinfer failed \(RuntimeError: no GPU to ask\)"):
        lifecycle.apply()


def test_rebind_modules_rebinds_both_layers_originals_in_exactly_the_modules_given(monkeypatch):
    """A module that kept FlashInfer's originals some other way (as SGLang's do when imported before the shim):
    rebind_modules([it]) swaps the FP4 layer's and the CUDA-version layer's originals there, and nowhere else."""
    import sys
    import types

    import flashinfer
    from flashinfer.jit import cpp_ext

    fp4_dynamo_shim.revert()
    cuda_original, fp4_original = cpp_ext.get_cuda_version, flashinfer.fp4_quantize
    assert fp4_dynamo_shim.apply()
    cuda_replacement, fp4_replacement = cpp_ext.get_cuda_version, flashinfer.fp4_quantize
    given, other = types.ModuleType("kept_originals_given"), types.ModuleType("kept_originals_other")
    for module in (given, other):
        module.get_cuda_version, module.fp4_quantize = cuda_original, fp4_original
        monkeypatch.setitem(sys.modules, module.__name__, module)
    rebound = lifecycle.rebind_modules([given])
    assert (given.get_cuda_version, given.fp4_quantize) == (cuda_replacement, fp4_replacement)
    assert (other.get_cuda_version, other.fp4_quantize) == (cuda_original, fp4_original)
    assert {(b.module, b.name) for b in rebound} == {("kept_originals_given", "get_cuda_version"),
                                                     ("kept_originals_given", "fp4_quantize")}
    assert lifecycle.rebind_modules(iter([other])) and other.fp4_quantize is fp4_replacement  # any iterable, once


def test_a_cuda_version_problem_is_warned_in_its_own_words(monkeypatch, applied_with, tmp_path, said):
    """FP4_DYNAMO_SHIM_CUDA_VERSION=nvcc with no nvcc anywhere: apply() falls back to torch's version and
    says why, once, on the project's logger or stderr (status() keeps the same words)."""
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # a CUDA home with no nvcc in it
    status = applied_with(CUDA_VERSION="nvcc")
    problem = status["cuda_version"]["problem"]
    assert problem.startswith("FP4_DYNAMO_SHIM_CUDA_VERSION=nvcc, but no nvcc was found")
    assert [line for level, line in said() if level == "WARNING"] == [problem]
