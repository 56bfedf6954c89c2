"""Break the shim on purpose, one behaviour at a time, and require a named test to fail each time.

Every entry of ``mutations.MUTATIONS`` replaces one snippet of ``src/`` (it must occur exactly once) in a
temporary copy of the project and runs the tests it names there; the mutation is *caught* when at least
one of them fails. The unmutated copy must pass the same tests first, or the list proves nothing.

    python tests/mutation/run_mutations.py              # the fast subset (what CI runs)
    python tests/mutation/run_mutations.py --all        # every mutation
    python tests/mutation/run_mutations.py --only NAME  # one or more by name
    python tests/mutation/run_mutations.py --gpu        # the GPU tests' mutations, on a GPU machine

Prints one line per mutation (caught by which test, or SURVIVED) and exits 1 when any survives, when a
snippet is missing or ambiguous, or when the unmutated baseline fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import MUTATIONS, Mutation  # noqa: E402


#: What a copy needs where there is no git (the GPU machine gets the working tree without .git).
PROJECT_PARTS = ("src", "tests", "benchmarks", "docs", "pyproject.toml", "setup.py", "README.md")


def copy_project(destination: Path) -> Path:
    """The tracked files (and untracked, unignored ones) of this checkout, as a fresh tree."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                                capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [str(path.relative_to(ROOT)) for part in PROJECT_PARTS for path in
                  ([ROOT / part] if (ROOT / part).is_file() else (ROOT / part).rglob("*"))
                  if path.is_file() and "__pycache__" not in path.parts]
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def run_tests(tree: Path, tests: tuple, report: Path, timeout: float) -> tuple:
    """(return code, failed test ids) of pytest over ``tests`` with ``tree/src`` first on the path."""
    environment = dict(os.environ)
    environment.pop("FP4_DYNAMO_SHIM", None)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree / "src"), environment.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--junitxml={report}",
               *tests]
    try:
        completed = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True,
                                   timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", []
    failed = []
    if report.exists():
        for case in ElementTree.parse(report).iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    if completed.returncode not in (0, 1):  # collection error, crash, usage error
        failed.append(f"pytest exit {completed.returncode}: {(completed.stdout + completed.stderr)[-300:]}")
    return completed.returncode, failed


def apply(tree: Path, mutation: Mutation) -> dict:
    """Apply ``mutation`` to ``tree`` in place; returns the original texts to restore."""
    saved = {}
    for path, old, new in mutation.edits:
        file = tree / path
        text = saved.get(path) or file.read_text()
        saved.setdefault(path, text)
        current = file.read_text()
        count = current.count(old)
        if count != 1:
            raise LookupError(f"{mutation.name}: the snippet occurs {count} times in {path}: {old[:80]!r}")
        file.write_text(current.replace(old, new))
    return saved


def restore(tree: Path, saved: dict) -> None:
    for path, text in saved.items():
        (tree / path).write_text(text)


def check(tree: Path, mutation: Mutation, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        saved = apply(tree, mutation)
    except LookupError as error:
        return {"name": mutation.name, "result": "STALE", "detail": str(error), "seconds": 0.0}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            code, failed = run_tests(tree, mutation.tests, Path(scratch) / "report.xml", timeout)
    finally:
        restore(tree, saved)
    caught = [test for test in failed if not test.startswith("pytest exit")]
    if code == "timeout":
        result, detail = "caught", "the named tests timed out"
    elif caught:
        result, detail = "caught", caught[0]
    else:
        result, detail = "SURVIVED", failed[0] if failed else "every named test passed"
    return {"name": mutation.name, "result": result, "detail": detail, "seconds": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every CPU mutation, not only the fast subset")
    parser.add_argument("--gpu", action="store_true", help="the GPU mutations (on a GPU machine, run from tests/gpu/run.sh's environment)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutations only")
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation")
    options = parser.parse_args()
    names = {m.name for m in MUTATIONS}
    if len(names) != len(MUTATIONS):
        print("mutation names must be unique", file=sys.stderr)
        return 1
    if options.only:
        unknown = set(options.only) - names
        if unknown:
            print(f"unknown mutations: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 1
        selected = [m for m in MUTATIONS if m.name in options.only]
    elif options.gpu:
        selected = [m for m in MUTATIONS if m.gpu]
    else:
        selected = [m for m in MUTATIONS if not m.gpu and (options.all or m.fast)]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        trees = [copy_project(Path(scratch) / f"tree{i}") for i in range(max(1, options.jobs))]
        baseline_tests = tuple(sorted({test for m in selected for test in m.tests}))
        code, failed = run_tests(trees[0], baseline_tests, Path(scratch) / "baseline.xml", options.timeout * 4)
        if code != 0:
            print(f"baseline: the unmutated tree fails the named tests ({failed[:3]}); fix that first")
            return 1
        print(f"baseline: {len(baseline_tests)} named tests pass unmutated ({time.perf_counter() - started:.0f} s)",
              flush=True)
        results = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(trees)) as pool:
            free = list(trees)
            pending = {}
            queue = list(selected)
            while queue or pending:
                while queue and free:
                    tree, mutation = free.pop(), queue.pop(0)
                    pending[pool.submit(check, tree, mutation, options.timeout)] = tree
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    free.append(pending.pop(future))
                    outcome = future.result()
                    results.append(outcome)
                    print(f"{outcome['result']:8} {outcome['name']:44} {outcome['detail']} "
                          f"[{outcome['seconds']:.0f} s]", flush=True)
    bad = [r for r in results if r["result"] != "caught"]
    print(f"{len(results) - len(bad)}/{len(results)} mutations caught in {time.perf_counter() - started:.0f} s"
          + (f"; not caught: {', '.join(r['name'] for r in bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
