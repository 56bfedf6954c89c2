"""The generated mutants only a GPU can tell apart, run against the GPU tests survivors.txt names for them.

``pack`` (here, with mutmut installed) writes each gpu-only survivor as an edit of ``src/`` (the smallest run
of whole lines that differs, widened until it occurs once in its file) with the tests its reason names;
``run_mutations.py --from`` applies each on the GPU machine and runs those tests; ``record`` marks each killed
one ``gpu-killed`` in survivors.txt and fails on each the named tests let survive.

    python tools/mutation/gpu_mutants.py pack --out .mutation/gpu.json [--module verify/checks] [--unrun]
    bash tests/gpu/run.sh --mutations --from .mutation/gpu.json --json $OUT/kills.json --jobs 8   # GPU machine
    python tools/mutation/gpu_mutants.py record kills.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_mutmut import (GROUPS, SURVIVORS, commit, configure_tree, group_of_module, module_of, read_survivors,  # noqa: E402
                        write_survivors)
from run_mutations import copy_project  # noqa: E402

_TEST = re.compile(r"(?:tests/gpu/)?test_gpu_\w+\.py(?:::\w+)?")
_SAME_AS = re.compile(r"\bas (x_\w+__mutmut_\d+)")


def named_tests(name: str, listed: dict, seen=()) -> tuple:
    """The GPU tests a gpu-only survivor's reason names; "as <other mutant>" borrows that mutant's."""
    reason = listed[name][1]
    tests = tuple(dict.fromkeys(t if t.startswith("tests/gpu/") else f"tests/gpu/{t}" for t in _TEST.findall(reason)))
    if tests:
        return tests
    other = _SAME_AS.search(reason)
    if other:
        borrowed = name.rsplit(".", 1)[0] + "." + other.group(1)
        if borrowed in listed and borrowed not in seen:
            return named_tests(borrowed, listed, (*seen, name))
    return ()


def source_path(name: str) -> str:
    """src/... of a mutant's module (``_fp4_dynamo_shim.verify.checks.x_f__mutmut_3`` -> its file)."""
    return "src/" + name.split(".x")[0].replace(".", "/") + ".py"


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


def mutated_texts(names: list) -> dict:
    """name -> (original text, mutated text), rebuilt by mutmut from today's source."""
    from mutmut.mutation import diff_apply  # dev dependency; the GPU machine never packs
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    texts, by_group = {}, {}
    for name in names:
        by_group.setdefault(group_of_module(module_of(name)).name, []).append(name)
    with tempfile.TemporaryDirectory() as scratch:
        for group in [g for g in GROUPS if g.name in by_group]:
            members = by_group[group.name]
            tree = copy_project(Path(scratch) / group.slug)
            configure_tree(tree, group)
            subprocess.run([sys.executable, "-c", "from mutmut.__main__ import create_mutants; create_mutants(1)"],
                           cwd=tree, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=True, capture_output=True)
            parsed = {}  # a generated file holds every mutant of its functions: parse it once
            for name in members:
                path = source_path(name)
                original = (tree / path).read_text()
                if path not in parsed:
                    parsed[path] = (diff_apply.cst.parse_module(original),
                                    diff_apply.cst.parse_module((tree / "mutants" / path).read_text()))
                module, mutants_module = parsed[path]
                found = diff_apply.find_top_level_function_or_method(module, orig_function_and_class_names_from_key(name)[0])
                mutant = diff_apply.read_mutant_function(mutants_module, name.rsplit(".", 1)[1])  # original's name
                texts[name] = (original, module.deep_replace(found, mutant).code)
    return texts


def pack(options) -> int:
    listed = read_survivors()
    kinds = ("gpu-only",) if options.unrun else ("gpu-only", "gpu-killed")
    names = sorted(n for n, (kind, _) in listed.items() if kind in kinds
                   and (not options.module or module_of(n) in options.module))
    unnamed = [n for n in names if not named_tests(n, listed)]
    texts = mutated_texts([n for n in names if n not in unnamed])
    mutations = []
    for name, (original, mutated) in sorted(texts.items()):
        old, new = smallest_edit(original, mutated)
        mutations.append({"name": name, "why": listed[name][1], "path": source_path(name), "old": old, "new": new,
                          "tests": list(named_tests(name, listed))})
    for name in unnamed:
        print(f"{name}: its reason names no test under tests/gpu", file=sys.stderr)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"commit": commit(), "mutations": mutations}, indent=1) + "\n")
    print(f"wrote {len(mutations)} mutants to {options.out}" + (f"; {len(unnamed)} refused" if unnamed else ""))
    return 1 if unnamed else 0


def record(reports: list, survivors: Path = SURVIVORS) -> list:
    """Mark in ``survivors`` each gpu-only mutant that the ``run_mutations.py --json`` reports say was caught as
    gpu-killed; returns what they contradict (a mutant that survived its named tests, or one not listed gpu-only)."""
    listed, problems = read_survivors(survivors), []
    for path in reports:
        for result in json.loads(Path(path).read_text())["results"]:
            name = result["name"]
            if listed.get(name, ("",))[0] not in ("gpu-only", "gpu-killed"):
                problems.append(f"{name}: not a gpu-only survivor of {survivors.name}")
            elif result["result"] == "caught":
                listed[name] = ("gpu-killed", listed[name][1])
            else:
                problems.append(f"{name}: {result['result']} on the GPU ({result['detail']}); mend the test its line "
                                f"names, or list it as open")
    write_survivors(listed, survivors)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="write the gpu-only survivors as edits with their named GPU tests")
    packing.add_argument("--out", type=Path, required=True)
    packing.add_argument("--module", action="append", help="only these modules' survivors (groups.toml's names)")
    packing.add_argument("--unrun", action="store_true", help="only those no GPU run has killed yet (gpu-only)")
    recording = verbs.add_parser("record", help="mark the kills of run_mutations.py --json reports in survivors.txt")
    recording.add_argument("results", nargs="+")
    options = parser.parse_args()
    if options.verb == "pack":
        return pack(options)
    problems = record(options.results)
    print("\n".join(problems), file=sys.stderr)
    gpu = [kind for kind, _ in read_survivors().values() if kind in ("gpu-only", "gpu-killed")]
    print(f"{gpu.count('gpu-killed')} of {len(gpu)} gpu-only survivors killed on the GPU")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
