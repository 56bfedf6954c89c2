"""The words a user reads for each release row are the reviewed ones: tests/data/user_lines.json, written by
``python tools/golden/user_lines.py`` and read here against what the code says now, both ways. A change to a row
or to the logic that words it (need line, verify's worker line, status fields) fails here until the file is
regenerated, and its diff is what a reviewer reads."""

from __future__ import annotations

import json

import pytest

import user_lines  # noqa: E402

from _fp4_dynamo_shim.fp4 import releases as fp4_releases  # noqa: E402
from _fp4_dynamo_shim.sglang import releases as sglang_releases  # noqa: E402

REVIEWED = json.loads(user_lines.FILE.read_text())
NOW = user_lines.current()
REGENERATE = "the code's words changed: run python tools/golden/user_lines.py and review the diff"


@pytest.mark.parametrize("table", ["sglang", "flashinfer", "variables"])
def test_every_row_in_the_file_is_in_the_code_and_every_row_in_the_code_is_in_the_file(table):
    assert sorted(REVIEWED[table]) == sorted(NOW[table]), REGENERATE


@pytest.mark.parametrize("version", list(NOW["sglang"]))
def test_each_sglang_versions_words_are_the_reviewed_ones(version):
    assert NOW["sglang"][version] == REVIEWED["sglang"].get(version), REGENERATE


@pytest.mark.parametrize("row", list(NOW["flashinfer"]))
def test_each_flashinfer_rows_status_is_the_reviewed_one(row):
    assert NOW["flashinfer"][row] == REVIEWED["flashinfer"].get(row), REGENERATE


def test_every_sglang_row_has_a_version_in_the_file_and_so_does_the_unknown_case():
    rows = {sglang_releases.release_for(version) for version in REVIEWED["sglang"]}
    assert set(sglang_releases.SGLANG_RELEASES) <= rows and None in rows
    assert len(REVIEWED["flashinfer"]) == len(fp4_releases.TARGETS)
