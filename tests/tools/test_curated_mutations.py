"""The curated mutations (tools/mutation/mutations.toml) still apply to today's source.

A snippet that no longer occurs exactly once in src/ makes its mutation STALE when run_mutations.py reaches it,
which for the slow ones is only in a long --all run; this says so in the quick command, without running any.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

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
