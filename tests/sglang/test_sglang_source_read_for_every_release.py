"""The readers of SGLang's source (``sglang/source.py``) over every release from 0.5.3.post1 to 0.5.23, without
the wheels: ``tests/data/sglang_reads.json.xz`` holds each file the readers asked each wheel for, and each wheel's
``Requires-Dist`` lines, as ``python tests/support/sglang_facts.py`` recorded them. What the readers make of
them must be ``tests/data/sglang_facts.json``, the facts the release table is held against.

This is the same reading that ``sglang_facts.py --check`` does over the 36 wheels (360 MB, not in CI), so a
change to a reader that changes any release's facts fails here. A reader that asks for a file the record
lacks fails with KeyError: regenerate both files with the wheels.
"""

from __future__ import annotations

import json

import pytest

import sglang_facts

from _fp4_dynamo_shim.sglang import source

FACTS = json.loads(sglang_facts.FACTS_FILE.read_text())


@pytest.fixture(scope="module")
def reads():
    return sglang_facts.load_reads()


def test_the_record_holds_every_release_the_facts_do(reads):
    assert sorted(reads["releases"]) == sorted(FACTS) == sorted(sglang_facts.RELEASES)


@pytest.mark.parametrize("version", sglang_facts.RELEASES)
def test_the_readers_give_each_releases_facts_from_its_recorded_files(reads, version):
    facts = source.read_release(sglang_facts.recorded_reader(reads, version))
    facts["pins"] = source.pins(reads["releases"][version]["requires"])
    assert facts == FACTS[version]


def test_a_file_the_release_lacks_reads_as_absent_and_one_the_record_lacks_says_so(reads):
    read = sglang_facts.recorded_reader(reads, "0.5.3.post1")
    assert read(source.QWEN3_5) is None  # Qwen3.5 came later
    with pytest.raises(KeyError):
        read("models/llama.py")
