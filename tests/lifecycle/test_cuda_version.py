"""The CUDA version FlashInfer's JIT is told: torch's by default, nvcc's on request, FlashInfer's own lookup
when neither knows one.

Stand-ins, named where used: an ``nvcc`` that is a shell script printing a fixed release (this machine
has no CUDA toolkit), and ``torch.version.cuda`` set by hand (this torch is a CPU build, which has none).
"""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from _fp4_dynamo_shim import cuda_version


@pytest.fixture
def nvcc_12_4(tmp_path, monkeypatch):
    """A CUDA home whose bin/nvcc reports release 12.4, as `nvcc --version` prints it."""
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    return str(nvcc)


@pytest.fixture
def torch_built_for(monkeypatch):
    def built_for(version):
        monkeypatch.setattr(torch.version, "cuda", version)  # stand-in: this torch is a CPU build
    return built_for


def test_default_is_torchs_cuda_even_when_nvcc_reports_another(nvcc_12_4, torch_built_for):
    torch_built_for("12.8")
    resolved = cuda_version.resolve("torch")
    assert (resolved.version, resolved.source, resolved.nvcc, resolved.nvcc_path) == (
        Version("12.8"), "torch", Version("12.4"), nvcc_12_4)


def test_nvcc_is_used_when_asked_for_or_when_torch_has_no_cuda(nvcc_12_4, torch_built_for):
    torch_built_for("12.8")
    assert (cuda_version.resolve("nvcc").version, cuda_version.resolve("nvcc").source) == (Version("12.4"), "nvcc")
    torch_built_for(None)
    assert (cuda_version.resolve("torch").version, cuda_version.resolve("torch").source) == (Version("12.4"), "nvcc")


def test_without_nvcc_asking_for_nvcc_falls_back_to_torch(tmp_path, monkeypatch, torch_built_for):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # FlashInfer looks only under $CUDA_HOME when it is set
    torch_built_for("12.9")
    assert (cuda_version.resolve("nvcc").version, cuda_version.resolve("nvcc").source) == (Version("12.9"), "torch")


def test_an_explicit_version_wins_and_a_malformed_one_is_refused(nvcc_12_4):
    assert (cuda_version.resolve("13.0").version, cuda_version.resolve("13.0").source) == (Version("13.0"), "environment")
    with pytest.raises(ValueError, match="FP4_DYNAMO_SHIM_CUDA_VERSION='twelve'"):
        cuda_version.resolve("twelve")


def test_replacements_answer_from_the_resolved_version():
    resolved = cuda_version.CudaVersion(Version("12.8"), "torch", None, None)

    def flashinfer_lookup():
        raise AssertionError("FlashInfer's own lookup must not run when a version is known")

    get, at_least = cuda_version.make_replacements(resolved, flashinfer_lookup)
    assert get() == Version("12.8")
    assert [at_least(v) for v in ("12", "12.8", "12.8.0", "12.9", "13.0", "11.8")] == [
        True, True, True, False, False, True]


def test_with_no_version_known_the_replacements_defer_to_flashinfers_lookup_each_call():
    answers = iter([Version("11.2"), Version("12.6"), Version("12.6")])
    calls = []

    def flashinfer_lookup():  # stands in for FlashInfer's nvcc query, which has nothing to find here
        calls.append(1)
        return next(answers)

    get, at_least = cuda_version.make_replacements(cuda_version.CudaVersion(None, "none", None, None), flashinfer_lookup)
    assert get() == Version("11.2")
    assert at_least("12.0") and not at_least("12.8")
    assert len(calls) == 3
