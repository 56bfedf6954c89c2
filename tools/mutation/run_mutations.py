"""Break the shim on purpose, one behaviour at a time, and require a named test to fail each time.

Every entry of ``mutations.toml`` replaces snippets of ``src/`` (each must occur exactly once) in a temporary
copy of the project and runs the tests it names there; the mutation is caught when one of them fails. A catch
counts once the test that failed passes on the unmutated copy, run the same way (in a fork) after the mutations;
``--baseline-from`` JUnit reports of a run of this checkout, in which every named test must have passed, make a
broken checkout fail before any mutation runs (CI). ``--from`` runs a ``gpu_mutants.py pack`` file instead
(docs/testing.md).

With a CPU-only torch each mutation's pytest is a fork of this process, which has imported torch, Dynamo,
FlashInfer, Hypothesis and pytest once (never the shim or the tests, which come from the mutated copy):
those imports were 7 to 8 s of each mutation's 10 s; it has also compiled one small function, so that no fork
repeats a first compile's set-up (23 mutations with their baseline: 45 -> 29 s). With a CUDA torch each is a fresh interpreter, since
CUDA cannot be used in a forked child once the parent touched it. Exits 1 when a mutation survives, when a
snippet is missing or ambiguous, or when a catching test fails unmutated too.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cores  # noqa: E402
import junit_reports  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CURATED = Path(__file__).resolve().parent / "mutations.toml"


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    why: str
    edits: tuple  # (path, old snippet, new snippet) each
    tests: tuple
    fast: bool = True
    gpu: bool = False


def mutation_of(entry: dict, gpu: bool = False) -> Mutation:
    """One entry of mutations.toml or of a ``gpu_mutants.py pack`` file (the same keys)."""
    olds, news = (entry["old"], entry["new"]) if isinstance(entry["old"], list) else ([entry["old"]], [entry["new"]])
    gpu = gpu or entry.get("gpu", False)
    return Mutation(entry["name"], entry["why"], tuple((entry["path"], old, new) for old, new in zip(olds, news, strict=True)),
                    tuple(entry["tests"]), entry.get("fast", True) and not gpu, gpu)


def curated_mutations() -> list:
    return [mutation_of(entry) for entry in tomllib.loads(CURATED.read_text())["mutation"]]


#: What a copy needs where there is no git (the GPU machine gets the working tree without .git).
PROJECT_PARTS = ("src", "tests", "tools", "benchmarks", "docs", "pyproject.toml", "setup.py", "README.md")


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


def compile_caches_of(tree: Path) -> dict:
    """Torch's compile caches for the tests run in ``tree``, apart from every other run's: torch keys a cached
    graph by its code, not by the fakes and schemas of the ops it calls, which a mutant changes, so a graph
    compiled under one mutant would be loaded for the next run (kernels, keyed by their own source, are kept)."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(tree / ".inductor"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


def _environment(tree: Path) -> dict:
    environment = {**os.environ, **compile_caches_of(tree)}
    environment.pop("FP4_DYNAMO_SHIM", None)
    environment.pop("PYTEST_ADDOPTS", None)  # CI's JUnit option for its own stages
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree / "src"), environment.get("PYTHONPATH")) if p)
    return environment


def _pytest_arguments(tests: tuple, report: Path, first_failure_ends: bool = True) -> list:
    return ["-q", *(["-x"] if first_failure_ends else []), "-p", "no:cacheprovider", f"--junitxml={report}", *tests]


def node_id(case) -> str:
    """pytest's id of a JUnit case (``tests/fp4/test_op.py::test_x[param]``); a module that failed to collect has
    no test of its own: ``tests/fp4/test_op.py::`` for it."""
    module, test = (case.classname, case.name) if case.classname else (case.name, "")
    return f"{module.replace('.', '/')}.py::{test}"


def failed_tests(report: Path) -> list:
    """``node id: first line of the failure`` per failed test (the line tells a kill by the mutation from one by
    something else: a lost GPU, a taken port)."""
    failed = []
    for case in junit_reports.cases([report] if report.exists() else []):
        if case.outcome == "failed":
            message = case.message.strip().splitlines()
            failed.append(f"{node_id(case)}: {message[0][:160] if message else ''}")
    return failed


#: What each mutation's pytest would import first; imported once here when mutations run as forks.
PRELOADED = ("torch", "torch._dynamo", "torch._dynamo.testing", "torch._inductor.compile_fx", "flashinfer",
             "hypothesis", "pytest", "safetensors", "wrapt", "packaging.version")


def preload() -> None:
    # Inductor reads its cache switches when its config is imported, here, not in the forks. One compile
    # thread: with more, Inductor compiles in a pool of threads and a process of this one, which no fork inherits
    # (each would start its own: an interpreter that imports torch).
    os.environ.update({k: v for k, v in compile_caches_of(ROOT).items() if k != "TORCHINDUCTOR_CACHE_DIR"},
                      TORCHINDUCTOR_COMPILE_THREADS="1")
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    warm_compile()
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("fp4_dynamo_shim", "fp4_dynamo_shim_hook"))
    if leaked:  # the forks must import the shim from the mutated copy
        raise RuntimeError(f"preloading imported the shim itself: {leaked}")


def warm_compile() -> None:
    """One small function compiled through Dynamo, AOTAutograd and Inductor: a process's first compile imports
    and sets up most of them (about 4 s of Dynamo alone, more with Inductor), which each fork would repeat."""
    import torch

    for backend in ("aot_eager", "inductor"):
        torch.compile(lambda x: x * 2 + 1, fullgraph=True, backend=backend)(torch.ones(8))
    torch._dynamo.reset()


def fork_tests(tree: Path, tests: tuple, report: Path, log: Path, first_failure_ends: bool) -> int:
    """Start pytest over ``tests`` in a fork of this process, in ``tree``; returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        os.chdir(tree)
        environment = _environment(tree)
        os.environ.clear()
        os.environ.update(environment)
        sys.path.insert(0, str(tree / "src"))
        import pytest

        code = int(pytest.main(_pytest_arguments(tests, report, first_failure_ends)))
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class Runs:
    """At most one pytest run per tree at once, each a fork of this process (``forking``) or a fresh interpreter;
    ``wait()`` returns the next one to end."""

    def __init__(self, timeout: float, forking: bool):
        self.timeout, self.forking = timeout, forking
        self.running = {}  # pid or Popen -> (started, key, report, log)

    def start(self, key, tree: Path, tests: tuple, scratch: Path, first_failure_ends: bool = True) -> None:
        report, log = scratch / f"{tree.name}.xml", scratch / f"{tree.name}.log"
        report.unlink(missing_ok=True)
        if self.forking:
            handle = fork_tests(tree, tests, report, log, first_failure_ends)
        else:
            arguments = _pytest_arguments(tests, report, first_failure_ends)
            with open(log, "w") as out:
                handle = subprocess.Popen([sys.executable, "-m", "pytest", *arguments], cwd=tree,
                                          env=_environment(tree), stdout=out, stderr=subprocess.STDOUT)
        self.running[handle] = (time.perf_counter(), key, report, log)

    @staticmethod
    def _exit_code(handle):
        if isinstance(handle, subprocess.Popen):
            return handle.poll()
        pid, status = os.waitpid(handle, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if pid else None

    def wait(self) -> tuple:
        """(key, return code or "timeout", failed test ids) of the next run to end."""
        while True:
            for handle, (started, key, report, log) in list(self.running.items()):
                code = self._exit_code(handle)
                if code is None and time.perf_counter() - started > self.timeout:
                    os.kill(getattr(handle, "pid", handle), signal.SIGKILL)
                    handle.wait() if isinstance(handle, subprocess.Popen) else os.waitpid(handle, 0)
                    del self.running[handle]
                    return key, "timeout", []
                if code is not None:
                    del self.running[handle]
                    failed = failed_tests(report)
                    if code not in (0, 1):  # collection error, crash, usage error
                        failed.append(f"pytest exit {code}: {log.read_text(errors='replace')[-300:]}")
                    return key, code, failed
            time.sleep(0.05)


def passed_in_reports(tests: tuple, reports: list) -> list:
    """The named tests (``path::name`` or ``path::name[params]`` or ``path``) that did not pass in the JUnit
    ``reports``: not found, or found failing."""
    outcomes = {}
    for case in junit_reports.cases(reports):
        outcomes.setdefault(f"{case.classname.replace('.', '/')}.py::{case.name}", set()).add(case.outcome)
    missing = []
    for test in tests:
        matching = [seen for name, seen in outcomes.items()
                    if name == test or name.startswith(test + "[") or name.startswith(test + "::")]
        if not matching or any("failed" in seen for seen in matching) or not any("passed" in s for s in matching):
            missing.append(test)
    return missing


def apply(tree: Path, mutation: Mutation) -> dict:
    """Apply ``mutation`` to ``tree`` in place; returns the original texts to restore."""
    saved = {}
    for path, old, new in mutation.edits:
        file = tree / path
        current = file.read_text()
        saved.setdefault(path, current)
        count = current.count(old)
        if count != 1:
            raise LookupError(f"{mutation.name}: the snippet occurs {count} times in {path}: {old[:80]!r}")
        file.write_text(current.replace(old, new))
    return saved


def restore(tree: Path, saved: dict) -> None:
    for path, text in saved.items():
        (tree / path).write_text(text)


def outcome(mutation: Mutation, code, failed: list, started: float) -> dict:
    caught = [test for test in failed if not test.startswith("pytest exit")]
    if isinstance(code, LookupError):  # a snippet missing or ambiguous: the mutation no longer applies
        result, detail = "STALE", str(code)
    elif code == "timeout":
        result, detail = "caught", "the named tests timed out"
    elif isinstance(code, int) and code < 0:  # killed by a signal: the tests crashed, as a user's run would
        result, detail = "caught", f"the named tests crashed (signal {-code}): {failed[-1][-200:]}"
    elif caught:
        result, detail = "caught", caught[0]
    else:
        result, detail = "SURVIVED", failed[0] if failed else "every named test passed"
    by = caught[0].split(": ")[0] if result == "caught" and caught else None  # the test whose failure caught it
    return {"name": mutation.name, "result": result, "detail": detail, "seconds": time.perf_counter() - started,
            "tests": list(mutation.tests), "caught_by": by}


def run_all(trees: list, selected: list, runs: Runs, scratch: Path, report) -> None:
    free, queue, started, saved = list(trees), list(selected), {}, {}
    while queue or runs.running:
        while queue and free:
            tree, mutation = free.pop(), queue.pop(0)
            try:
                saved[tree] = apply(tree, mutation)
            except LookupError as error:
                free.append(tree)
                report(outcome(mutation, error, [], time.perf_counter()))
                continue
            started[tree] = time.perf_counter()
            runs.start((tree, mutation), tree, mutation.tests, scratch)
        if not runs.running:
            continue
        (tree, mutation), code, failed = runs.wait()
        restore(tree, saved.pop(tree))
        free.append(tree)
        report(outcome(mutation, code, failed, started.pop(tree)))


def confirm_catches(trees: list, results: list, options, scratch: Path, forking: bool) -> Optional[str]:
    """Run, on the unmutated trees and the way the mutations ran, the test that caught each mutation (its named
    tests where the catch was a timeout, a crash or a module that failed to collect); a catch whose test fails
    there too says nothing of the mutation: it becomes VOID. Returns why the run itself failed, or None. With
    ``--baseline-from`` the reports stand for the tests marked slow (each starts fresh interpreters, which a fork
    cannot change)."""
    wanted = {r["name"]: (r["caught_by"],) if r["caught_by"] and not r["caught_by"].endswith("::") else
              tuple(r["tests"]) for r in results if r["result"] == "caught"}
    tests = sorted({test for named in wanted.values() for test in named})
    runs, failed, problems = Runs(options.timeout * 4, forking), [], []
    selection = ("-m", "not slow") if options.baseline_from and forking else ()
    for tree, chunk in zip(trees, [tests[i::len(trees)] for i in range(len(trees))]):
        if chunk:  # an empty chunk would be pytest with no test named: the whole suite
            runs.start(tree, tree, tuple(chunk) + selection, scratch, first_failure_ends=False)
    while runs.running:
        _, code, failures = runs.wait()
        failed += [f for f in failures if not f.startswith("pytest exit")]
        if code not in (0, 1, 5):  # 5: every test of the chunk deselected
            problems.append(f"pytest exit {code}: {failures[-1] if failures else ''}")
    for result in results:
        for test in wanted.get(result["name"], ()):
            failing = [f for f in failed if f.startswith((test + ":", test + "[", test + "::"))]
            if failing:
                result["result"], result["detail"] = "VOID", f"fails unmutated too: {failing[0]}"
    return "; ".join(problems) or None


def load_mutations(path: Path) -> tuple:
    """(commit, mutations) from a ``gpu_mutants.py pack`` file."""
    document = json.loads(path.read_text())
    return document["commit"], [mutation_of(entry, gpu=True) for entry in document["mutations"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every CPU mutation, not only the fast subset")
    parser.add_argument("--gpu", action="store_true", help="the GPU mutations (on a GPU machine, run from tests/gpu/run.sh's environment)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutations only")
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation")
    parser.add_argument("--baseline-from", nargs="+", type=Path, metavar="JUNIT",
                        help="JUnit reports of a run of this checkout: fail at once unless every named test passed there")
    parser.add_argument("--no-fork", action="store_true", help="a fresh interpreter per mutation")
    parser.add_argument("--from", dest="source", type=Path, metavar="PACKED",
                        help="the mutations of this gpu_mutants.py pack file instead of the curated list")
    parser.add_argument("--json", type=Path, help="write the results here, rewritten after each one")
    options = parser.parse_args()
    packed_at, mutations = load_mutations(options.source) if options.source else (None, curated_mutations())
    if options.only:
        selected = [m for m in mutations if m.name in options.only]
        if len(selected) != len(set(options.only)):
            raise SystemExit(f"unknown mutations: {sorted(set(options.only) - {m.name for m in selected})}")
    elif options.gpu:
        selected = [m for m in mutations if m.gpu]
    else:
        selected = [m for m in mutations if not m.gpu and (options.all or m.fast)]
    started = time.perf_counter()
    cores.share_among(options.jobs)  # before torch is imported: forks inherit it, fresh interpreters read it
    import torch  # forking is safe while no CUDA context exists; a CPU-only torch never makes one

    forking = not options.no_fork and hasattr(os, "fork") and torch.version.cuda is None
    if forking:
        preload()
        print(f"preloaded {', '.join(PRELOADED)} ({time.perf_counter() - started:.0f} s); each mutation runs in a fork",
              flush=True)
    results = []

    def save() -> None:  # after each result, so a run cut short keeps what it found
        if options.json:
            options.json.write_text(json.dumps({"commit": packed_at, "results": results}, indent=1) + "\n")

    def report(result: dict) -> None:
        results.append(result)
        save()
        print(f"{result['result']:8} {result['name']:44} {result['detail']} [{result['seconds']:.0f} s]", flush=True)

    if options.baseline_from:
        missing = passed_in_reports(tuple(sorted({test for m in selected for test in m.tests})), options.baseline_from)
        if missing:
            print(f"baseline: {len(missing)} named tests did not pass in the given reports ({missing[:3]}); fix that first")
            return 1
    with tempfile.TemporaryDirectory() as scratch:
        trees = [copy_project(Path(scratch) / f"tree{i}") for i in range(max(1, options.jobs))]
        run_all(trees, selected, Runs(options.timeout, forking), Path(scratch), report)
        begun = time.perf_counter()
        problem = confirm_catches(trees, results, options, Path(scratch), forking)
    voided = [r for r in results if r["result"] == "VOID"]
    for result in voided:
        print(f"{result['result']:8} {result['name']:44} {result['detail']}")
    save()
    print(f"unmutated: the tests that caught {len(results) - len(voided)} mutations pass on the unmutated copy "
          f"({time.perf_counter() - begun:.0f} s)" if not problem else f"unmutated: {problem}", flush=True)
    bad = [r for r in results if r["result"] != "caught"]
    print(f"{len(results) - len(bad)}/{len(results)} mutations caught in {time.perf_counter() - started:.0f} s"
          + (f"; not caught: {', '.join(r['name'] for r in bad)}" if bad else ""))
    return 1 if bad or problem else 0


if __name__ == "__main__":
    sys.exit(main())
