"""The words a user reads for each release row are the reviewed ones: tests/data/user_lines.json, written by
``python tools/golden/user_lines.py`` and read here against what the code says now, both ways. A change to a row
or to the logic that words it (need line, verify's worker line, status fields) fails here until the file is
regenerated, and its diff is what a reviewer reads."""

from __future__ import annotations

import json

import pytest

import user_lines  # noqa: E402

from _fp4_dynamo_shim.fp4 import fp4_releases  # noqa: E402
from _fp4_dynamo_shim.sglang import sglang_releases  # noqa: E402

REVIEWED = json.loads(user_lines.FILE.read_text())
REGENERATE = "the code's words changed: run python tools/golden/user_lines.py and review the diff"


@pytest.fixture
def now():
    """The code's words, computed in each test (2 ms), not at collection nor once per module: mutmut collects
    once and then changes the code, and it runs a mutant only against the tests it saw call the mutated
    function, which for a module-scoped fixture is the first test alone."""
    return user_lines.current()


@pytest.mark.parametrize("table", ["sglang", "flashinfer", "variables"])
def test_every_row_in_the_file_is_in_the_code_and_every_row_in_the_code_is_in_the_file(table, now):
    assert sorted(REVIEWED[table]) == sorted(now[table]), REGENERATE


@pytest.mark.parametrize("version", list(REVIEWED["sglang"]))
def test_each_sglang_versions_words_are_the_reviewed_ones(version, now):
    assert now["sglang"].get(version) == REVIEWED["sglang"][version], REGENERATE


@pytest.mark.parametrize("row", list(REVIEWED["flashinfer"]))
def test_each_flashinfer_rows_status_is_the_reviewed_one(row, now):
    assert now["flashinfer"].get(row) == REVIEWED["flashinfer"][row], REGENERATE


def test_every_sglang_row_has_a_version_in_the_file_and_so_does_the_unknown_case():
    rows = {sglang_releases.release_for(version) for version in REVIEWED["sglang"]}
    assert set(sglang_releases.SGLANG_RELEASES) <= rows and None in rows
    assert len(REVIEWED["flashinfer"]) == len(fp4_releases.TARGETS)
