"""Start-up lines that earlier releases installed in users' environments keep working: each one, verbatim
from ``tests/data/installed_lines``, still applies the shim when flashinfer is imported, under its own route.

``site.addsitedir`` processes a directory's ``.pth`` files the way interpreter start-up does for
site-packages (a stand-in for a venv, which costs seconds and shows nothing more about the line itself)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import run_python

pytestmark = pytest.mark.slow  # an interpreter per line, over 4 s each on 2 cores

LINES = Path(__file__).resolve().parents[1] / "data" / "installed_lines"
REPORT = ("import flashinfer, json, sys; s = sys.modules['_fp4_dynamo_shim.lifecycle'].status(); "
          "print(json.dumps([getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False), s['activated_by']]))")


def _report(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pth, environment, route", [
    ("fp4_dynamo_shim_hook.pth", {}, "install-hook"),
    ("fp4_dynamo_shim.pth", {"FP4_DYNAMO_SHIM": "1"}, "pth"),
])
def test_an_earlier_releases_pth_line_still_applies_the_shim(tmp_path, pth, environment, route):
    shutil.copy(LINES / pth, tmp_path / pth)
    code = f"import site; site.addsitedir({str(tmp_path)!r}); {REPORT}"
    assert _report(run_python(code, env=environment)) == [True, route]


@pytest.mark.parametrize("source", ["sitecustomize.py", "one_liner.py"])
def test_an_earlier_releases_sitecustomize_still_applies_the_shim(tmp_path, source):
    shutil.copy(LINES / source, tmp_path / "sitecustomize.py")
    result = run_python(REPORT, extra_path=str(tmp_path))
    assert _report(result) == [True, "sitecustomize"]
