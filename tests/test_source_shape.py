"""The shape of the source (docs/how-it-works.md, "Layout"): a thin front over an implementation that applies
nothing on import, with no import cycle. pyproject.toml's import-linter contracts hold the layers (CI runs
``lint-imports``); these tests hold what a contract cannot say."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest

from helpers import run_python

SRC = Path(__file__).resolve().parents[1] / "src"


def _cycles(edges: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_the_source_has_no_import_cycle():
    """Every import counts, a function-level one too: a cycle made of lazy imports is still a cycle to read."""
    graph = grimp.build_graph("fp4_dynamo_shim", "_fp4_dynamo_shim")
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert len(edges) > 30
    assert _cycles(edges) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds one


def test_no_source_file_is_over_400_lines_and_the_front_is_short():
    lengths = {path.relative_to(SRC).as_posix(): len(path.read_text().splitlines()) for path in SRC.rglob("*.py")}
    assert {path: length for path, length in lengths.items() if length > 400} == {}
    assert lengths["fp4_dynamo_shim/__init__.py"] <= 60
    assert lengths["fp4_dynamo_shim_hook.py"] <= 20  # a forwarder for the start-up lines users have installed


@pytest.mark.slow  # interpreters of its own, over 4 s on 2 cores
def test_importing_every_module_of_the_implementation_applies_nothing():
    code = (
        "import importlib, json, os, pkgutil, sys, _fp4_dynamo_shim\n"
        "names = [m.name for m in pkgutil.walk_packages(_fp4_dynamo_shim.__path__, '_fp4_dynamo_shim.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "import flashinfer\n"
        "print(json.dumps([len(names), getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False),\n"
        "                  sys.modules['_fp4_dynamo_shim.lifecycle'].status()['applied'],\n"
        "                  os.environ.get('FP4_DYNAMO_SHIM'), 'fp4_dynamo_shim' in sys.modules]))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    count, patched, applied, exported, front = __import__("json").loads(result.stdout.strip().splitlines()[-1])
    assert count > 30 and (patched, applied, exported, front) == (False, False, None, False)


def _one_of_each_rows() -> list:
    """(what, command, expectation) for each row of how-it-works' "One of each" table that has a check."""
    import re

    text = (SRC.parent / "docs" / "how-it-works.md").read_text()
    table = text[text.index("### One of each"):].split("\n\n")[2]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        found = re.fullmatch(r"`(grep [^`]+)` (lists .+|finds nothing)", cells[2].replace("\\|", "|"))
        if found:
            rows.append((cells[0], found.group(1), found.group(2)))
    return rows


def test_each_one_of_each_check_in_how_it_works_holds():
    """The doc names the one place of each thing with the grep that shows it: each grep, run from the repository
    root, lists exactly the files the doc names (or nothing)."""
    import re
    import subprocess

    rows = _one_of_each_rows()
    assert len(rows) >= 10, rows
    for what, command, expectation in rows:
        output = subprocess.run(["bash", "-c", command], cwd=SRC.parent, capture_output=True, text=True).stdout
        files = {Path(line.split(":", 1)[0]).name for line in output.splitlines() if "__pycache__" not in line}
        named = set() if expectation == "finds nothing" else {
            Path(name).name for name in re.findall(r"`([^`]+\.py|fp4_dynamo_shim\.pth)`", expectation)}
        assert files == named, (what, command, output)
