"""Generated mutation testing with mutmut over the modules whose bugs are silent, checked against a list.

mutmut (3.x) writes every mutant of the chosen functions and runs, for each, the tests that reach that
function (its configuration is ``[tool.mutmut]`` in pyproject.toml; tests/mutmut_support.py lets its
trampolines run under torch.compile). This script runs it in a temporary copy of the project, then holds
the outcome against ``survivors.txt``: every surviving mutant must be listed there with the reason it is
equivalent (or harmless), and every listed one must still exist and still survive. It prints the killed
ratio per module, equivalents excluded.

    python tests/mutation/run_mutmut.py                 # the full run (docs/testing.md; an hour or more)
    python tests/mutation/run_mutmut.py --save          # ... and write mutmut_results.json (committed)
    python tests/mutation/run_mutmut.py --sample 30     # CI: 30 mutants spread over the committed results
    python tests/mutation/run_mutmut.py --module layout # one module of SCOPE

Exits 1 when a mutant survives unlisted, a listed one is killed or gone, or mutmut itself fails.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SURVIVORS = HERE / "survivors.txt"
RESULTS = HERE / "mutmut_results.json"
sys.path.insert(0, str(HERE))
from run_mutations import copy_project  # noqa: E402

#: Module -> the mutant names (globs) in scope: whole modules, except the direct path of wrapper.py and
#: the start-up hook's switch parsing.
SCOPE = {
    "fp4_arithmetic": ["fp4_dynamo_shim.fp4_arithmetic.*"],
    "reference": ["fp4_dynamo_shim.reference.*"],
    "layout": ["fp4_dynamo_shim.layout.*"],
    "wrapper (direct path)": ["fp4_dynamo_shim.wrapper.x__direct_path__mutmut_*", "fp4_dynamo_shim.wrapper.x_build__mutmut_*"],
    "ops": ["fp4_dynamo_shim.ops.*"],
    "family_ops": ["fp4_dynamo_shim.family_ops.*"],
    "flashinfer_op": ["fp4_dynamo_shim.flashinfer_op.*"],
    "hook switch": ["fp4_dynamo_shim_hook.x_switch__mutmut_*"],
    "targets": ["fp4_dynamo_shim.targets.*"],
    "family": ["fp4_dynamo_shim.family.*"],
    "checks": ["fp4_dynamo_shim.checks.*"],
}
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def module_of(name: str):
    for module, patterns in SCOPE.items():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return module
    return None


def read_survivors() -> dict:
    """name -> reason, from ``survivors.txt`` (``name  # reason`` per line; blank lines and comments skipped)."""
    listed = {}
    for line in SURVIVORS.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, reason = line.partition("#")
        if not reason.strip():
            raise SystemExit(f"{SURVIVORS.name}: {name.strip()} has no reason")
        listed[name.strip()] = reason.strip()
    return listed


def mutmut(tree: Path, *arguments, timeout=None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("FP4_DYNAMO_SHIM", "MUTANT_UNDER_TEST")}
    environment.setdefault("OMP_NUM_THREADS", "1")  # two cores, shared: one thread per mutant
    return subprocess.run([sys.executable, "-m", "mutmut", *arguments], cwd=tree, env=environment,
                          capture_output=True, text=True, timeout=timeout)


def results(tree: Path) -> dict:
    """name -> status of every mutant mutmut has a result for (``mutmut results --all true``)."""
    completed = mutmut(tree, "results", "--all", "true")
    outcome = {}
    for line in completed.stdout.splitlines():
        match = re.fullmatch(r"\s*(\S+): (.+)", line)
        if match:
            outcome[match.group(1)] = match.group(2).strip()
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", choices=sorted(SCOPE), help="only these modules of SCOPE")
    parser.add_argument("--sample", type=int, help="this many mutants spread over the committed results (CI)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--save", action="store_true", help=f"write {RESULTS.name} from this run")
    parser.add_argument("--keep", type=Path, help="run in (and keep) this directory instead of a temporary one")
    options = parser.parse_args()
    listed = read_survivors()
    modules = options.module or list(SCOPE)
    if options.sample:
        committed = json.loads(RESULTS.read_text())["mutants"]
        names = sorted(n for n in committed if module_of(n) in modules)
        step = max(1, len(names) // options.sample)
        selected = names[::step][: options.sample]
    else:
        selected = [pattern for module in modules for pattern in SCOPE[module]]
    started = time.perf_counter()
    scratch = options.keep or Path(tempfile.mkdtemp(prefix="fp4-mutmut-"))
    try:
        tree = scratch if (scratch / "pyproject.toml").exists() else copy_project(scratch)
        run = mutmut(tree, "run", "--max-children", str(options.max_children), *selected)
        outcome = {n: s for n, s in results(tree).items() if module_of(n) in modules}
        if options.sample:
            outcome = {n: s for n, s in outcome.items() if n in selected}
        if not outcome:
            print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
            print("mutmut produced no results")
            return 1
    finally:
        if not options.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    problems = []
    for name, status in sorted(outcome.items()):
        if status in KILLED:
            if name in listed:
                problems.append(f"{name}: listed in {SURVIVORS.name} but now {status}; take it off the list")
        elif name not in listed:
            problems.append(f"{name}: {status}, not listed in {SURVIVORS.name} (kill it with a test, or list it "
                            "with the reason it is equivalent)")
    ran_everything = not options.sample
    if ran_everything:
        for name in listed:
            if module_of(name) in modules and name not in outcome:
                problems.append(f"{name}: listed in {SURVIVORS.name} but no such mutant exists any more")
    print(f"{'module':24} {'mutants':>8} {'killed':>7} {'listed':>7} {'score':>7}")
    scores = {}
    for module in modules:
        names = [n for n in outcome if module_of(n) == module]
        killed = sum(outcome[n] in KILLED for n in names)
        equivalent = sum(n in listed and outcome[n] not in KILLED for n in names)
        scored = len(names) - equivalent
        scores[module] = {"mutants": len(names), "killed": killed, "listed": equivalent,
                          "score": round(killed / scored, 4) if scored else None}
        score = f"{100 * killed / scored:.1f}%" if scored else "-"
        print(f"{module:24} {len(names):8} {killed:7} {equivalent:7} {score:>7}")
    total = sum(s["mutants"] for s in scores.values())
    total_killed = sum(s["killed"] for s in scores.values())
    total_listed = sum(s["listed"] for s in scores.values())
    print(f"{'all':24} {total:8} {total_killed:7} {total_listed:7} "
          f"{100 * total_killed / max(1, total - total_listed):6.1f}%   ({time.perf_counter() - started:.0f} s)")
    for problem in problems:
        print("PROBLEM", problem)
    if options.save and ran_everything:
        RESULTS.write_text(json.dumps({"scores": scores, "mutants": outcome}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
