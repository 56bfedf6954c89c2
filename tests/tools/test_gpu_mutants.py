"""The run that holds survivors.txt's gpu-only claims against the H200: its edits apply as mutmut wrote them,
its tests are the ones each reason names, and no claim stands that the H200 saw fail.

The GPU run itself (run_mutations.py --from on the GPU machine) is not repeated here; what it needs from
this side is: an edit that, applied as run_mutations applies every mutation (its ``old`` text must occur
once), gives the mutant's file, and a record that survivors.txt must agree with.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
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
    assert gpu_mutants.changed_lines(source, mutated) == "-    return x\n+    return None"


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


def test_no_gpu_only_claim_stands_that_the_gpu_saw_survive():
    run_mutmut = _load("run_mutmut")
    listed = run_mutmut.read_survivors()
    kills = json.loads(gpu_mutants.GPU_KILLS.read_text())
    assert run_mutmut.contradicted_gpu_claims(listed, kills) == []
    killed = [n for n, record in kills.items() if record["result"] == "caught" and n in listed]
    assert all(listed[n][0] == "gpu-only" for n in killed), "killed on the GPU, so neither equivalent nor open"
    assert all(record["tests"] for record in kills.values()), "each record says which tests it ran"


def _head(run_mutmut) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=run_mutmut.ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_gpu_record_counts_for_the_tests_the_line_names_today():
    run_mutmut = _load("run_mutmut")
    a, b = f"{GPU}test_gpu_a.py::test_a", f"{GPU}test_gpu_b.py::test_b"
    listed = {"m.x_f__mutmut_1": ("gpu-only", f"a CUDA branch; {a} and {b} see it")}
    record = lambda result, tests: {"m.x_f__mutmut_1": {"result": result, "tests": tests, "commit": _head(run_mutmut)}}
    # a kill by one of the named tests holds the claim; a kill by a test the line no longer names does not count
    assert run_mutmut.gpu_record("m.x_f__mutmut_1", listed, record("caught", [a])) is not None
    assert run_mutmut.gpu_record("m.x_f__mutmut_1", listed, record("caught", [f"{GPU}test_gpu_c.py"])) is None
    # a survival of every named test contradicts the claim; a survival of only some of them is not yet a verdict
    assert run_mutmut.contradicted_gpu_claims(listed, record("SURVIVED", [a, b])) == ["m.x_f__mutmut_1"]
    assert run_mutmut.contradicted_gpu_claims(listed, record("SURVIVED", [a])) == []
    # an equivalent or open line that a GPU test killed is contradicted, whichever test killed it
    for kind in ("equivalent", "open"):
        assert run_mutmut.contradicted_gpu_claims({"m.x_f__mutmut_1": (kind, "why")},
                                                  record("caught", [f"{GPU}test_gpu_c.py"])) == ["m.x_f__mutmut_1"]


def test_a_survival_stops_counting_once_its_named_tests_are_strengthened():
    """A real GPU test file, at the commit before its last change: the survival recorded then is not a verdict
    on the test as it is now."""
    run_mutmut = _load("run_mutmut")
    path = "tests/gpu/test_gpu_verify.py"
    older = subprocess.run(["git", "rev-list", "-n", "2", "HEAD", "--", path], cwd=run_mutmut.ROOT,
                           capture_output=True, text=True, check=True).stdout.split()[1]
    test = f"{path}::test_verify_on_the_gpu_says_what_each_branch_did"
    listed = {"m.x_f__mutmut_1": ("gpu-only", f"a CUDA branch; {test} sees it")}
    survived = lambda commit: {"m.x_f__mutmut_1": {"result": "SURVIVED", "tests": [test], "commit": commit}}
    assert run_mutmut.contradicted_gpu_claims(listed, survived(_head(run_mutmut))) == ["m.x_f__mutmut_1"]
    assert run_mutmut.contradicted_gpu_claims(listed, survived(older)) == []


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
