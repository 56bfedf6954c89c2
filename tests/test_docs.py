"""The docs say what the tool prints and does: verify's worker-activation lines, its --json keys, status()'s
keys and routes, and no pointers into the project's issue tracker (a reader has no access to it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim.verify import workers
from _fp4_dynamo_shim.activation import site_files
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.verify import report
from helpers import run_python

ROOT = Path(__file__).resolve().parent.parent
USAGE = (ROOT / "docs" / "usage.md").read_text()

PTH = {"active": True, "activated_by": "pth"}
PLUGIN = {"active": True, "activated_by": "plugin"}
NONE = {"active": False}
#: The examples docs/usage.md shows, in its order: (plain launch, with the variable, asked, SGLang).
WORKER_EXAMPLES = [
    (NONE, PTH, [], None),
    (NONE, PTH, [], "0.5.9"),
    (PLUGIN, PTH, [], "0.5.11"),
    (NONE, NONE, ["FP4_DYNAMO_SHIM='1'"], None),
]


def test_the_worker_activation_examples_are_what_verify_prints_for_them():
    shown = re.findall(r"^  (PASS|FAIL)  worker-activation  (.*)$", USAGE, re.M)
    printed = []
    for plain, with_variable, asked, sglang in WORKER_EXAMPLES:
        passed, detail = workers.worker_verdict(plain, with_variable, asked, sglang)
        # verify prints a failed check as its exception's first line: "AssertionError: ..."
        printed.append(("PASS", detail) if passed else ("FAIL", f"AssertionError: {detail}"))
    assert shown == printed


def test_every_route_a_worker_can_report_is_named_in_the_docs():
    for words in workers.ACTIVATED_BY.values():
        assert f"`{words}`" in USAGE, words
    activated_by = re.search(r"`activated_by` \((.*?`apply\(\)`)\)", USAGE, re.S).group(1)
    for route in (*workers.ACTIVATED_BY, "import", report.ROUTE, "apply()"):
        assert f"`{route}`" in activated_by, route


def test_every_key_of_verify_json_and_of_status_is_described():
    document = report.json_document({}, {}, "cpu", [], 0)
    described = USAGE.split("`--json` prints one document with", 1)[1].split("## ", 1)[0]
    for key in document:
        assert f"`{key}`" in described, key
    keys = USAGE.split("`status()` always has these keys", 1)[1].split("\n\n", 1)[0]
    for key in lifecycle.STATUS_KEYS:
        assert f"`{key}`" in keys, key


def test_the_docs_cite_no_issue_numbers():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found = re.findall(r"\bissues? #?\d+|#\d+\b", path.read_text(), re.I)
        assert not found, (path.name, found)


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_a_hand_written_sitecustomize_that_calls_the_hook_is_listed_in_routes(tmp_path):
    """The documented one-liner, written by hand, applies the shim; status()["routes"] must say so."""
    (tmp_path / "sitecustomize.py").write_text(f"import os\n{site_files.ONE_LINER}\n")
    code = ("import json, flashinfer, fp4_dynamo_shim; s = fp4_dynamo_shim.status(); "
            "print(json.dumps([s['routes']['sitecustomize'], s['activated_by']]))")
    result = run_python(code, extra_path=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [str(tmp_path / "sitecustomize.py"), "sitecustomize"]
    assert fp4_dynamo_shim.status()["routes"]["sitecustomize"] is None  # this process has no such file


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_reaches_a_file_and_a_heading_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {page.resolve(): {_slug(line.lstrip("#")) for line in page.read_text().splitlines()
                                if line.startswith("#")} for page in pages}
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)?(?:#([^)\s]+))?\)", page.read_text()):
            if not target and not anchor:
                continue
            linked = (page.parent / target).resolve() if target else page.resolve()
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in anchors.get(linked, set()):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert broken == []
