"""The curated mutations (tools/mutation/mutations.toml) still apply to today's source.

A snippet that no longer occurs exactly once in src/ makes its mutation STALE when run_mutations.py reaches it,
which for the slow ones is only in a long --all run; this says so in the quick command, without running any.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import names_a_test

ROOT = Path(__file__).resolve().parents[2]
MUTATION = ROOT / "tools" / "mutation"

sys.path.insert(0, str(MUTATION))
try:
    run_mutations = importlib.import_module("run_mutations")
finally:
    sys.path.remove(str(MUTATION))


def test_every_curated_mutation_has_a_name_of_its_own_tests_and_snippets_that_occur_once():
    mutations = run_mutations.curated_mutations()
    assert len({m.name for m in mutations}) == len(mutations)
    assert [m.name for m in mutations if not m.tests] == []
    stale = [m.name for m in mutations for path, old, _ in m.edits if (ROOT / path).read_text().count(old) != 1]
    assert stale == []


def test_every_test_a_curated_mutation_names_exists():
    """A renamed test leaves its mutation naming one that never runs: CI's baseline stage refuses it, after the
    whole quick command; this says so within it."""
    assert [(mutation.name, test) for mutation in run_mutations.curated_mutations() for test in mutation.tests
            if not names_a_test(test, ROOT)] == []


@pytest.mark.slow
def test_a_catch_by_a_test_that_fails_unmutated_too_is_void(tmp_path):
    """A mutation counts as caught only when the test that caught it passes on the unmutated copy, run the same
    way; here in a project of one function, where one named test fails whatever the code says."""
    project = tmp_path / "project"
    for name in ("mutation/run_mutations.py", "junit_reports.py", "cores.py"):
        (project / "tools" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "tools" / name, project / "tools" / name)
    (project / "src").mkdir()
    (project / "src" / "answer.py").write_text("def answer():\n    return 42\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_answer.py").write_text(
        "from answer import answer\n\n\ndef test_answer():\n    assert answer() == 42\n\n\n"
        "def test_fails_whatever_the_code_says():\n    assert answer() == 41\n")
    mutation = {"path": "src/answer.py", "old": "return 42", "new": "return 43", "why": "a wrong answer"}
    pack = tmp_path / "pack.json"
    pack.write_text(json.dumps({"commit": "none", "mutations": [
        {**mutation, "name": "told-by-its-test", "tests": ["tests/test_answer.py::test_answer"]},
        {**mutation, "name": "told-by-a-broken-test", "tests": ["tests/test_answer.py::test_fails_whatever_the_code_says"]},
    ]}))
    run = subprocess.run([sys.executable, str(project / "tools" / "mutation" / "run_mutations.py"), "--gpu", "--from",
                          str(pack), "--no-fork", "--jobs", "1", "--json", str(tmp_path / "results.json")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    results = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    assert run.returncode == 1, run.stdout + run.stderr
    assert results["told-by-its-test"]["result"] == "caught"
    assert results["told-by-a-broken-test"]["result"] == "VOID"
    assert "tests/test_answer.py::test_fails_whatever_the_code_says" in results["told-by-a-broken-test"]["detail"]
    assert "1/2 mutations caught" in run.stdout
