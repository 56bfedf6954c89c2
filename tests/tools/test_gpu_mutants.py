"""The run that holds survivors.txt's gpu-only claims against the GPU: its edits apply as mutmut wrote them,
its tests are the ones each reason names, and what the GPU machine reports is marked in survivors.txt.

The GPU run itself (run_mutations.py --from on the GPU machine) is not repeated here; what it needs from
this side is: an edit that, applied as run_mutations applies every mutation (its ``old`` text must occur
once), gives the mutant's file, and a list that says which claims a GPU run has shown.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
MUTATION = ROOT / "tools" / "mutation"
#: Made-up GPU test paths, spelled so that the harness check of named paths (test_gpu_harness) skips them.
GPU = "tests/" + "gpu/"


def _load(name: str):
    sys.path.insert(0, str(MUTATION))
    try:
        spec = importlib.util.spec_from_file_location(name, MUTATION / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(MUTATION))


gpu_mutants = _load("gpu_mutants")
run_mutations = _load("run_mutations")

# Lines that repeat, as source does (blank lines, "return x", closing brackets): the edit must widen past them.
_LINES = st.lists(st.sampled_from(["\n", "    return x\n", "    )\n", "def f(x):\n", "    y = 1\n", "z = 2\n"]),
                  min_size=1, max_size=30)


@given(lines=_LINES, at=st.integers(min_value=0), replacement=st.sampled_from(["    y = 2\n", "    return None\n", ""]))
def test_the_smallest_edit_occurs_once_and_applied_gives_the_mutant(lines, at, replacement):
    original = "".join(lines)
    index = at % len(lines)
    mutated = "".join(lines[:index] + [replacement] + lines[index + 1:])
    if mutated == original:
        return
    old, new = gpu_mutants.smallest_edit(original, mutated)
    assert original.count(old) == 1
    assert original.replace(old, new) == mutated


def test_a_mutant_is_packed_as_the_edit_run_mutations_applies(tmp_path):
    source = "def f(x):\n    return x\n\n\ndef g(x):\n    return x\n"
    mutated = source.replace("def g(x):\n    return x", "def g(x):\n    return None")
    old, new = gpu_mutants.smallest_edit(source, mutated)
    assert old == "def g(x):\n    return x\n"  # "    return x\n" alone occurs twice: widened by one line
    packed = tmp_path / "mutants.json"
    packed.write_text(json.dumps({"commit": "abc1234", "mutations": [
        {"name": "pkg.x_g__mutmut_1", "why": "why", "path": "src/m.py", "old": old, "new": new,
         "tests": [f"{GPU}test_x.py::test_y"]}]}))
    commit, mutations = run_mutations.load_mutations(packed)
    assert commit == "abc1234" and [m.tests for m in mutations] == [(f"{GPU}test_x.py::test_y",)]
    assert mutations[0].gpu and not mutations[0].fast
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "m.py").write_text(source)
    saved = run_mutations.apply(tree, mutations[0])
    assert (tree / "src" / "m.py").read_text() == mutated
    run_mutations.restore(tree, saved)
    assert (tree / "src" / "m.py").read_text() == source


def test_the_tests_are_those_the_reason_names_or_borrows():
    listed = {
        "m.x_f__mutmut_1": ("gpu-only", f"a CUDA branch; {GPU}test_gpu_a.py::test_b and test_gpu_c.py see it"),
        "m.x_f__mutmut_2": ("gpu-only", "as x_f__mutmut_1 (the same line)"),
        "m.x_f__mutmut_3": ("gpu-only", "a CUDA branch, no test named"),
        "m.x_f__mutmut_4": ("gpu-only", "as x_f__mutmut_4 (itself)"),
    }
    assert gpu_mutants.named_tests("m.x_f__mutmut_1", listed) == (f"{GPU}test_gpu_a.py::test_b", f"{GPU}test_gpu_c.py")
    assert gpu_mutants.named_tests("m.x_f__mutmut_2", listed) == gpu_mutants.named_tests("m.x_f__mutmut_1", listed)
    assert gpu_mutants.named_tests("m.x_f__mutmut_3", listed) == ()
    assert gpu_mutants.named_tests("m.x_f__mutmut_4", listed) == ()


def test_every_gpu_only_line_of_survivors_txt_names_a_gpu_test_that_exists():
    listed = gpu_mutants.read_survivors()
    claims = [name for name, (kind, _) in listed.items() if kind in ("gpu-only", "gpu-killed")]
    assert claims
    unnamed = [name for name in claims if not gpu_mutants.named_tests(name, listed)]
    assert unnamed == [], "pack cannot run these on the GPU"
    files = {test.split("::")[0] for name in claims for test in gpu_mutants.named_tests(name, listed)}
    assert sorted(file for file in files if not (ROOT / file).exists()) == []


def test_the_gpus_kills_are_marked_and_its_survivals_reported(tmp_path):
    survivors = tmp_path / "survivors.txt"
    survivors.write_text("# kinds\n"
                         f"m.x_f__mutmut_{{1,2,3}}  # gpu-only: a CUDA branch; {GPU}test_gpu_a.py sees it\n"
                         "m.x_g__mutmut_1  # equivalent: nothing observable\n")
    report = tmp_path / "kills.json"
    result = lambda name, outcome: {"name": name, "result": outcome, "detail": "d", "tests": [], "seconds": 1}
    report.write_text(json.dumps({"commit": "abc1234", "results": [
        result("m.x_f__mutmut_1", "caught"), result("m.x_f__mutmut_3", "caught"),
        result("m.x_f__mutmut_2", "SURVIVED"), result("m.x_g__mutmut_1", "caught")]}))
    problems = gpu_mutants.record([report], survivors)
    assert [problem.split(":")[0] for problem in problems] == ["m.x_f__mutmut_2", "m.x_g__mutmut_1"]
    assert survivors.read_text() == (
        "# kinds\n"
        f"m.x_f__mutmut_{{1,3}}  # gpu-killed: a CUDA branch; {GPU}test_gpu_a.py sees it\n"
        f"m.x_f__mutmut_2  # gpu-only: a CUDA branch; {GPU}test_gpu_a.py sees it\n"
        "m.x_g__mutmut_1  # equivalent: nothing observable\n")


def test_a_mutant_is_caught_by_a_failing_test_a_timeout_or_a_crash_not_by_a_collection_error(tmp_path):
    packed = tmp_path / "mutants.json"
    packed.write_text(json.dumps({"commit": "abc1234", "mutations": [
        {"name": "pkg.x_g__mutmut_1", "why": "why", "path": "src/m.py", "old": "a", "new": "b",
         "tests": [f"{GPU}test_x.py::test_y"]}]}))
    _, (mutation,) = run_mutations.load_mutations(packed)
    verdict = lambda code, failed: run_mutations.outcome(mutation, code, failed, 0.0)
    assert verdict(1, ["tests.test_x::test_y: AssertionError"])["result"] == "caught"
    assert verdict("timeout", [])["result"] == "caught"
    crashed = verdict(-11, ["pytest exit -11: Fatal Python error: Segmentation fault"])
    assert crashed["result"] == "caught" and crashed["detail"].startswith("the named tests crashed (signal 11): ")
    assert verdict(2, ["pytest exit 2: ERROR collecting"])["result"] == "SURVIVED"
    assert verdict(0, [])["result"] == "SURVIVED" and verdict(0, [])["tests"] == [f"{GPU}test_x.py::test_y"]
