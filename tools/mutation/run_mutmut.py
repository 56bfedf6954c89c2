"""Generated mutation testing with mutmut over the modules whose bugs are silent, checked against a list.

mutmut (3.x) writes every mutant of the chosen functions and runs, for each, the tests that reach that function
(tests/support/mutmut_support.py), group by group (groups.toml), each group in a temporary copy of the project with
its own tests. Every surviving mutant must be listed in survivors.txt with its kind and reason, and every listed one
must still survive. The tree keeps the score per module (scores.md) and killed mutants per group (killed_sample.txt,
for CI's sample); per-mutant results and mutmut's statistics go to the ignored .mutation/.

    python tools/mutation/run_mutmut.py [--module layout] --save     # every group, or the one holding a module
    python tools/mutation/run_mutmut.py --module layout --survivors --save   # what the last run left standing
    python tools/mutation/run_mutmut.py --sample 15 --sample-groups 2 --seed N   # CI's stage

Exits 1 when a mutant survives unlisted, a listed one is killed or gone, or mutmut itself fails.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import datetime
import fnmatch
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SURVIVORS = HERE / "survivors.txt"
SCORES = HERE / "scores.md"
KILLED_SAMPLE = HERE / "killed_sample.txt"
#: What a run leaves for later runs in this checkout: the per-mutant results and each group's mutmut statistics
#: (which test reaches which function, and what it costs), which spare a later run the group's whole selection.
RESULTS = ROOT / ".mutation" / "results.json"
STATS = ROOT / ".mutation" / "stats"
#: Mutants per group that a full run writes to killed_sample.txt.
SAMPLE_PER_GROUP = 5
sys.path.insert(0, str(HERE))
from run_mutations import compile_caches_of, copy_project  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Group:
    """Modules run together: the mutant name patterns per module, and the tests (pytest arguments) that protect them."""

    name: str
    modules: dict
    tests: tuple
    most_children: int = 2  # mutants at once
    ci_sample: bool = True  # False where CI's FlashInfer skips the group's tests: nothing to draw for CI

    @property
    def slug(self) -> str:
        return re.sub(r"\W+", "-", self.name)


def read_groups(path: Path = HERE / "groups.toml") -> tuple:
    document = tomllib.loads(path.read_text())
    deselected = lambda names: [argument for name in names for test in document["deselect"].get(name, [name])
                                for argument in ("--deselect", test)]
    return tuple(Group(g["name"], g["modules"], (*g["tests"], *deselected(g.get("deselect", ()))),
                       g.get("most_children", 2), g.get("ci_sample", True)) for g in document["group"])


GROUPS = read_groups()
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def group_files(group: Group) -> list:
    return sorted({"src/" + p.split(".x")[0].rstrip(".*").replace(".", "/") + ".py"
                   for patterns in group.modules.values() for p in patterns})


def module_of(name: str):
    for group in GROUPS:
        for module, patterns in group.modules.items():
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                return module
    return None


def group_of_module(module: str) -> Group:
    return next(group for group in GROUPS if module in group.modules)


#: How a listed survivor counts: equivalent, left out of the score; gpu-only, told apart on a GPU by the test under
#: tests/gpu its reason names (gpu-killed once gpu_mutants.py ran it there); open: no test found yet tells it apart.
KINDS = ("equivalent", "gpu-only", "gpu-killed", "open")


def read_survivors(path: Path = SURVIVORS) -> dict:
    """name -> (kind, reason), from ``names  # kind: reason`` lines, where ``names`` is a mutant's name or several
    of one function's as ``x_f__mutmut_{3,5,8}`` (blank lines and comment lines skipped)."""
    listed = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        names, _, note = line.partition("#")
        kind, _, reason = note.partition(":")
        if kind.strip() not in KINDS or not reason.strip():
            raise SystemExit(f"{path.name}: {names.strip()}: expected '# kind: reason', kind one of {KINDS}")
        stem, _, numbers = names.strip().rstrip("}").partition("{")
        for number in numbers.split(",") if numbers else [""]:
            listed[stem + number] = (kind.strip(), reason.strip())
    return listed


def write_survivors(listed: dict, path: Path = SURVIVORS) -> None:
    """Rewrite the list's lines (its leading comments kept), one per function, kind and reason, in the order read."""
    lines, by_line = [], {}
    for name, (kind, reason) in listed.items():
        stem, number = re.fullmatch(r"(.*?)(\d*)", name).groups()
        by_line.setdefault((stem, kind, reason), []).append(number)
    for (stem, kind, reason), numbers in by_line.items():
        names = stem + (f"{{{','.join(sorted(numbers, key=int))}}}" if len(numbers) > 1 else numbers[0])
        lines.append(f"{names}  # {kind}: {reason}")
    text = path.read_text().splitlines() if path.exists() else []
    header = list(itertools.takewhile(lambda line: line.startswith("#") or not line.strip(), text))
    path.write_text("\n".join(header + lines) + "\n")


def read_killed_sample(path: Path = KILLED_SAMPLE) -> list:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def configure_tree(tree: Path, group: Group) -> None:
    """The group's files and test selection in the copy's ``[tool.mutmut]`` (the rest stays pyproject's)."""
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    for key, values in (("only_mutate", group_files(group)), ("pytest_add_cli_args_test_selection", group.tests)):
        listed = f"{key} = [{', '.join(map(json.dumps, values))}]"
        text, count = re.subn(rf"(?ms)^{key} = \[.*?\]$", lambda _: listed, text)
        assert count == 1, f"pyproject.toml: [tool.mutmut] {key} not found once"
    pyproject.write_text(text)


def mutmut(tree: Path, *arguments, log=None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("FP4_DYNAMO_SHIM", "MUTANT_UNDER_TEST")}
    environment.setdefault("OMP_NUM_THREADS", "1")  # two cores, shared: one thread per mutant
    environment["PYTHONDONTWRITEBYTECODE"] = "1"
    environment.update(compile_caches_of(tree))  # every mutant of a group runs in the one tree
    with open(log or os.devnull, "w") as out:
        return subprocess.run([sys.executable, "-m", "mutmut", *arguments], cwd=tree, env=environment, text=True,
                              **({"stdout": out, "stderr": subprocess.STDOUT} if log else {"capture_output": True}))


def results(tree: Path) -> dict:
    """name -> status of every mutant mutmut has a result for (``mutmut results --all true``)."""
    completed = mutmut(tree, "results", "--all", "true")
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"(?m)^\s*(\S+): (.+)$", completed.stdout)}


def run_group(group: Group, names, scratch: Path) -> tuple:
    """(name -> status, name -> diff of each mutant not killed, seconds, mutmut's log tail) for one group."""
    started = time.perf_counter()
    tree = copy_project(scratch / group.slug)
    configure_tree(tree, group)
    stats = STATS / f"{group.slug}.json"
    if stats.exists():
        (tree / "mutants").mkdir(exist_ok=True)
        shutil.copy(stats, tree / "mutants" / "mutmut-stats.json")
    log = scratch / f"{group.slug}.log"
    patterns = [p for patterns in group.modules.values() for p in patterns]
    run = mutmut(tree, "run", "--max-children", str(group.most_children), *(names or patterns), log=log)
    outcome = {n: s for n, s in results(tree).items() if any(fnmatch.fnmatchcase(n, p) for p in names or patterns)}
    diffs = {n: mutmut(tree, "show", n).stdout for n, s in outcome.items() if s not in KILLED}
    if (tree / "mutants" / "mutmut-stats.json").exists() and names is None:
        STATS.mkdir(parents=True, exist_ok=True)
        shutil.copy(tree / "mutants" / "mutmut-stats.json", stats)
    return ({} if run.returncode else outcome), diffs, time.perf_counter() - started, log_tail(log.read_text())


def log_tail(text: str, lines: int = 60) -> str:
    """mutmut's last lines without its spinner's frames (ten a second), which would fill any fixed tail."""
    kept = [line for line in re.split(r"[\r\n]+", text) if line.strip() and line.lstrip()[:1] not in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"]
    return "\n".join(kept[-lines:])


def commit() -> str:
    """The commit a run copies, as its rows in scores.md name it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return (head.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


def score_row(module: str, statuses: dict, listed: dict) -> dict:
    """A module's counts: its mutants, those killed, its listed survivors by kind, and the two scores (of the
    mutants not equivalent: killed here, and killed here or on the GPU)."""
    names = [n for n in statuses if module_of(n) == module]
    survivors = [n for n in names if statuses[n] not in KILLED]
    kinds = {kind: sum(listed.get(n, ("",))[0] == kind for n in survivors) for kind in KINDS}
    scored, killed = len(names) - kinds["equivalent"], len(names) - len(survivors)
    percent = lambda count: f"{100 * count / scored:.1f} %" if scored else "-"
    return {"mutants": len(names), "killed": killed, **kinds, "not listed": len(survivors) - sum(kinds.values()),
            "score": percent(killed), "with the GPU's kills": percent(killed + kinds["gpu-killed"])}


SCORE_COLUMNS = ("module", "group", "run", "survivors rerun", "mutants", "killed", *KINDS, "not listed", "score",
                 "with the GPU's kills")


def read_scores(path: Path = SCORES) -> dict:
    """module -> row (column -> text) of scores.md's table."""
    rows = [line.strip().strip("|").split("|") for line in path.read_text().splitlines() if line.startswith("| ")]
    return {cells[0].strip(): dict(zip(SCORE_COLUMNS, (c.strip() for c in cells))) for cells in rows[1:]}


def write_scores(record: dict, listed: dict, path: Path = SCORES) -> None:
    """Rewrite the rows of the groups ``record`` holds (the groups run in this checkout); keep the others."""
    rows = read_scores(path) if path.exists() else {}
    for group in GROUPS:
        run = record["groups"].get(group.name)
        for module in group.modules if run else ():
            reruns = [r for r in run.get("survivors_reruns", []) if module in r["modules"]]
            when = lambda r: f"{r['commit'].split()[0]}, {r['date']}, {r['seconds']} s"
            row = {"module": module, "group": group.name, "run": when(run),
                   "survivors rerun": when(reruns[-1]) if reruns else "", **score_row(module, record["mutants"], listed)}
            rows[module] = {column: str(row[column]) for column in SCORE_COLUMNS}
    order = [m for g in GROUPS for m in g.modules]
    lines = ["# mutmut's score per module", "",
             "Written by `python tools/mutation/run_mutmut.py --save`. The score counts the mutants killed among "
             "those not listed as equivalent in survivors.txt; the last column also counts the gpu-only ones that "
             "the tests under tests/gpu killed on the GPU machine (gpu-killed).", "",
             "| " + " | ".join(SCORE_COLUMNS) + " |", "|" + "---|" * len(SCORE_COLUMNS)]
    lines += ["| " + " | ".join(rows[m][c] for c in SCORE_COLUMNS) + " |" for m in order if m in rows]
    path.write_text("\n".join(lines) + "\n")


def write_killed_sample(record: dict, path: Path = KILLED_SAMPLE) -> None:
    """Per group run, SAMPLE_PER_GROUP of the mutants it killed (drawn with a fixed seed); other groups' kept."""
    kept = [n for n in (read_killed_sample(path) if path.exists() else [])
            if group_of_module(module_of(n)).name not in record["groups"]]
    drawn = []
    for group in GROUPS:
        if group.name in record["groups"] and group.ci_sample:
            killed = sorted(n for n, s in record["mutants"].items() if module_of(n) in group.modules and s in KILLED)
            drawn += random.Random(17).sample(killed, min(SAMPLE_PER_GROUP, len(killed)))
    path.write_text("# Mutants that the last full run of their group killed (run_mutmut.py --save draws them); CI "
                    "samples these\n# and fails when one of them survives.\n" + "\n".join(sorted(kept + drawn)) + "\n")


def code_only(text: str) -> str:
    """The syntax tree without docstrings, comments, layout or line numbers: what mutmut mutates (no triple-quoted
    string), so two texts with the same ``code_only`` have the same mutants under the same names."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_of(group: Group) -> dict:
    """path -> a digest of the ``code_only`` of each of the group's files."""
    return {path: hashlib.sha256(code_only((ROOT / path).read_text()).encode()).hexdigest()[:16]
            for path in group_files(group)}


def why_not_the_same_mutants(group: Group, run: dict):
    """None when the group's files have the code of its recorded run (a survivors-only rerun needs its mutants),
    else why not."""
    changed = [path for path, digest in code_of(group).items() if run.get("code", {}).get(path) != digest]
    return f"the code of {', '.join(changed)} changed since its run at {run['commit']}" if changed else None


def save(outcome: dict, seconds: dict, survivors_only: bool, listed: dict, copied_at: str, code: dict) -> None:
    """Merge this run into .mutation/results.json (a full run replaces its groups' mutants, a survivors-only run
    the statuses it reran), then the parts of scores.md and (full run) killed_sample.txt of the groups run now."""
    record = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"groups": {}, "mutants": {}}
    today = datetime.date.today().isoformat()
    for group in GROUPS:
        if group.name not in seconds:
            continue
        ran = {"date": today, "commit": copied_at, "code": code[group.name], "seconds": round(seconds[group.name]),
               "mutants": sum(module_of(n) in group.modules for n in outcome)}
        if survivors_only:
            ran["modules"] = sorted({module_of(n) for n in outcome if module_of(n) in group.modules})
            record["groups"][group.name].setdefault("survivors_reruns", []).append(ran)
        else:
            record["groups"][group.name] = ran
            record["mutants"] = {n: s for n, s in record["mutants"].items() if module_of(n) not in group.modules}
    record["mutants"].update(outcome)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    ran_now = {**record, "groups": {g: r for g, r in record["groups"].items() if g in seconds}}
    write_scores(ran_now, listed, SCORES)
    if not survivors_only:
        write_killed_sample(ran_now, KILLED_SAMPLE)
    print(f"wrote {RESULTS.name}, {SCORES.name}" + ("" if survivors_only else f", {KILLED_SAMPLE.name}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    all_modules = [m for g in GROUPS for m in g.modules]
    parser.add_argument("--module", action="append", choices=all_modules, help="the groups holding these modules")
    parser.add_argument("--sample", type=int, help=f"this many mutants of {KILLED_SAMPLE.name}, drawn by --seed (CI)")
    parser.add_argument("--seed", type=int, default=17, help="the sample's seed (default 17)")
    parser.add_argument("--sample-groups", type=int, default=None, metavar="K", help="draw from K groups chosen by "
                        "the seed (each costs a mutmut set-up and statistics run)")
    parser.add_argument("--survivors", action="store_true", help=f"only the mutants the last run in {RESULTS.parent.name}/"
                        " left standing, with today's tests (refused when the group's code changed since)")
    parser.add_argument("--jobs", type=int, default=1, help="groups run at once (default 1)")
    parser.add_argument("--save", action="store_true", help=f"record the run and rewrite {SCORES.name}")
    options = parser.parse_args()
    listed = read_survivors()
    groups = [g for g in GROUPS if not options.module or set(g.modules) & set(options.module)]
    modules = [m for g in groups for m in g.modules]
    names_by_group = {g.name: None for g in groups}
    if options.sample:
        population = [n for n in read_killed_sample() if module_of(n) in modules]
        if options.sample_groups:
            present = sorted({group_of_module(module_of(n)).name for n in population})
            chosen = set(random.Random(options.seed).sample(present, min(options.sample_groups, len(present))))
            population = [n for n in population if group_of_module(module_of(n)).name in chosen]
            print(f"sample from {', '.join(sorted(chosen))} (seed {options.seed})", flush=True)
        selected = sorted(random.Random(options.seed).sample(population, min(options.sample, len(population))))
        names_by_group = {g.name: [n for n in selected if module_of(n) in g.modules] for g in groups}
    elif options.survivors:
        if not RESULTS.exists():
            raise SystemExit(f"no {RESULTS.relative_to(ROOT)}: run the groups whole with --save first")
        record = json.loads(RESULTS.read_text())
        for group in groups:
            run = record["groups"].get(group.name)
            why = why_not_the_same_mutants(group, run) if run else "it has no recorded run to complete"
            if why:
                raise SystemExit(f"[{group.name}] {why}: its mutants may not be the same ones, run the group whole")
        wanted = set(options.module or modules)  # the named modules' survivors, not their whole groups'
        names_by_group = {g.name: sorted(n for n, status in record["mutants"].items()
                                         if module_of(n) in g.modules and module_of(n) in wanted
                                         and status not in KILLED) for g in groups}
    names_by_group = {k: v for k, v in names_by_group.items() if v is None or v}
    copied_at, code = commit(), {g.name: code_of(g) for g in groups}  # what each group copies, whatever changes later
    started = time.perf_counter()
    outcome, diffs, seconds, problems = {}, {}, {}, []
    with tempfile.TemporaryDirectory(prefix="fp4-mutmut-") as scratch:
        chosen = [g for g in groups if g.name in names_by_group]
        with concurrent.futures.ThreadPoolExecutor(max(1, options.jobs)) as pool:
            runs = [pool.submit(run_group, group, names_by_group[group.name], Path(scratch)) for group in chosen]
            for group in chosen:
                names = names_by_group[group.name]
                print(f"[{group.name}] {len(names) if names else 'every'} mutant(s) of {', '.join(group.modules)}",
                      flush=True)
        for group, run in zip(chosen, runs):
            names = names_by_group[group.name]
            got, got_diffs, took, tail = run.result()
            print(f"[{group.name}] {len(got)} results in {took:.0f} s", flush=True)
            if not got:
                print(tail)
                problems.append(f"{group.name}: mutmut produced no results")
                continue
            missing = sorted(set(names or ()) - set(got)) if options.sample else []
            if missing:
                problems.append(f"{group.name}: {len(missing)} sampled mutant(s) no longer exist ({', '.join(missing[:5])}"
                                f"...): run the group with --save to draw {KILLED_SAMPLE.name} anew")
            seconds[group.name] = took
            outcome.update(got)
            diffs.update(got_diffs)

    for name, status in sorted(outcome.items()):
        if status in KILLED:
            if name in listed:
                problems.append(f"{name}: listed in {SURVIVORS.name} but now {status}; take it off the list")
        elif options.sample:
            problems.append(f"{name}: killed by its group's last full run but now {status} (a test stopped "
                            f"protecting this)\n{diffs.get(name, '')}")
        elif name not in listed:
            problems.append(f"{name}: {status}, not listed in {SURVIVORS.name} (kill it with a test, or list it "
                            f"with its kind and reason)\n{diffs.get(name, '')}")
    if not (options.sample or options.survivors):
        problems += [f"{name}: listed in {SURVIVORS.name} but no such mutant exists any more" for name in listed
                     if module_of(name) in modules and name not in outcome
                     and group_of_module(module_of(name)).name in seconds]
    for module, row in ((m, score_row(m, outcome, listed)) for m in modules):
        if row["mutants"]:
            print(f"{module:24} " + ", ".join(f"{row[c]} {c}" for c in SCORE_COLUMNS[4:]))
    print(f"all {sum(s in KILLED for s in outcome.values())} of {len(outcome)} killed "
          f"({time.perf_counter() - started:.0f} s)")
    for problem in problems:
        print("PROBLEM", problem)
    if options.save and seconds and not options.sample:
        save(outcome, seconds, options.survivors, listed, copied_at, code)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
