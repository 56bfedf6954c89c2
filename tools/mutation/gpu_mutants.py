"""The generated mutants only a GPU can tell apart, run against the GPU tests survivors.txt names for them.

A ``gpu-only`` line of survivors.txt claims that a named test under tests/gpu kills the mutant on the H200.
This makes the claim a run: ``pack`` (here, with mutmut installed) writes each such mutant as an edit of
``src/`` (the smallest run of whole lines that differs, widened until it occurs once in its file) with the
tests its reason names; ``run_mutations.py --from`` applies each on the GPU machine and runs those tests, as
it does the curated mutations; ``record`` keeps what came back in ``gpu_kills.json`` (committed), per
mutant, with the commit, date and site it ran on.

    python tools/mutation/gpu_mutants.py pack --out .gpumut/mutants.json [--module verify/checks]
    bash tests/gpu/run.sh --mutations --from .gpumut/mutants.json --json $OUT/kills.json --jobs 8   # GPU machine
    python tools/mutation/gpu_mutants.py record kills.json --site "FlashInfer 0.6.3 + SGLang 0.5.9"

``pack`` refuses a mutant whose rebuilt diff is not the one mutmut_results.json holds (the source changed
since that run: the names would point at other mutants), and one whose reason names no GPU test.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_mutmut import (GPU_KILLS, RESULTS, ROOT, commit, configure_tree, gpu_kills,  # noqa: E402
                        group_of_module, module_of, named_tests, read_survivors)
from run_mutations import copy_project  # noqa: E402

def source_path(name: str) -> str:
    """src/... of a mutant's module (``_fp4_dynamo_shim.verify.checks.x_f__mutmut_3`` -> its file)."""
    module = name.split(".x")[0]
    return "src/" + module.replace(".", "/") + ".py"


def smallest_edit(original: str, mutated: str) -> tuple:
    """(old, new): the whole lines that differ, widened line by line until ``old`` occurs once in ``original``."""
    before, after = original.splitlines(keepends=True), mutated.splitlines(keepends=True)
    start = 0
    while start < min(len(before), len(after)) and before[start] == after[start]:
        start += 1
    end_before, end_after = len(before), len(after)
    while end_before > start and end_after > start and before[end_before - 1] == after[end_after - 1]:
        end_before, end_after = end_before - 1, end_after - 1
    while True:
        old, new = "".join(before[start:end_before]), "".join(after[start:end_after])
        if old and original.count(old) == 1:
            return old, new
        if start == 0 and end_before == len(before):
            raise ValueError("no edit occurs once in the file")
        start, end_before, end_after = max(0, start - 1), min(len(before), end_before + 1), end_after + (
            1 if end_before < len(before) else 0)


def changed_lines(original: str, mutated: str) -> str:
    """The -/+ lines between two texts, as mutmut_results.json keeps a mutant's diff."""
    return "\n".join(line for line in difflib.unified_diff(original.splitlines(), mutated.splitlines(), lineterm="")
                     if line.startswith(("+", "-")) and not line.startswith(("+++", "---")))


def mutated_texts(names: list) -> dict:
    """name -> (original text, mutated text), rebuilt by mutmut from today's source."""
    from mutmut.mutation import diff_apply  # dev dependency; the GPU machine never packs
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    texts = {}
    by_group = {}
    for name in names:
        by_group.setdefault(group_of_module(module_of(name)).name, []).append(name)
    with tempfile.TemporaryDirectory() as scratch:
        for group_name, members in by_group.items():
            group = group_of_module(module_of(members[0]))
            tree = copy_project(Path(scratch) / group.slug)
            configure_tree(tree, group)
            environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            subprocess.run([sys.executable, "-c", "from mutmut.__main__ import create_mutants; create_mutants(1)"],
                           cwd=tree, env=environment, check=True, capture_output=True)
            parsed = {}  # a generated file holds every mutant of its functions: parse it once
            for name in members:
                path = source_path(name)
                original = (tree / path).read_text()
                if path not in parsed:
                    parsed[path] = (diff_apply.cst.parse_module(original),
                                    diff_apply.cst.parse_module((tree / "mutants" / path).read_text()))
                module, mutants_module = parsed[path]
                function_name, _ = orig_function_and_class_names_from_key(name)
                found = diff_apply.find_top_level_function_or_method(module, function_name)
                mutant = diff_apply.read_mutant_function(mutants_module, name.rsplit(".", 1)[1])  # original's name
                texts[name] = (original, module.deep_replace(found, mutant).code)
    return texts


def pack(options) -> int:
    listed = read_survivors()
    record = json.loads(RESULTS.read_text())
    names = sorted(n for n, (kind, _) in listed.items() if kind == "gpu-only"
                   and (not options.module or module_of(n) in options.module))
    problems, mutations = [], []
    texts = mutated_texts(names)
    for name in names:
        tests = named_tests(name, listed)
        original, mutated = texts[name]
        if not tests:
            problems.append(f"{name}: its reason names no test under tests/gpu")
            continue
        if changed_lines(original, mutated) != record["not_killed"].get(name):
            problems.append(f"{name}: today's mutant is not the one {RESULTS.name} holds (the source changed)")
            continue
        old, new = smallest_edit(original, mutated)
        mutations.append({"name": name, "why": listed[name][1], "path": source_path(name), "old": old, "new": new,
                          "tests": list(tests)})
    for problem in problems:
        print(problem, file=sys.stderr)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"commit": commit(), "mutations": mutations}, indent=1) + "\n")
    print(f"wrote {len(mutations)} mutants to {options.out}" + (f"; {len(problems)} refused" if problems else ""))
    return 1 if problems else 0


def record(options) -> int:
    kills = gpu_kills()
    listed = read_survivors()
    for path in options.results:
        document = json.loads(Path(path).read_text())
        for result in document["results"]:
            if result["name"] not in listed:
                print(f"{result['name']}: not a listed survivor; skipped", file=sys.stderr)
                continue
            kills[result["name"]] = {"result": result["result"], "detail": result["detail"], "tests": result["tests"],
                                     "seconds": round(result["seconds"]), "commit": document["commit"],
                                     "date": options.date, "site": options.site, "machine": options.machine}
    GPU_KILLS.write_text(json.dumps(dict(sorted(kills.items())), indent=1) + "\n")
    gpu_only = [n for n, (kind, _) in listed.items() if kind == "gpu-only"]
    caught = sum(kills.get(n, {}).get("result") == "caught" for n in gpu_only)
    print(f"wrote {GPU_KILLS.relative_to(ROOT)}: {caught} of {len(gpu_only)} gpu-only survivors killed on the GPU")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="write the gpu-only survivors as edits with their named GPU tests")
    packing.add_argument("--out", type=Path, required=True)
    packing.add_argument("--module", action="append", help="only these modules' survivors (run_mutmut's names)")
    recording = verbs.add_parser("record", help=f"merge run_mutations.py --json reports into {GPU_KILLS.name}")
    recording.add_argument("results", nargs="+")
    recording.add_argument("--site", required=True, help="the FlashInfer/SGLang releases the tests ran with")
    recording.add_argument("--machine", default="NVIDIA H200 (SM90)")
    recording.add_argument("--date", default=datetime.date.today().isoformat())
    options = parser.parse_args()
    return pack(options) if options.verb == "pack" else record(options)


if __name__ == "__main__":
    sys.exit(main())
