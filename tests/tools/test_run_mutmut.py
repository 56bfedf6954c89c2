"""What run_mutmut.py keeps in the tree, and when a survivors-only rerun may complete a group's recorded run.

The tree keeps the survivors list, the score per module and the sample of killed mutants CI draws from; these
tests hold each to the groups of groups.toml, and the rewriting of each to what a run found.

A survivors-only rerun is valid only over the same mutants. mutmut names a mutant by its function and its place
among that function's mutations, and mutates no triple-quoted string, so a change to docstrings, comments or
layout leaves every mutant and name as it was; any other change may not. These tests hold ``code_only`` (the
comparison) against mutmut's own mutation of the project's real source files, and ``why_not_the_same_mutants``
against a recorded run's digests.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from helpers import names_a_test

ROOT = Path(__file__).resolve().parents[2]
MUTATION = ROOT / "tools" / "mutation"


sys.path.insert(0, str(MUTATION))
try:
    run_mutmut = importlib.import_module("run_mutmut")  # as gpu_mutants imports it: one module object
finally:
    sys.path.remove(str(MUTATION))
SOURCES = sorted(p for p in (ROOT / "src" / "_fp4_dynamo_shim").rglob("*.py") if p.read_text().strip())


def mutants(text: str) -> list:
    """Each mutant mutmut makes of ``text``, in its order: the function it is in, the code before and after.
    mutmut is a development tool, not in the test extra: CI's mutmut stage installs it and runs this file."""
    create_mutations = pytest.importorskip("mutmut.mutation.file_mutation", reason="mutmut is not installed "
                                           "(pip install mutmut==3.8.1; CI's mutmut stage runs these)").create_mutations
    module, mutations, _, _ = create_mutations("m.py", text)
    return [(getattr(getattr(m.contained_by_top_level_function, "name", None), "value", None),
             module.code_for_node(m.original_node), module.code_for_node(m.mutated_node)) for m in mutations]


def reworded(text: str) -> str:
    """Every docstring's words changed (a line added) and every trailing comment's."""
    lines = text.splitlines(keepends=True)
    docstrings = [node.body[0].value for node in ast.walk(ast.parse(text))
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)]
    for string in sorted(docstrings, key=lambda s: s.lineno, reverse=True):  # bottom up: earlier positions hold
        first, last = lines[string.lineno - 1], lines[string.end_lineno - 1]
        lines[string.lineno - 1:string.end_lineno] = [
            first[:string.col_offset] + '"""reworded\n\n    over two lines"""' + last[string.end_col_offset:]]
    return re.sub(r"  # .*$", "  # another comment", "".join(lines), flags=re.M)


def without_comments(mutant: tuple) -> tuple:
    """A mutant's texts as mutmut shows them keep the comments inside the mutated statement; what runs does not."""
    return tuple(re.sub(r"  # .*$", "", part, flags=re.M) if part else part for part in mutant)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT / "src")))
def test_rewording_docstrings_and_comments_keeps_the_code_and_every_mutant(path):
    text = path.read_text()
    changed = reworded(text)
    assert changed != text
    assert run_mutmut.code_only(changed) == run_mutmut.code_only(text)  # before mutmut's part, which may skip
    assert [without_comments(m) for m in mutants(changed)] == [without_comments(m) for m in mutants(text)]


def test_a_change_of_code_is_seen_even_where_mutmut_makes_no_new_mutant():
    text = "def f(x):\n    \"\"\"Doc.\"\"\"\n    return g(x)\n"
    with_a_call = "def f(x):\n    \"\"\"Doc.\"\"\"\n    check()\n    return g(x)\n"
    assert run_mutmut.code_only(with_a_call) != run_mutmut.code_only(text)
    assert run_mutmut.code_only(text.replace("g(x)", "g(x, 1)")) != run_mutmut.code_only(text)
    # a string that is not the first statement is code, not a docstring
    assert run_mutmut.code_only(text.replace("return g(x)", "'''a'''\n    return g(x)")) != run_mutmut.code_only(text)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """The sglang tables group's files as they are today, in a tree of their own, and a run recorded over them."""
    group = next(g for g in run_mutmut.GROUPS if g.name == "sglang tables")
    for name in run_mutmut.group_files(group):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    monkeypatch.setattr(run_mutmut, "ROOT", tmp_path)
    run = {"commit": "abc1234", "code": run_mutmut.code_of(group)}
    return group, run, tmp_path / run_mutmut.group_files(group)[0]


def test_a_rerun_over_reworded_docstrings_is_allowed(recorded):
    group, run, path = recorded
    path.write_text(reworded(path.read_text()))
    assert run_mutmut.why_not_the_same_mutants(group, run) is None


def test_a_rerun_over_changed_code_is_refused_naming_the_file(recorded):
    group, run, path = recorded
    path.write_text(path.read_text() + "\n\ndef added():\n    return 1\n")
    why = run_mutmut.why_not_the_same_mutants(group, run)
    assert why == f"the code of {path.relative_to(run_mutmut.ROOT)} changed since its run at {run['commit']}"


def test_a_rerun_of_a_run_that_recorded_no_code_is_refused(recorded):
    group, run, _ = recorded
    assert run_mutmut.why_not_the_same_mutants(group, {"commit": "abc1234"}).startswith("the code of ")


def test_every_module_of_the_implementation_with_a_function_is_in_one_mutmut_group():
    """A module left out of every group is never mutated and never appears in scores.md: its score would be
    silently missing. Modules without a function (errors.py, the empty package files) give
    mutmut nothing to mutate."""
    grouped = [file for group in run_mutmut.GROUPS for file in run_mutmut.group_files(group)]
    assert len(grouped) == len(set(grouped)), "a file in two groups"
    with_functions = {str(path.relative_to(ROOT)) for path in SOURCES
                      if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                             for node in ast.walk(ast.parse(path.read_text())))}
    assert with_functions - set(grouped) == set()
    assert set(grouped) - with_functions == set(), "a group names a file with nothing to mutate, or none at all"


def test_the_survivors_list_reads_one_function_s_mutants_from_one_line_and_writes_them_back(tmp_path):
    listed = {"m.x_f__mutmut_2": ("equivalent", "why"), "m.x_f__mutmut_10": ("equivalent", "why"),
              "m.x_f__mutmut_3": ("open", "other"), "m.x_g__mutmut_1": ("equivalent", "why")}
    path = tmp_path / "survivors.txt"
    path.write_text("# the kinds\n\n")
    run_mutmut.write_survivors(listed, path)
    assert path.read_text() == ("# the kinds\n\nm.x_f__mutmut_{2,10}  # equivalent: why\n"
                                "m.x_f__mutmut_3  # open: other\nm.x_g__mutmut_1  # equivalent: why\n")
    assert run_mutmut.read_survivors(path) == listed
    path.write_text("m.x_f__mutmut_1  # equivalnet: a misspelt kind\n")
    with pytest.raises(SystemExit, match="kind one of"):
        run_mutmut.read_survivors(path)


def test_every_listed_survivor_and_every_sampled_mutant_belongs_to_a_grouped_module():
    listed = run_mutmut.read_survivors()
    sample = run_mutmut.read_killed_sample()
    assert [name for name in [*listed, *sample] if run_mutmut.module_of(name) is None] == []
    assert set(sample).isdisjoint(listed), "a listed survivor is not a killed mutant"
    # CI draws its groups by the commit's seed: each group must have mutants to draw, but one whose tests CI's
    # FlashInfer skips (ci_sample = false)
    assert {run_mutmut.group_of_module(run_mutmut.module_of(name)).name for name in sample} == {
        group.name for group in run_mutmut.GROUPS if group.ci_sample}


def test_every_test_a_mutmut_group_selects_exists():
    """A renamed test leaves its group selecting one that is not there: pytest stops the group's run (and CI's
    sample of it) with "not found"; this says so within the quick command."""
    assert [(group.name, test) for group in run_mutmut.GROUPS for test in group.tests
            if test.startswith("tests/") and not names_a_test(test, ROOT)] == []


def test_scores_md_has_a_row_for_every_grouped_module():
    rows = run_mutmut.read_scores()
    assert list(rows) == [module for group in run_mutmut.GROUPS for module in group.modules]
    assert all(row["score"].endswith("%") and row["run"] for row in rows.values())


def test_a_saved_run_rewrites_its_groups_rows_and_sample_and_keeps_the_others(tmp_path):
    group = run_mutmut.GROUPS[0]
    module = next(iter(group.modules))
    stem = group.modules[module][0].rstrip("*") + "x_f__mutmut_"
    statuses = {f"{stem}{n}": "killed" for n in range(1, 16)}
    statuses.update({f"{stem}16": "survived", f"{stem}17": "survived", f"{stem}18": "no tests"})
    listed = {f"{stem}16": ("equivalent", "why"), f"{stem}17": ("gpu-killed", "why"), f"{stem}18": ("open", "why")}
    record = {"groups": {group.name: {"commit": "abc1234", "date": "2026-01-02", "seconds": 5}}, "mutants": statuses}
    scores, sample = tmp_path / "scores.md", tmp_path / "sample.txt"
    scores.write_text(run_mutmut.SCORES.read_text())
    other = run_mutmut.GROUPS[-1]
    kept = [name for name in run_mutmut.read_killed_sample() if run_mutmut.module_of(name) in other.modules]
    sample.write_text("\n".join(kept) + "\n")
    run_mutmut.write_scores(record, listed, scores)
    run_mutmut.write_killed_sample(record, sample)
    rows = run_mutmut.read_scores(scores)
    expected = {"run": "abc1234, 2026-01-02, 5 s", "mutants": "18", "killed": "15", "equivalent": "1",
                "gpu-killed": "1", "open": "1", "not listed": "0", "score": "88.2 %", "with the GPU's kills": "94.1 %"}
    assert {column: rows[module][column] for column in expected} == expected
    assert {m: rows[m] for m in other.modules} == {m: run_mutmut.read_scores()[m] for m in other.modules}
    drawn = [line for line in sample.read_text().splitlines() if not line.startswith("#")]
    assert set(kept) < set(drawn)
    assert len(set(drawn) - set(kept)) == run_mutmut.SAMPLE_PER_GROUP
    assert all(statuses.get(name) == "killed" for name in set(drawn) - set(kept))


def test_a_saved_run_keeps_the_rows_of_groups_it_did_not_run_whatever_results_json_holds(tmp_path, monkeypatch):
    group, other = run_mutmut.GROUPS[0], run_mutmut.GROUPS[-1]
    module = next(iter(group.modules))
    stem = group.modules[module][0].rstrip("*") + "x_f__mutmut_"
    # .mutation/results.json as an earlier run of another group left it (an experiment since reverted)
    stale = {"groups": {other.name: {"commit": "0000000", "date": "2026-01-01", "seconds": 1, "code": {}}},
             "mutants": {}}
    committed_files = {"RESULTS": None, "SCORES": run_mutmut.SCORES, "KILLED_SAMPLE": run_mutmut.KILLED_SAMPLE}
    for name, committed in committed_files.items():
        copy = tmp_path / name
        copy.write_text(committed.read_text() if committed else json.dumps(stale))
        monkeypatch.setattr(run_mutmut, name, copy)
    run_mutmut.save({f"{stem}1": "killed"}, {group.name: 5.0}, False, {}, "abc1234", {group.name: {}})
    rows, committed = run_mutmut.read_scores(tmp_path / "SCORES"), run_mutmut.read_scores()
    assert rows[module]["run"].startswith("abc1234, ")
    assert {m: rows[m] for m in other.modules} == {m: committed[m] for m in other.modules}


def test_a_failed_clean_run_reports_pytests_lines_however_long_the_spinner_ran():
    """mutmut redraws its spinner ten times a second into the log; a group whose clean run fails must still show
    which test failed."""
    frames = "".join(f"{frame} Running clean tests\r" for frame in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" * 500)
    log = frames + "\nFAILED tests/x.py::test_y - AssertionError\n1 failed in 3.1s\n" + frames + "Failed to run clean test\n"
    assert run_mutmut.log_tail(log).splitlines() == [
        "FAILED tests/x.py::test_y - AssertionError", "1 failed in 3.1s", "Failed to run clean test"]
