"""Which release row a FlashInfer version finds, and how status() describes it."""

from __future__ import annotations

import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import fp4_releases


def test_status_describes_the_release_row_as_plain_data():
    import dataclasses
    import json

    for target in fp4_releases.TARGETS:
        row = fp4_releases.describe(target)
        assert json.loads(json.dumps(row)) == row
        expected = dataclasses.asdict(target)
        expected.update(versions=str(target.versions), kernel_args=list(target.kernel_args))
        expected["arithmetic"]["fast_math_switches"] = list(target.arithmetic.fast_math_switches)
        assert row == expected
    installed = fp4_releases.target_for(lifecycle.flashinfer_version())
    assert fp4_dynamo_shim.status()["target"] == fp4_releases.describe(installed)


@pytest.mark.parametrize("version, row", [("0.5.3", 0), ("0.6.6.post1", 0), ("0.6.7", 1), ("0.6.10", 2), ("0.6.11", 3),
                                          ("0.6.12", 4), ("0.7.0.post1", 5), ("0.7.3", 6), ("0.7.4+cu128", 7),
                                          ("0.7.5rc1", None), ("0.7.5", None), ("0.5.2", None), ("0.7.4rc1", None),
                                          ("0.7.0rc1", 5), ("0.6.14.dev1", 5)])  # pre-releases inside a row
def test_each_version_string_finds_its_release_row(version, row):
    assert fp4_releases.target_for(version) == (None if row is None else fp4_releases.TARGETS[row])
