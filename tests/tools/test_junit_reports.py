"""``tools/junit_reports.py``, the one reader of pytest's JUnit reports: CI's stage lines come from its command, and
the matrix, the curated mutations and the GPU record tool read outcomes through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = '''
import pytest

def test_passes():
    pass

def test_fails():
    assert False, "wrong"

@pytest.fixture
def broken():
    raise RuntimeError("set-up")

def test_errors(broken):
    pass

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
'''


def test_a_failure_and_an_error_count_as_failed_and_a_skip_as_skipped(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                    f"--junitxml={report}", str(tmp_path / "test_cases.py")], cwd=tmp_path, capture_output=True)
    line = subprocess.run([sys.executable, str(ROOT / "tools" / "junit_reports.py"), str(report), str(report)],
                          capture_output=True, text=True, check=True).stdout
    assert line == "2 passed, 4 failed, 2 skipped\n"
