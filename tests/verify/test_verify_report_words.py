"""verify's report (``verify/report.py``) in this process: the words of its text output, its JSON document, how a
check's outcome becomes a line, and its exit codes.

The command line as users run it (a child process per call) is tested in test_command_line.py and test_activation.py;
here ``cli.main(["verify", ...])`` and the report's helpers are called directly, so that a change to what verify prints is seen by a
test that reaches it (and by mutmut's trampolines, which do not follow child processes). Stand-ins: the status
and environment that ``_print_text`` words are written out here (every field it reads, with values no machine
here has: two GPUs, a GPU record, a warning), and ``main``'s check list where the test needs a failing or
raising check; the checks themselves are test_verify_checks_on_cpu.py's and test_verify_checks_see_their_faults.py's.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

import fp4_dynamo_shim
import verify_text
from _fp4_dynamo_shim import cli
from _fp4_dynamo_shim.verify import checks, report

ENVIRONMENT = {"fp4_dynamo_shim": "9.9", "python": "3.11.7", "torch": "2.13.0+cpu", "cuda": "12.8",
               "gpus": [{"index": 0, "name": "NVIDIA B200", "arch": "SM100", "fp4_kernel": True},
                        {"index": 1, "name": "NVIDIA H200", "arch": "SM90", "fp4_kernel": False}],
               "flashinfer": {"version": "0.6.12", "tested": True, "matched_row": "0.6.12", "parts": None},
               "supported_flashinfer": ">=0.6.1,<0.8",
               "sglang": {"need": "SGLang 0.5.11: needs the shim", "note": "a note"}, "jit_cache": "/cache"}
LAYER = {"gate": "proven", "state": "registered", "counts": {"registered": 26, "declared": 40}, "unproven": [],
         "proven": {"flashinfer": "0.6.12", "declarations": 26, "functions": ["a", "b", "c"],
                    "date": "2026-12-02", "machine": "H200", "torch": "2.11", "shim": "abc1234",
                    "functions_passed": 3, "functions_run": 4}}
STATUS = {"applied": True, "cuda_version": {"value": "12.8", "source": "torch"}, "fallback": "error",
          "op": "fp4_dynamo_shim::fp4_quantize",
          "devices": [{"index": 0, "backend": "100", "mode": "kernel", "load_seconds": 1.25},
                      {"index": 1, "backend": "90", "mode": "error", "load_seconds": None}],
          "activated_by": "pth",
          "rebound": ["flashinfer.fp4_quantize", "flashinfer.quantization.fp4_quantize", "sglang.x._private",
                      "sglang.y.fp4_quantize"],
          "family": {"nvfp4_quantize": "op-backed", "mm_fp4": "original"},
          "flashinfer_ops": LAYER, "skipped": ["nothing to rebind in z"],
          "routes": {"pth": "/site/fp4_dynamo_shim.pth", "sitecustomize": None, "plugin": "entry point"},
          "warnings": ["a warning"], "problem": None, "flashinfer": ENVIRONMENT["flashinfer"]}
RESULTS = [report.Result("trace-static", "pass", "1 graph", 0.25), report.Result("cuda-graph", "skip", "no GPU", 0.0),
           report.Result("opcheck", "fail", "AssertionError: x", 1.5)]

TEXT = """\
fp4-dynamo-shim 9.9 verify
environment
  python       3.11.7
  torch        2.13.0+cpu (CUDA 12.8)
  gpu          cuda:0 NVIDIA B200 SM100, FP4 quantize kernel: yes
  gpu          cuda:1 NVIDIA H200 SM90, FP4 quantize kernel: no (Blackwell SM100+ only)
  flashinfer   0.6.12 (tested range: >=0.6.1,<0.8)
  sglang       SGLang 0.5.11: needs the shim (a note)
  jit cache    /cache
shim applied: CUDA version 12.8 (from torch), fallback=error, op fp4_dynamo_shim::fp4_quantize
  cuda:0 SM100: kernel, loaded in 1.2 s
  cuda:1 SM90: error
  activated by pth; 4 names rebound (--verbose lists each module)
    flashinfer: 2 module(s): fp4_quantize
    sglang: 2 module(s): fp4_quantize
  family: nvfp4_quantize: op-backed
  family: mm_fp4: original
  flashinfer ops (FP4_DYNAMO_SHIM_FLASHINFER_OPS=proven): registered; 26 of 40 declarations registered; \
GPU record for FlashInfer 0.6.12: 26 declarations through 3 functions (2026-12-02, H200, torch 2.11, shim abc1234)
  skipped: nothing to rebind in z
routes installed: pth (/site/fp4_dynamo_shim.pth), plugin (entry point)
  warning: a warning
checks
  PASS  trace-static       1 graph [0.2 s]
  SKIP  cuda-graph         no GPU [0.0 s]
  FAIL  opcheck            AssertionError: x [1.5 s]
summary: 1 passed, 1 failed, 1 skipped; exit 1
"""


def _flashinfer_ops_line(layer) -> str:
    return verify_text.flashinfer_ops_line(ENVIRONMENT, {**STATUS, "flashinfer_ops": layer})


def _rebound_lines(rebound, verbose) -> list:
    return verify_text.rebound_lines(ENVIRONMENT, {**STATUS, "rebound": rebound}, verbose)


def main_runs(monkeypatch, *checks):
    """main's list of (name, check, the part it needs), stood in where a test needs a check that fails, raises or
    records its device (the real checks are test_verify_checks_on_cpu.py's)."""
    monkeypatch.setattr(report, "ordered_checks", lambda: [(name, check, None) for name, check in checks])


def raising(error):
    """A check that raises ``error``."""
    def check(device):
        raise error
    return check


def test_the_text_report_words_every_field_it_shows(capsys):
    verify_text.print_report(ENVIRONMENT, STATUS, RESULTS, 1)
    assert capsys.readouterr().out == TEXT


def test_verbose_lists_each_module_and_a_package_of_private_names_says_so(capsys):
    verify_text.print_report(ENVIRONMENT, STATUS, [], 0, verbose=True)
    out = capsys.readouterr().out
    assert "  activated by pth; 4 names rebound\n" in out
    assert ("    flashinfer: fp4_quantize\n    flashinfer.quantization: fp4_quantize\n    sglang.x: _private\n"
            "    sglang.y: fp4_quantize\n") in out
    assert "checks\n" not in out and out.endswith("summary: 0 passed, 0 failed, 0 skipped; exit 0\n")
    assert _rebound_lines(["pkg.a._hidden"], verbose=False) == ["    pkg: 1 module(s): (private names only)"]
    two = ["pkg.a.fp4_quantize", "pkg.a.mm_fp4", "pkg.b.fp4_quantize"]
    assert _rebound_lines(two, verbose=True) == ["    pkg.a: fp4_quantize, mm_fp4", "    pkg.b: fp4_quantize"]
    assert _rebound_lines(two, verbose=False) == ["    pkg: 2 module(s): fp4_quantize, mm_fp4"]


def test_a_report_without_the_shim_says_why_and_that_nothing_is_installed(capsys):
    environment = {**ENVIRONMENT, "gpus": [], "sglang": {"need": None, "note": None}}
    status = {**STATUS, "applied": False, "problem": "switched off", "routes": {"pth": None}, "warnings": []}
    verify_text.print_report(environment, status, [report.Result("apply", "skip", "switched off", 0.0)], 2)
    out = capsys.readouterr().out
    assert "  gpu          none visible\n  flashinfer" in out and "  sglang       not installed\n" in out
    assert "shim NOT applied: switched off\nroutes installed: none\nchecks\n" in out
    assert out.endswith("  SKIP  apply              switched off [0.0 s]\nsummary: 0 passed, 0 failed, 1 skipped; exit 2\n")


def test_the_gpu_record_line_per_gate_and_state():
    registered = "26 of 40 declarations registered"
    assert _flashinfer_ops_line({**LAYER, "gate": "sglang"}).endswith(registered)
    assert _flashinfer_ops_line({**LAYER, "state": "waiting"}).endswith(registered)
    assert _flashinfer_ops_line({**LAYER, "proven": None}).endswith(
        f"{registered}; no GPU record for the installed FlashInfer: SGLang's calls only")
    assert _flashinfer_ops_line({**LAYER, "gate": "all", "proven": None}).endswith(
        f"{registered}; no GPU record for the installed FlashInfer")
    assert f"{registered}; GPU record for FlashInfer 0.6.12" in _flashinfer_ops_line({**LAYER, "gate": "all"})
    assert _flashinfer_ops_line({**LAYER, "gate": "all", "unproven": ["a", "b"]}).endswith(
        "shim abc1234); 2 registered without a GPU proof (status()['flashinfer_ops']['unproven'])")


def test_the_json_document_counts_each_kind_of_result():
    results = RESULTS + [report.Result("baseline", "info", "unpatched", 2.0)]
    document = report.json_document(ENVIRONMENT, STATUS, "cpu", results, 1)
    assert list(document) == ["environment", "status", "device", "checks", "summary", "exit_code"]
    assert document["summary"] == {"pass": 1, "fail": 1, "skip": 1, "info": 1}
    assert document["checks"][2] == {"name": "opcheck", "result": "fail", "detail": "AssertionError: x", "seconds": 1.5}
    assert (document["device"], document["exit_code"], document["status"]) == ("cpu", 1, STATUS)


def test_a_check_becomes_a_result_line(monkeypatch):
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))

    failing, skipping = raising(ValueError("first line\nsecond line")), raising(checks.Skip("not here"))
    passed = report.run_check("a", lambda device: f"ran on {device}", "cpu")
    assert (passed.name, passed.result, passed.detail) == ("a", "pass", "ran on cpu")
    skipped, failed = report.run_check("b", skipping, "cpu"), report.run_check("c", failing, "cpu")
    assert (skipped.result, skipped.detail) == ("skip", "not here")
    assert (failed.result, failed.detail) == ("fail", "ValueError: first line")
    long = report.run_check("d", raising(ValueError("y" * 2000)), "cpu")
    assert long.detail == ("ValueError: " + "y" * 2000)[:1000]
    assert report.run_check("baseline", lambda device: "unpatched", "cpu").result == "info"
    assert report.run_check("baseline", skipping, "cpu").result == "skip"
    assert len(resets) == 6  # Dynamo is reset after every check, whatever its outcome


def test_exit_codes_of_main(monkeypatch, capsys):
    main_runs(monkeypatch, ("passes", lambda device: "fine"), ("skips", raising(checks.Skip("no"))))
    assert cli.main(["verify", "--json", "--device", "cpu"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in document["checks"]] == ["passes", "skips"] and document["status"]["applied"]
    main_runs(monkeypatch, ("fails", raising(ZeroDivisionError("division by zero"))))
    assert cli.main(["verify", "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert "  FAIL  fails              ZeroDivisionError: division by zero" in captured.out
    assert "  running fails ..." in captured.err
    assert cli.main(["verify", "--json", "--device", "cpu", "--baseline"]) == 1
    names = [c["name"] for c in json.loads(capsys.readouterr().out)["checks"]]
    assert names == ["fails", "baseline"]  # on CPU the baseline is a skip, after every other check
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as usage:
            cli.main(["verify", "--device", "cuda"])
        assert usage.value.code == 3
        assert capsys.readouterr().err.endswith("fp4-dynamo-shim verify: error: --device cuda: no GPU visible\n")


def test_main_with_the_shim_switched_off_reports_the_apply_and_exits_2(unpatched, monkeypatch, capsys):
    monkeypatch.setenv("FP4_DYNAMO_SHIM_DISABLE", "1")
    assert cli.main(["verify", "--json", "--device", "cpu"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["result"]) for c in document["checks"]] == [("apply", "skip")]
    assert not document["status"]["applied"]


def test_the_environment_names_what_verify_prints():
    environment = report.environment()
    assert set(environment) == {"python", "torch", "cuda", "gpus", "flashinfer", "supported_flashinfer", "sglang",
                                "fp4_dynamo_shim", "jit_cache"}
    assert environment["torch"] == torch.__version__ and environment["fp4_dynamo_shim"] == fp4_dynamo_shim.__version__




def test_the_command_line_help_version_and_a_device_it_does_not_know(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal
    with pytest.raises(SystemExit) as done:
        cli.main(["verify", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: fp4-dynamo-shim verify")  # the page: cli_help.txt
    with pytest.raises(SystemExit) as done:
        cli.main(["verify", "--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"fp4-dynamo-shim {fp4_dynamo_shim.__version__}\n"
    with pytest.raises(SystemExit) as done:
        cli.main(["verify", "--device", "gpu"])
    assert done.value.code == 3 and "argument --device: invalid choice: 'gpu'" in capsys.readouterr().err


def test_main_hands_every_check_and_the_baseline_its_device_and_prints_what_they_gave(monkeypatch, capsys):
    """With a GPU visible the default device is cuda (torch's answer replaced: none is visible here; the
    environment is the stand-in above, since reading a GPU's name needs one)."""
    seen = []

    def check(device):
        seen.append(device)
        return f"ran on {device}"

    main_runs(monkeypatch, ("one", check))
    monkeypatch.setattr(checks, "check_baseline", lambda device: seen.append(("baseline", device)) or "shown")
    monkeypatch.setattr(report, "environment", lambda: ENVIRONMENT)
    assert cli.main(["verify", "--json", "--baseline"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    assert out == json.dumps(document, indent=2) + "\n"
    assert (document["environment"], document["device"], document["exit_code"]) == (ENVIRONMENT, "cpu", 0)
    assert [(c["name"], c["result"], c["detail"]) for c in document["checks"]] == [
        ("one", "pass", "ran on cpu"), ("baseline", "info", "shown")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(["verify", "--verbose"]) == 0
    text = capsys.readouterr().out
    assert seen == ["cpu", ("baseline", "cpu"), "cuda"]
    assert "  PASS  one                ran on cuda [" in text
    assert text.endswith("summary: 1 passed, 0 failed, 0 skipped; exit 0\n")
    assert " names rebound\n" in text and "(--verbose lists each module)" not in text
    assert cli.main(["verify"]) == 0 and " names rebound (--verbose lists each module)\n" in capsys.readouterr().out


@pytest.mark.parametrize("outcome", ["applied", "refused", "strict", "switched off"])
def test_the_apply_check_says_what_applying_gave_and_how_long_it_took(outcome, unpatched, monkeypatch):
    """Refused: a FlashInfer outside the supported range (its installed version stood in at importlib.metadata)."""
    import importlib.metadata

    installed = importlib.metadata.version
    if outcome in ("refused", "strict"):
        monkeypatch.setattr(importlib.metadata, "version",
                            lambda name: "0.5.2" if name == "flashinfer-python" else installed(name))
    monkeypatch.setenv("FP4_DYNAMO_SHIM_STRICT", "1" if outcome == "strict" else "0")
    monkeypatch.setenv("FP4_DYNAMO_SHIM_DISABLE", "1" if outcome == "switched off" else "0")
    clock = iter([10.0])  # the check's start; every later reading, its end included, is 11.23456
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock, 11.23456))
    result = report.apply_shim()
    unsupported = fp4_dynamo_shim.status()["problem"]  # the refusal's own words (status() keeps them)
    if outcome in ("refused", "strict"):
        assert unsupported.startswith("flashinfer-python 0.5.2 is not supported"), unsupported
    assert (result.name, result.result, result.detail) == {
        "applied": ("apply", "pass", "applied"),
        "refused": ("apply", "fail", unsupported),
        "strict": ("apply", "fail", f"ApplyError: {unsupported}"),
        "switched off": ("apply", "skip", "FP4_DYNAMO_SHIM_DISABLE=1 is set: the shim is switched off on every route"),
    }[outcome]
    assert result.seconds == 1.23 and fp4_dynamo_shim.status()["activated_by"] == (
        report.ROUTE if outcome == "applied" else None)


def test_a_checks_seconds_are_the_clocks_difference_to_a_hundredth(monkeypatch):
    clock = iter([5.0, 7.456])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    assert report.run_check("a", lambda device: "x", "cpu").seconds == 2.46


def test_the_environment_lists_each_gpu_and_flashinfers_jit_cache(monkeypatch):
    """Three GPUs through torch's own queries replaced (none is visible here): the FP4 kernel is Blackwell's,
    SM100 and SM120 (major >= 10), not SM90's."""
    from flashinfer.jit import env as jit_env

    capabilities = {0: (10, 0), 1: (9, 0), 2: (12, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capabilities[index])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU {index}")
    environment = report.environment()
    assert environment["gpus"] == [
        {"index": 0, "name": "GPU 0", "arch": "SM100", "fp4_kernel": True},
        {"index": 1, "name": "GPU 1", "arch": "SM90", "fp4_kernel": False},
        {"index": 2, "name": "GPU 2", "arch": "SM120", "fp4_kernel": True}]
    assert environment["jit_cache"] == str(jit_env.FLASHINFER_JIT_DIR)


def test_without_flashinfers_jit_settings_the_environment_has_no_jit_cache(monkeypatch):
    import sys

    import flashinfer.jit

    monkeypatch.delattr(flashinfer.jit, "env")
    monkeypatch.setitem(sys.modules, "flashinfer.jit.env", None)  # importing it now raises ImportError
    assert report.environment()["jit_cache"] is None
