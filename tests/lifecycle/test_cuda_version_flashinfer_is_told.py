"""The CUDA version FlashInfer's JIT is told: torch's by default, nvcc's on request, FlashInfer's own lookup
when neither knows one.

Stand-ins, named where used: an ``nvcc`` that is a shell script printing a fixed release (this machine
has no CUDA toolkit), and ``torch.version.cuda`` set by hand (this torch is a CPU build, which has none).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from packaging.version import Version

import fp4_dynamo_shim
from _fp4_dynamo_shim import cuda_version
from fp4_dynamo_shim.errors import ApplyError


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


# --- nvcc failing in each way it can: the outcome is the documented fallback, said, or strict's ApplyError ---------

NVCC_FAULTS = {
    "missing": None,
    "non-zero exit": "#!/bin/sh\necho 'nvcc fatal : something broke' >&2\nexit 3\n",
    "hang": "#!/bin/sh\nexec sleep 30\n",
    "unparsable output": "#!/bin/sh\necho 'Cuda compilation tools, version twelve'\n",
    "not executable": "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n",
}
NVCC_PROBLEMS = {"missing": "no nvcc was found", "non-zero exit": "exited with status 3",
                 "hang": "did not finish in 1 s", "unparsable output": "printed no 'release X.Y,'",
                 "not executable": "could not run (PermissionError: "}


@pytest.fixture(params=NVCC_FAULTS)
def failing_nvcc(request, tmp_path, monkeypatch):
    """A CUDA home whose bin/nvcc fails in one way (a shell script: this machine has no CUDA toolkit); the
    timeout is 1 s here so that the hanging one costs a second, not the 30 s apply() would wait."""
    (tmp_path / "bin").mkdir()
    script = NVCC_FAULTS[request.param]
    if script is not None:
        nvcc = tmp_path / "bin" / "nvcc"
        nvcc.write_text(script)
        nvcc.chmod(0o644 if request.param == "not executable" else 0o755)  # no x bit stops even root
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(cuda_version, "NVCC_TIMEOUT_S", 1)
    return request.param


def test_each_nvcc_failure_falls_back_to_torchs_version_and_says_why(failing_nvcc, torch_built_for):
    torch_built_for("12.8")
    resolved = cuda_version.resolve("nvcc")
    assert (resolved.version, resolved.source, resolved.nvcc) == (Version("12.8"), "torch", None)
    assert NVCC_PROBLEMS[failing_nvcc] in resolved.problem and "torch's CUDA 12.8" in resolved.problem
    assert cuda_version.resolve("torch").problem is None  # nvcc was not asked for: nothing to say


def test_each_nvcc_failure_is_a_warning_in_status_and_an_apply_error_under_strict(failing_nvcc, applied_with):
    import flashinfer
    from flashinfer.jit import cpp_ext

    status = applied_with(CUDA_VERSION="nvcc")
    assert status["applied"] and NVCC_PROBLEMS[failing_nvcc] in status["cuda_version"]["problem"]
    assert any(NVCC_PROBLEMS[failing_nvcc] in warning for warning in status["warnings"])
    fp4_dynamo_shim.revert()
    before = (flashinfer.fp4_quantize, cpp_ext.get_cuda_version, cpp_ext.is_cuda_version_at_least)
    with pytest.raises(ApplyError, match=re.escape(NVCC_PROBLEMS[failing_nvcc])):
        applied_with(CUDA_VERSION="nvcc", STRICT="1")
    assert (flashinfer.fp4_quantize, cpp_ext.get_cuda_version, cpp_ext.is_cuda_version_at_least) == before


# --- where nvcc is looked for, how versions compare, and what a mismatch says ---------------------------------------

def _nvcc_in(folder, release="12.4"):
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return str(nvcc)


def test_nvcc_is_looked_for_where_flashinfer_looks(tmp_path, monkeypatch):
    """$CUDA_HOME alone when set (even without nvcc there), else $CUDA_PATH, else PATH, else /usr/local/cuda."""
    on_path = _nvcc_in(tmp_path / "path")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert cuda_version.find_nvcc() == on_path
    in_cuda_path = _nvcc_in(tmp_path / "cuda_path" / "bin")
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda_path"))
    assert cuda_version.find_nvcc() == in_cuda_path
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))
    assert cuda_version.find_nvcc() is None  # set, and nothing there: FlashInfer does not look further either
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    checked = []
    monkeypatch.setattr(os.path, "exists", lambda path: checked.append(path) or True)
    assert cuda_version.find_nvcc() == "/usr/local/cuda/bin/nvcc" and checked[-1] == "/usr/local/cuda/bin/nvcc"
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert cuda_version.find_nvcc() is None


@pytest.mark.parametrize("resolved, asked, answer", [
    ("13", "13", True), ("13", "13.0", True), ("13", "13.0.0", True), ("13", "13.1", False), ("13", "13.0.1", False),
    ("12.8", "12.8.0", True), ("12.8", "12.8.1", False), ("12.8", "12.9", False), ("12.8", "12", True),
])
def test_version_comparisons_pad_missing_parts_with_zeros_as_packaging_does(resolved, asked, answer):
    from packaging.version import Version as V

    _, at_least = cuda_version.make_replacements(cuda_version.resolve(resolved), None)
    assert at_least(asked) is answer is (V(resolved) >= V(asked))


def test_with_no_version_known_at_least_compares_flashinfers_own_answer_including_equality():
    unknown = cuda_version.CudaVersion(None, "none", None, None)
    _, at_least = cuda_version.make_replacements(unknown, lambda: Version("12.8"))
    assert at_least("12.8") and at_least("12.4") and not at_least("12.9")


def test_a_mismatch_between_nvcc_and_torch_is_one_warning_naming_both_and_the_choice(nvcc_12_4, torch_built_for,
                                                                                     caplog):
    torch_built_for("12.8")
    with caplog.at_level("WARNING", logger="fp4_dynamo_shim"):
        cuda_version.resolve("torch")
    assert [record.getMessage() for record in caplog.records] == [
        f"nvcc at {nvcc_12_4} is CUDA 12.4 but torch was built for CUDA 12.8; FlashInfer's JIT will be told 12.8 "
        "(torch). Set FP4_DYNAMO_SHIM_CUDA_VERSION=nvcc|torch|X.Y to choose."]
    caplog.clear()
    torch_built_for("12.4.1")  # same major.minor: no mismatch
    with caplog.at_level("WARNING", logger="fp4_dynamo_shim"):
        cuda_version.resolve("torch")
    assert caplog.records == []


def test_neither_torch_nor_nvcc_is_source_none_and_says_what_nvcc_lacked(tmp_path, monkeypatch, torch_built_for):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    torch_built_for(None)
    resolved = cuda_version.resolve("nvcc")
    assert (resolved.version, resolved.source) == (None, "none")
    assert resolved.problem == ("FP4_DYNAMO_SHIM_CUDA_VERSION=nvcc, but no nvcc was found ($CUDA_HOME/bin, PATH, "
                                "/usr/local/cuda/bin); FlashInfer's JIT is told nothing new (its own lookup is kept)")


def test_with_no_version_known_flashinfers_lookup_fails_after_apply_as_it_does_without_the_shim(tmp_path,
                                                                                             applied_with,
                                                                                             monkeypatch):
    """No CUDA torch and no nvcc: the replacements defer to FlashInfer's own lookup, which must fail the way it
    fails without the shim (not with an error of the shim's making)."""
    from flashinfer.jit import cpp_ext

    if torch.version.cuda is not None:
        pytest.skip("this torch knows its CUDA version")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # FlashInfer looks only there when it is set
    status = applied_with(CUDA_VERSION=None)
    assert status["applied"] and status["cuda_version"]["source"] == "none"
    with pytest.raises(Exception) as shimmed:
        cpp_ext.get_cuda_version()
    fp4_dynamo_shim.revert()
    with pytest.raises(Exception) as own:
        cpp_ext.get_cuda_version()
    assert type(shimmed.value) is type(own.value) and str(shimmed.value) == str(own.value)
