"""Generated mutation testing with mutmut over the modules whose bugs are silent, checked against a list.

mutmut (3.x) writes every mutant of the chosen functions and runs, for each, the tests that reach that
function (its common settings are ``[tool.mutmut]`` in pyproject.toml; tests/support/mutmut_support.py lets its
trampolines run under torch.compile and keeps a mutant's session cheap). The modules are run in GROUPS, each
in its own temporary copy of the project with its own test selection: the fast tests that protect those
modules, so a surviving mutant (which runs every selected test that reaches its function) costs seconds,
not the whole suite. The outcome is held against ``survivors.txt``: every surviving mutant must be listed
there with the reason it is equivalent, and every listed one must still exist and still survive. It prints
the killed ratio per module, listed mutants excluded.

    python tools/mutation/run_mutmut.py --save          # the full run; writes mutmut_results.json (committed)
    python tools/mutation/run_mutmut.py --module layout # the group holding one module (its other modules too)
    python tools/mutation/run_mutmut.py --sample 40 --sample-groups 3 --seed N
        # CI: 40 mutants the committed run killed, from 3 groups chosen by N (CI takes it from the commit);
        # fails when one of them now survives
    python tools/mutation/run_mutmut.py --module layout --survivors --save
        # only what the module's committed run left standing, with today's tests (added since), merged into
        # that run; refused when the group's code changed since its commit (the mutants would not be the same;
        # docstrings and comments may change)

Exits 1 when a mutant survives unlisted, a listed one is killed or gone, or mutmut itself fails.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import fnmatch
import functools
import json
import os
import random
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
#: Each group's stats from the last full run (which test reaches which function, and what it costs), so
#: a sample run reuses them instead of running the group's whole selection once more.
STATS = HERE / "mutmut_stats"
#: What the GPU machine made of the gpu-only survivors (tools/mutation/gpu_mutants.py record).
GPU_KILLS = HERE / "gpu_kills.json"
sys.path.insert(0, str(HERE))
from run_mutations import copy_project  # noqa: E402

_SUBPROCESS_TESTS = (  # minutes of venvs and children, which mutmut's trampolines do not follow
    "--deselect", "tests/activation/test_routes.py::test_the_sitecustomize_route_records_itself_and_honours_the_kill_switch",
    "--deselect", "tests/lifecycle/test_lifecycle.py::test_import_without_flashinfer_installed_succeeds_and_says_so",
)
#: Tests that compare a compiled region with eager execution, where both compute with the same reference
#: arithmetic: they see a mutant of it only if it breaks tracing, and cost an inductor build per run.
_COMPILED_AGAINST_EAGER = (
    "--deselect", "tests/fp4/test_family.py::test_traces_with_no_graph_breaks_runs_and_matches_eager",
    "--deselect", "tests/fp4/test_properties.py::test_compiled_fp4_quantize_matches_eager",
)
_STATUS_PROPERTY = ("--deselect", "tests/fp4/test_properties.py::test_status_keeps_its_keys_and_names_every_unknown_value")


@dataclasses.dataclass(frozen=True)
class Group:
    """Modules run together: their files, the mutant names in scope per module, the tests that protect them."""

    name: str
    modules: dict
    tests: tuple
    #: At most this many mutants at once, whatever --max-children says (see the group that sets it).
    most_children: int = 2

    @property
    def slug(self) -> str:
        return re.sub(r"\W+", "-", self.name)


def _package_file(pattern: str) -> str:
    module = pattern.split(".x")[0].rstrip(".*")
    return "src/" + module.replace(".", "/") + ".py"


GROUPS = (  # cheapest first
    Group("arithmetic", {
        "fp4_arithmetic": ["_fp4_dynamo_shim.fp4.arithmetic.*"],
        "reference": ["_fp4_dynamo_shim.fp4.reference.*"],
        "layout": ["_fp4_dynamo_shim.fp4.layout.*"],
    }, ("tests/fp4/test_reference.py", "tests/fp4/test_family_reference_values.py", "tests/fp4/test_kernel_modes.py",
        "tests/fp4/test_arithmetic.py", "tests/fp4/test_kernel_switches_and_float32_edges.py", "tests/fp4/test_layouts.py",
        "tests/fp4/test_properties.py",
        "tests/fp4/test_family.py", *_SUBPROCESS_TESTS, *_COMPILED_AGAINST_EAGER, *_STATUS_PROPERTY)),
    Group("start-up and tables", {
        "switches": ["_fp4_dynamo_shim.switches.*"],
        "targets": ["_fp4_dynamo_shim.fp4.releases.*"],
    }, ("tests/lifecycle/test_settings.py", "tests/lifecycle/test_versions.py",
        "tests/activation/test_routes.py::test_install_honours_the_kill_switch_in_process",
        "tests/activation/test_routes.py::test_status_lists_what_the_plugin_rebound", "tests/fp4/test_properties.py", "tests/lifecycle/test_lifecycle.py", *_SUBPROCESS_TESTS,
        "tests/fp4/test_op.py::test_each_release_gets_the_row_its_wheel_calls_for",
        "tests/fp4/test_op.py::test_swizzled_scale_factor_columns_follow_the_release",
        "tests/fp4/test_op.py::test_linear_scale_factor_buffer_is_padded_where_the_release_pads_it",
        "tests/fp4/test_op.py::test_fake_matches_real_shapes_dtypes_and_strides_for_every_release_row",
        "tests/fp4/test_flashinfer_op.py::test_the_release_table_says_what_flashinfers_op_body_does")),
    Group("settings and leaves", {
        "settings": ["_fp4_dynamo_shim.settings.*"],
        "versions": ["_fp4_dynamo_shim.versions.*"],
        "cuda_version": ["_fp4_dynamo_shim.cuda_version.*"],
        "rebind": ["_fp4_dynamo_shim.rebind.*"],
        "devices": ["_fp4_dynamo_shim.fp4.devices.*"],
    }, ("tests/lifecycle/test_settings.py", "tests/lifecycle/test_versions.py", "tests/lifecycle/test_cuda_version.py",
        "tests/lifecycle/test_gpu_state_seam.py", "tests/lifecycle/test_rebinding_kept_originals.py",
        "tests/lifecycle/test_lifecycle.py", "tests/fp4/test_direct_path.py", "tests/fp4/test_parity.py",
        "tests/fp4/test_compile.py::test_module_that_imported_fp4_quantize_before_the_shim_is_rebound_and_compiles",
        *_SUBPROCESS_TESTS)),
    Group("checks", {
        "checks": ["_fp4_dynamo_shim.verify.checks.*"],
    }, ("tests/verify/test_verify_checks_on_cpu.py", "tests/verify/test_verify_checks_on_cpu.py::test_verifys_compiled_vs_eager_check_fails_on_a_one_bit_difference",
        "tests/fp4/test_flashinfer_op.py::test_verify_compiles_flashinfers_op_with_a_kernel_that_cannot_take_fake_tensors")),
    Group("family", {
        "family_ops": ["_fp4_dynamo_shim.fp4.family_ops.*"],
        "family": ["_fp4_dynamo_shim.fp4.family.*"],
    }, ("tests/fp4/test_family.py", "tests/fp4/test_family_arithmetic.py", "tests/fp4/test_layouts.py",
        "tests/fp4/test_family_table.py", "tests/fp4/test_family_parity.py", "tests/fp4/test_family_checks.py",
        "tests/fp4/test_family_kernel.py", "tests/fp4/test_family_replacements.py",
        "tests/fp4/test_properties.py", *_SUBPROCESS_TESTS,
        *_STATUS_PROPERTY)),
    Group("tracing", {
        "wrapper (direct path)": ["_fp4_dynamo_shim.fp4.replacement.x__direct_path__mutmut_*",
                                  "_fp4_dynamo_shim.fp4.replacement.x_build__mutmut_*"],
        "ops": ["_fp4_dynamo_shim.fp4.quantize_op.*"],
        "flashinfer_op": ["_fp4_dynamo_shim.fp4.flashinfer_op.*"],
    }, ("tests/fp4/test_op.py", "tests/fp4/test_compile.py", "tests/fp4/test_flashinfer_op.py", "tests/fp4/test_parity.py",
        "tests/fp4/test_battery.py", "tests/fp4/test_direct_path.py", "tests/fp4/test_layouts.py", "tests/fp4/test_properties.py",
        "tests/fp4/test_release_signatures.py", "tests/fp4/test_flashinfer_op_repair.py",
        "tests/fp4/test_op_refusals.py", "tests/lifecycle/test_lifecycle.py",
        *_SUBPROCESS_TESTS, *_STATUS_PROPERTY)),
    Group("sglang tables", {
        "sglang/releases": ["_fp4_dynamo_shim.sglang.releases.*"],
        "sglang/source": ["_fp4_dynamo_shim.sglang.source.*"],
        "verify/sglang": ["_fp4_dynamo_shim.verify.sglang.*"],
    }, ("tests/sglang/test_sglang_releases.py", "tests/sglang/test_sglang_source.py",
        "tests/sglang/test_sglang_source_shapes.py", "tests/sglang/test_user_lines.py",
        "tests/verify/test_verify_checks_on_cpu.py")),
    Group("verify", {
        "verify/report": ["_fp4_dynamo_shim.verify.report.*"],
        "verify/workers": ["_fp4_dynamo_shim.verify.workers.*"],
    }, ("tests/verify/test_verify_checks_on_cpu.py", "tests/verify/test_verify_report_words.py", "tests/verify/test_worker_check_in_process.py",
        "tests/sglang/test_user_lines.py",
        "tests/declared/test_declared.py::test_verify_says_what_the_gpu_record_holds_for_the_installed_release")),
    Group("lifecycle", {
        "lifecycle": ["_fp4_dynamo_shim.lifecycle.*"],
        "oplib": ["_fp4_dynamo_shim.oplib.*"],
    }, ("tests/lifecycle/test_lifecycle.py", "tests/lifecycle/test_export.py", "tests/lifecycle/test_op_definition.py",
        "tests/lifecycle/test_apply_steps.py",
        "tests/lifecycle/test_faults.py", "tests/lifecycle/test_settings.py", "tests/lifecycle/test_versions.py",
        "tests/lifecycle/test_cuda_version.py",
        "tests/activation/test_routes.py::test_install_honours_the_kill_switch_in_process",
        "tests/activation/test_routes.py::test_status_lists_what_the_plugin_rebound", *_SUBPROCESS_TESTS)),
    Group("declared", {
        "declared/scan": ["_fp4_dynamo_shim.declared.scan.*"],
        "declared/codegen": ["_fp4_dynamo_shim.declared.codegen.*"],
        "declared/build": ["_fp4_dynamo_shim.declared.build.*"],
        "declared/layer": ["_fp4_dynamo_shim.declared.layer.*"],
        "declared/rules": ["_fp4_dynamo_shim.declared.rules.*"],
        "declared/polyfill": ["_fp4_dynamo_shim.declared.polyfill.*"],
    }, ("tests/declared/test_declared.py", "tests/declared/test_declared_schemas.py",
        "tests/declared/test_declared_exclusions_and_shim_fakes.py", "tests/declared/test_declared_fakes.py",
        "tests/declared/test_declared_getter.py", "tests/declared/test_declarations_read_from_source.py",
        "tests/declared/test_declared_gates_and_registration.py", "tests/declared/test_declared_polyfills.py",
        "tests/declared/test_declared_op_calls.py", "tests/declared/test_declared_op_names_and_refusals.py")),
    Group("start-up and front", {
        "routes/site_files": ["_fp4_dynamo_shim.routes.site_files.*"],
        "routes/importer": ["_fp4_dynamo_shim.routes.importer.*"],
        "entry/startup": ["_fp4_dynamo_shim.entry.startup.*"],
        "entry/sglang_plugin": ["_fp4_dynamo_shim.entry.sglang_plugin.*"],
        "cli": ["_fp4_dynamo_shim.cli.*"],
        "usage": ["_fp4_dynamo_shim.usage.*"],
    }, ("-m", "not slow", "tests/activation/test_routes.py", "tests/activation/test_activation.py",
        "tests/activation/test_installed_lines.py", "tests/activation/test_hook_files_written.py",
        "tests/activation/test_start_up_hook_and_plugin.py", "tests/verify/test_cli.py", "tests/verify/test_cli_commands.py",
        "tests/verify/test_verify_report_words.py",
        "tests/verify/test_worker_check_in_process.py", "tests/lifecycle/test_export.py", "tests/lifecycle/test_apply_steps.py",
        "tests/lifecycle/test_lifecycle.py", "tests/lifecycle/test_rebinding_kept_originals.py", *_SUBPROCESS_TESTS),
        # A mutant that loses the temporary site directory writes the interpreter's own; the tests' guard
        # (tests/support/own_site.py) fails it and puts the files back, which only works one mutant at a time.
        most_children=1),
    # Every test applies the shim (an autouse fixture), so every test reaches these two: the tests about
    # applying, the kernel modes and the JIT build's faults (without their two multi-process ones) keep a
    # surviving mutant's run under a minute.
    Group("FP4 kernels and layer", {
        "fp4/kernels": ["_fp4_dynamo_shim.fp4.kernels.*"],
        "fp4/layer": ["_fp4_dynamo_shim.fp4.layer.*"],
    }, ("tests/fp4/test_gpus_loaded_at_apply.py", "tests/fp4/test_fp4_layer_apply_and_status.py", "tests/fp4/test_kernel_modes.py",
        "tests/fp4/test_family_kernel.py", "tests/lifecycle/test_apply_steps.py",
        "tests/lifecycle/test_lifecycle.py", "tests/lifecycle/test_faults.py", "tests/lifecycle/test_rebinding_kept_originals.py",
        "--deselect", "tests/lifecycle/test_faults.py::test_eight_processes_applying_at_once_all_succeed",
        "--deselect", "tests/lifecycle/test_faults.py::test_without_nvcc_and_without_torch_cuda_apply_still_succeeds_and_says_so",
        *_SUBPROCESS_TESTS)),
    # A release newer than tested, judged from its sources: the tool's tests run it in this process.
    Group("newer releases", {
        "sources": ["_fp4_dynamo_shim.sources.*"],
        "release_parts": ["_fp4_dynamo_shim.release_parts.*"],
        "fp4/parts": ["_fp4_dynamo_shim.fp4.parts.*"],
    }, ("tests/tools/test_release_parts.py", "tests/lifecycle/test_newer_release.py")),
)
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def group_files(group: Group) -> list:
    return sorted({_package_file(p) for patterns in group.modules.values() for p in patterns})


def module_of(name: str):
    for group in GROUPS:
        for module, patterns in group.modules.items():
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                return module
    return None


def group_of_module(module: str) -> Group:
    return next(group for group in GROUPS if module in group.modules)


#: How a listed survivor counts: an equivalent mutant is left out of the score; one that could not be
#: killed here (it differs only on a GPU, or no test found yet tells it apart) counts as not killed.
KINDS = ("equivalent", "gpu-only", "open")


def read_survivors() -> dict:
    """name -> (kind, reason), from ``survivors.txt``: ``name  # kind: reason`` per line, kind one of KINDS
    (blank lines and comment lines skipped)."""
    listed = {}
    for line in SURVIVORS.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, note = line.partition("#")
        kind, _, reason = note.partition(":")
        if kind.strip() not in KINDS or not reason.strip():
            raise SystemExit(f"{SURVIVORS.name}: {name.strip()}: expected '# kind: reason', kind one of {KINDS}")
        listed[name.strip()] = (kind.strip(), reason.strip())
    return listed


def gpu_kills() -> dict:
    return json.loads(GPU_KILLS.read_text()) if GPU_KILLS.exists() else {}


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


@functools.lru_cache(maxsize=None)
def changed_since(commit_: str, paths: tuple) -> bool:
    """Whether any of ``paths`` differs between ``commit_`` and the working tree (True when git cannot say)."""
    return subprocess.run(["git", "diff", "--quiet", commit_, "--", *paths], cwd=ROOT).returncode != 0


def gpu_record(name: str, listed: dict, kills: dict):
    """What the GPU machine made of a listed survivor, or None. For a gpu-only line: a kill counts when the
    tests that made it are among those the line names today; a survival only when it ran every test the line
    names, and while their files are as they were then (a line naming other tests, or tests strengthened
    since, is a claim not yet run)."""
    record = kills.get(name)
    if record is None or name not in listed:
        return None
    if listed[name][0] == "gpu-only":
        named, ran = set(named_tests(name, listed)), set(record["tests"])
        if record["result"] == "caught":
            return record if ran <= named else None
        files = tuple(sorted({test.split("::")[0] for test in named}))
        if not named <= ran or changed_since(record["commit"], files):
            return None
    return record


def contradicted_gpu_claims(listed: dict, kills: dict) -> list:
    """Listed survivors whose GPU record contradicts their kind: a gpu-only one whose named GPU tests all
    passed on the GPU machine, or an equivalent or open one that a GPU test killed."""
    return sorted(name for name, (kind, _) in listed.items() if gpu_record(name, listed, kills) is not None
                  and (kills[name]["result"] == "caught") != (kind == "gpu-only"))


def _toml_list(values) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def configure_tree(tree: Path, group: Group) -> None:
    """The group's files and test selection in the copy's ``[tool.mutmut]`` (the rest stays pyproject's)."""
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    for key, values in (("only_mutate", group_files(group)), ("pytest_add_cli_args_test_selection", group.tests)):
        text, count = re.subn(rf"(?ms)^{key} = \[.*?\]$", lambda _: f"{key} = {_toml_list(values)}", text)
        assert count == 1, f"pyproject.toml: [tool.mutmut] {key} not found once"
    pyproject.write_text(text)


def mutmut(tree: Path, *arguments, log=None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("FP4_DYNAMO_SHIM", "MUTANT_UNDER_TEST")}
    environment.setdefault("OMP_NUM_THREADS", "1")  # two cores, shared: one thread per mutant
    environment["PYTHONDONTWRITEBYTECODE"] = "1"
    if log is None:
        return subprocess.run([sys.executable, "-m", "mutmut", *arguments], cwd=tree, env=environment,
                              capture_output=True, text=True)
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "mutmut", *arguments], cwd=tree, env=environment,
                              stdout=out, stderr=subprocess.STDOUT, text=True)


def results(tree: Path) -> dict:
    """name -> status of every mutant mutmut has a result for (``mutmut results --all true``)."""
    completed = mutmut(tree, "results", "--all", "true")
    outcome = {}
    for line in completed.stdout.splitlines():
        match = re.fullmatch(r"\s*(\S+): (.+)", line)
        if match:
            outcome[match.group(1)] = match.group(2).strip()
    return outcome


def diff_of(tree: Path, name: str) -> str:
    shown = mutmut(tree, "show", name).stdout
    return "\n".join(line for line in shown.splitlines()[1:] if line.startswith(("+", "-"))
                     and not line.startswith(("+++", "---")))


def run_group(group: Group, names, scratch: Path, children: int, stats_from=None) -> tuple:
    """(name -> status, name -> diff of each mutant not killed, seconds, mutmut's log tail) for one group."""
    started = time.perf_counter()
    tree = scratch / group.slug
    if not (tree / "pyproject.toml").exists():
        copy_project(tree)
        configure_tree(tree, group)
    if stats_from is not None and stats_from.exists():
        (tree / "mutants").mkdir(exist_ok=True)
        shutil.copy(stats_from, tree / "mutants" / "mutmut-stats.json")
    log = scratch / f"{tree.name}.log"
    patterns = [p for patterns in group.modules.values() for p in patterns]
    children = min(children, group.most_children)
    run = mutmut(tree, "run", "--max-children", str(children), *(names or patterns), log=log)
    outcome = {n: s for n, s in results(tree).items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    if names is not None:
        outcome = {n: s for n, s in outcome.items() if any(fnmatch.fnmatchcase(n, p) for p in names)}
    diffs = {n: diff_of(tree, n) for n, s in outcome.items() if s not in KILLED}
    tail = log.read_text()[-3000:]
    if run.returncode != 0:
        outcome = {}
    stats = tree / "mutants" / "mutmut-stats.json"
    if stats.exists():
        shutil.copy(stats, scratch / f"{tree.name}.stats.json")
    return outcome, diffs, time.perf_counter() - started, tail


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = lambda *paths: subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
                                              cwd=ROOT, capture_output=True, text=True).stdout.strip()
        # the mutants come from src/ alone: a tree whose src/ is the commit's can be compared with it later
        return head + (" (with uncommitted changes to src)" if dirty("src") else
                       " (with uncommitted changes outside src)" if dirty() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def scores_of(outcome: dict, listed: dict, modules) -> dict:
    scores = {}
    for module in modules:
        names = [n for n in outcome if module_of(n) == module]
        killed = sum(outcome[n] in KILLED for n in names)
        kinds = {kind: sum(n in listed and listed[n][0] == kind and outcome[n] not in KILLED for n in names)
                 for kind in KINDS}
        scored = len(names) - kinds["equivalent"]
        scores[module] = {"mutants": len(names), "killed": killed, **kinds,
                          "score": round(killed / scored, 4) if scored else None}
    return scores


def print_scores(scores: dict) -> None:
    print(f"{'module':24} {'mutants':>8} {'killed':>7} {'equiv.':>7} {'gpu-only':>8} {'open':>5} {'score':>7}")
    rows = list(scores.items())
    total = {key: sum(s[key] for s in scores.values()) for key in ("mutants", "killed", *KINDS)}
    scored = total["mutants"] - total["equivalent"]
    rows.append(("all", {**total, "score": total["killed"] / scored if scored else None}))
    for module, s in rows:
        score = f"{100 * s['score']:.1f}%" if s["score"] is not None else "-"
        print(f"{module:24} {s['mutants']:8} {s['killed']:7} {s['equivalent']:7} {s['gpu-only']:8} {s['open']:5} "
              f"{score:>7}")


def save(outcome: dict, diffs: dict, seconds: dict, groups, listed: dict, children: int, copied_at: str) -> None:
    """Merge this run's groups into mutmut_results.json (each group keeps the date and the commit its copy was
    taken at)."""
    record = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    mutants, not_killed, runs = record.get("mutants", {}), record.get("not_killed", {}), record.get("groups", {})
    for group in groups:
        if group.name not in seconds:
            continue
        mutants = {n: s for n, s in mutants.items() if module_of(n) not in group.modules}
        not_killed = {n: d for n, d in not_killed.items() if module_of(n) not in group.modules}
        runs[group.name] = {"date": datetime.date.today().isoformat(), "commit": copied_at,
                            "seconds": round(seconds[group.name]), "max_children": min(children, group.most_children),
                            "mutants": sum(module_of(n) in group.modules for n in outcome)}
    mutants.update(outcome)
    not_killed.update({n: diffs.get(n, "") for n, s in outcome.items() if s not in KILLED})
    all_modules = [m for g in GROUPS for m in g.modules]
    record = {"command": "python tools/mutation/run_mutmut.py --save", "groups": runs,
              "scores": scores_of(mutants, listed, all_modules), "mutants": dict(sorted(mutants.items())),
              "not_killed": dict(sorted(not_killed.items()))}
    RESULTS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


def table(listed: dict) -> str:
    """docs/testing.md's table: per module, the committed results counted against today's survivors.txt (a
    survivor triaged after its run counts by its kind; "not listed" ones are not triaged yet)."""
    record = json.loads(RESULTS.read_text())
    kills = gpu_kills()
    lines = ["| group (commit, date, seconds) | module | mutants | killed | equivalent | gpu-only (killed on the GPU) "
             "| open | not listed | score | with the GPU's kills |", "|---|---|---|---|---|---|---|---|---|---|"]
    for group in GROUPS:
        run = record["groups"].get(group.name)
        for module in group.modules:
            names = [n for n in record["mutants"] if module_of(n) == module]
            if run is None or not names:
                lines.append(f"| {group.name} (not run) | {module} | | | | | | | | |")
                continue
            survivors = [n for n in names if record["mutants"][n] not in KILLED]
            kinds = {kind: sum(listed.get(n, ("",))[0] == kind for n in survivors) for kind in KINDS}
            on_gpu = sum(listed.get(n, ("",))[0] == "gpu-only"
                         and (gpu_record(n, listed, kills) or {}).get("result") == "caught" for n in survivors)
            scored = len(names) - kinds["equivalent"]
            killed = len(names) - len(survivors)
            reruns = [r for r in run.get("survivors_reruns", []) if module in r["modules"]]
            when = f"{run['commit'].split()[0]}, {run['date']}, {run['seconds']} s" + "".join(
                f"; survivors rerun {r['commit'].split()[0]}, {r['date']}, {r['seconds']} s" for r in reruns)
            lines.append(f"| {group.name} ({when}) | {module} "
                         f"| {len(names)} | {killed} | {kinds['equivalent']} | {kinds['gpu-only']} ({on_gpu}) | {kinds['open']} "
                         f"| {len(survivors) - sum(kinds.values())} | {100 * killed / scored:.1f} % "
                         f"| {100 * (killed + on_gpu) / scored:.1f} % |")
    return "\n".join(lines)


def code_only(text: str) -> str:
    """The source's syntax tree without docstrings, comments, layout or line numbers: what mutmut's mutants are
    made from (it mutates no triple-quoted string), so two texts with the same ``code_only`` have the same
    mutants under the same names."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def why_not_the_same_mutants(group: Group, run: dict):
    """None when the group's files have the code of its committed run's commit (a survivors-only rerun is valid
    only over the same mutants, so over the same code; docstrings and comments may differ); else why not."""
    if "uncommitted" in run["commit"] and "outside src" not in run["commit"]:
        return f"its run at {run['commit']} copied a tree with uncommitted changes, which cannot be compared"
    at = run["commit"].split()[0]
    changed = subprocess.run(["git", "diff", "--name-only", at, "--", *group_files(group)], cwd=ROOT,
                             capture_output=True, text=True)
    if changed.returncode != 0:
        return f"git cannot compare with {run['commit']}: {changed.stderr.strip()}"
    differ = []
    for path in changed.stdout.split():
        then = subprocess.run(["git", "show", f"{at}:{path}"], cwd=ROOT, capture_output=True, text=True)
        now = ROOT / path
        if then.returncode != 0 or not now.exists() or code_only(then.stdout) != code_only(now.read_text()):
            differ.append(path)
    if differ:
        return f"the code of {', '.join(differ)} changed since its run at {run['commit']}"
    return None


def merge_survivors(outcome: dict, diffs: dict, seconds: dict, listed: dict, copied_at: str) -> None:
    """Write a survivors-only rerun into mutmut_results.json: each rerun mutant's status replaces the committed
    one (tests were only added, so a mutant killed then is killed now and is not rerun), and the group's run
    records the rerun beside the full run it completes."""
    record = json.loads(RESULTS.read_text())
    for name, status in outcome.items():
        record["mutants"][name] = status
        if status in KILLED:
            record["not_killed"].pop(name, None)
        else:
            record["not_killed"][name] = diffs.get(name, record["not_killed"].get(name, ""))
    for group in GROUPS:
        if group.name in seconds:
            rerun = [n for n in outcome if module_of(n) in group.modules]
            record["groups"][group.name].setdefault("survivors_reruns", []).append({
                "date": datetime.date.today().isoformat(), "commit": copied_at,
                "seconds": round(seconds[group.name]), "mutants": len(rerun),
                "modules": sorted({module_of(n) for n in rerun})})
    all_modules = [m for g in GROUPS for m in g.modules]
    record["scores"] = scores_of(record["mutants"], listed, all_modules)
    RESULTS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)} (survivors rerun)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    all_modules = [m for g in GROUPS for m in g.modules]
    parser.add_argument("--module", action="append", choices=all_modules,
                        help="the groups holding these modules (default: every group)")
    parser.add_argument("--mutant", action="append", help="only these mutants (names or globs); not saved")
    parser.add_argument("--sample", type=int, help="this many mutants of the committed results, fixed seed (CI)")
    parser.add_argument("--seed", type=int, default=17, help="the sample's seed (default 17)")
    parser.add_argument("--sample-groups", type=int, default=None, metavar="K",
                        help="draw the sample from K groups chosen by the seed (each group costs about 40 s of "
                             "set-up, whatever its share of the sample)")
    parser.add_argument("--survivors", action="store_true",
                        help="only the mutants each group's committed run left standing (of the --module ones "
                             "when named), with today's tests; with --save, merged into that run (refused when "
                             "the group's code changed since it)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--save", action="store_true",
                        help=f"merge the groups run into {RESULTS.name} and write their {STATS.name}/")
    parser.add_argument("--keep", type=Path, help="run in (and keep) this directory instead of a temporary one")
    parser.add_argument("--table", action="store_true",
                        help=f"print docs/testing.md's per-module table from {RESULTS.name} and {SURVIVORS.name}; run nothing")
    options = parser.parse_args()
    listed = read_survivors()
    contradicted = contradicted_gpu_claims(listed, gpu_kills())
    if contradicted:
        raise SystemExit(f"{SURVIVORS.name} contradicts {GPU_KILLS.name} (the GPU run) for {len(contradicted)} "
                         f"mutant(s): {', '.join(contradicted[:5])}")
    if options.table:
        print(table(listed))
        return 0
    groups = [g for g in GROUPS if not options.module or set(g.modules) & set(options.module)]
    if options.mutant:
        groups = [g for g in groups if any(fnmatch.fnmatchcase(p, m) or fnmatch.fnmatchcase(m, p) for m in options.mutant
                                           for patterns in g.modules.values() for p in patterns)]
    modules = [m for g in groups for m in g.modules]
    names_by_group = {g.name: None for g in groups}
    if options.sample:
        committed = json.loads(RESULTS.read_text())["mutants"]
        # only what the committed run killed: CI's question is whether one of those now survives
        population = sorted(n for n, status in committed.items() if module_of(n) in modules and status in KILLED)
        if options.sample_groups:
            present = sorted({group_of_module(module_of(n)).name for n in population})
            chosen = set(random.Random(options.seed).sample(present, min(options.sample_groups, len(present))))
            population = [n for n in population if group_of_module(module_of(n)).name in chosen]
            print(f"sample from {', '.join(sorted(chosen))} (seed {options.seed})", flush=True)
        selected = sorted(random.Random(options.seed).sample(population, min(options.sample, len(population))))
        names_by_group = {g.name: [n for n in selected if module_of(n) in g.modules] for g in groups}
    elif options.mutant:
        names_by_group = {g.name: options.mutant for g in groups}
    elif options.survivors:
        record = json.loads(RESULTS.read_text())
        for group in groups:
            run = record["groups"].get(group.name)
            if run is None:
                raise SystemExit(f"[{group.name}] has no committed run to complete: run it whole")
            why = why_not_the_same_mutants(group, run)
            if why:
                raise SystemExit(f"[{group.name}] {why}: its mutants may not be the same ones, run the group whole")
        wanted = set(options.module or modules)  # the named modules' survivors, not their whole groups'
        names_by_group = {g.name: sorted(n for n, status in record["mutants"].items()
                                         if module_of(n) in g.modules and module_of(n) in wanted
                                         and status not in KILLED) for g in groups}
    names_by_group = {k: v for k, v in names_by_group.items() if v is None or v}
    partial = bool(options.sample or options.mutant or options.survivors)
    copied_at = commit()  # the tree each group copies is this one, whatever is committed while it runs
    started = time.perf_counter()
    scratch = options.keep or Path(tempfile.mkdtemp(prefix="fp4-mutmut-"))
    scratch.mkdir(parents=True, exist_ok=True)
    outcome, diffs, seconds, problems = {}, {}, {}, []
    try:
        for group in groups:
            if group.name not in names_by_group:
                continue
            names = names_by_group[group.name]
            stats_from = STATS / f"{group.slug}.json" if options.sample else None
            print(f"[{group.name}] {len(names) if names else 'every'} mutant(s) of {', '.join(group.modules)}",
                  flush=True)
            got, got_diffs, took, tail = run_group(group, names, scratch, options.max_children, stats_from)
            print(f"[{group.name}] {len(got)} results in {took:.0f} s", flush=True)
            if not got:
                print(tail)
                problems.append(f"{group.name}: mutmut produced no results")
                continue
            if options.sample:
                missing = sorted(set(names) - set(got))
                if missing:
                    problems.append(f"{group.name}: {len(missing)} sampled mutant(s) no longer exist "
                                    f"({', '.join(missing[:5])}...): the committed full run is stale, run it again")
            seconds[group.name] = took
            outcome.update(got)
            diffs.update(got_diffs)
            if options.save and not partial and (scratch / f"{group.slug}.stats.json").exists():
                STATS.mkdir(exist_ok=True)
                stats = json.loads((scratch / f"{group.slug}.stats.json").read_text())
                (STATS / f"{group.slug}.json").write_text(json.dumps(stats, indent=0, sort_keys=True) + "\n")
    finally:
        if not options.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    committed = json.loads(RESULTS.read_text())["mutants"] if options.sample else {}
    for name, status in sorted(outcome.items()):
        if options.sample and name not in listed:
            # CI's question: has a mutant the committed run killed started to survive? A committed survivor
            # that still survives is the full run's triage, not a regression.
            if committed.get(name) in KILLED and status not in KILLED:
                problems.append(f"{name}: killed in {RESULTS.name} but now {status} (a test stopped protecting "
                                f"this)\n{diffs.get(name, '')}")
            continue
        if status in KILLED:
            if name in listed:
                problems.append(f"{name}: listed in {SURVIVORS.name} but now {status}; take it off the list")
        elif name not in listed:
            problems.append(f"{name}: {status}, not listed in {SURVIVORS.name} (kill it with a test, or list it "
                            f"with its kind and reason)\n{diffs.get(name, '')}")
    if not partial:
        for name in listed:
            if module_of(name) in modules and name not in outcome and group_of_module(module_of(name)).name in seconds:
                problems.append(f"{name}: listed in {SURVIVORS.name} but no such mutant exists any more")
    print_scores(scores_of(outcome, listed, modules))
    print(f"({time.perf_counter() - started:.0f} s)")
    for problem in problems:
        print("PROBLEM", problem)
    if options.save and options.survivors and seconds:
        merge_survivors(outcome, diffs, seconds, listed, copied_at)
    elif options.save and not partial and seconds:  # only groups that produced results are merged
        save(outcome, diffs, seconds, groups, listed, options.max_children, copied_at)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
