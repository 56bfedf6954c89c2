"""docs/compatibility.md from the matrix's legs: the tables, the prose around them, and what each cell means.

``run_matrix.py`` runs the legs, reads each one's JUnit report with :func:`read_leg` and hands them to :func:`render`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import junit_reports  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

#: Table column -> test file run for it: the files whose outcome depends on the installed release.
CHECKS = {
    "apply / revert / status": "tests/lifecycle/test_apply_revert_status.py",
    "fullgraph trace, compiled = eager": "tests/fp4/test_compile.py",
    "reference values": "tests/fp4/test_cpu_reference_matches_hand_computed_bytes.py",
    "kernel-call parity": "tests/fp4/test_parity.py",
    "bad input": "tests/fp4/test_battery.py",
    "FP4 family": "tests/fp4/test_fp4_family_traces_and_matches_eager.py",
    "kernel modes and edges": "tests/fp4/test_kernel_modes.py",
    "FlashInfer's own op": "tests/fp4/test_flashinfers_own_fp4_op_repaired.py",
    "FlashInfer's declared ops": "tests/declared/test_declared_ops_trace_on_cpu.py",
    "declared-op gates and GPU records": "tests/declared/test_declared_gate_values_and_gpu_records.py",
    "attention run parameters": "tests/declared/test_attention_parameters_read_from_sources.py",
    "attention wrappers compiled": "tests/declared/test_attention_wrappers.py",
    "MLA wrapper compiled": "tests/declared/test_mla_wrapper.py",
}


def check_files() -> list:
    return [path for path in CHECKS.values() if (ROOT / path).exists()]


def read_leg(reports) -> dict:
    """Counts per CHECKS file, failures, outcomes and skip reasons of JUnit reports, less the tests that
    ``tests/conftest.py`` marks ``release_independent`` in them (a whole-suite report has them; a leg's run has not)."""
    modules = {path: path.removesuffix(".py").replace("/", ".") for path in check_files()}
    counts = {path: {"passed": 0, "failed": 0, "skipped": 0} for path in modules}
    failures, outcomes, skip_reasons = [], {}, {}
    for case in junit_reports.cases(reports):
        path = next((p for p, m in modules.items() if case.classname == m or case.classname.startswith(m + ".")), None)
        if path is None or "release_independent" in case.properties:
            continue
        if case.outcome == "failed":
            failures.append(f"{case.classname}::{case.name}")
        elif case.outcome == "skipped":
            skip_reasons[case.name] = case.message
        counts[path][case.outcome] += 1
        outcomes[case.name] = case.outcome
    return {"counts": counts, "failures": failures, "outcomes": outcomes, "skip_reasons": skip_reasons}


def release_of(name: str) -> str:
    """The FlashInfer release of a leg's name."""
    return name.split(", torch ")[0]


def cell(counts: dict | None) -> str:
    if not counts:
        return "-"
    if counts["failed"]:
        return f"FAIL {counts['failed']}/{sum(counts.values())}"
    skipped = f", {counts['skipped']} skipped" if counts["skipped"] else ""
    return f"pass {counts['passed']}{skipped}"


FAMILY_TEST = "test_traces_with_no_graph_breaks_runs_and_matches_eager[{}]"
DECLARED_TABLE = ROOT / "tests" / "data" / "declared_releases.json"
DECLARED_TEST = "test_the_release_table_row_matches_what_the_shim_does_with_this_release"
DECLARED_KINDS = ("registered", "covered by the FP4 layer", "covered by a wrapper's op", "out of scope", "not expressible",
                  "FlashInfer's own op", "failed")


DECLARED_TRACE_TEST = "test_public_function_traces_to_the_declared_op_with_no_graph_break[{}]"


def render_declared_functions(legs: dict) -> list:
    """Public function x release: traced under fullgraph with 0 graph breaks to a shim op (fake CUDA tensors)."""
    prefix, suffix = DECLARED_TRACE_TEST.split("{}")
    functions = []
    for leg in legs.values():
        for name in leg.get("outcomes", {}):
            if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix):-len(suffix)] not in functions:
                functions.append(name[len(prefix):-len(suffix)])
    words = {"passed": "pass", "failed": "FAIL"}
    lines = ["## FlashInfer's declared ops: public function x release", "",
             "`pass`: `torch.compile(fullgraph=True)` traced the call with 0 graph breaks to a",
             "`fp4_dynamo_shim_flashinfer` op, on fake CUDA tensors (`tests/declared/test_declared_ops_trace_on_cpu.py`; the kernels run in",
             "`tests/gpu/test_gpu_declared.py`); `-`: the release lacks the function; `gpu`: the path asks",
             "`torch.cuda.is_current_stream_capturing()`, which only a GPU answers.", ""]
    releases = [v for v, leg in legs.items() if "outcomes" in leg]
    lines += ["| function | " + " | ".join(releases) + " |", "|---|" + "---|" * len(releases)]
    for function in functions:
        cells = []
        for version in releases:
            leg = legs[version]
            outcome = leg["outcomes"].get(DECLARED_TRACE_TEST.format(function))
            skipped_reason = leg.get("skip_reasons", {}).get(DECLARED_TRACE_TEST.format(function), "")
            cells.append(words.get(outcome) or ("gpu" if "current_stream_capturing" in skipped_reason else "-"))
        lines.append(f"| `{function}` | " + " | ".join(cells) + " |")
    return lines + [""]


def render_declared(legs: dict) -> list:
    """FlashInfer's declared ops per release: counts from tests/data/declared_releases.json, shown for a release
    whose leg confirmed that its row is what the shim does (tests/declared/test_declared_ops_trace_on_cpu.py)."""
    table = json.loads(DECLARED_TABLE.read_text())["releases"] if DECLARED_TABLE.exists() else {}
    lines = ["## FlashInfer's declared ops: release x kind (`FP4_DYNAMO_SHIM_FLASHINFER_OPS=all`)", "",
             "Every `@register_custom_op` FlashInfer wrote, by what the shim does with it (the reasons, op by op, are in",
             "`tests/data/declared_releases.json`); a row shows once the release's leg confirmed the table against the live",
             "shim. The default gate registers what SGLang's traced paths call raw and, on a release the GPU record",
             "holds, what was proven there (see how-it-works.md).", "",
             "| FlashInfer | declared | " + " | ".join(DECLARED_KINDS) + " |",
             "|---|---|" + "---|" * len(DECLARED_KINDS)]
    for version, leg in legs.items():
        outcome = leg.get("outcomes", {}).get(DECLARED_TEST)
        if outcome is None:
            continue
        counts = table.get(release_of(version), {}).get("counts")
        if outcome != "passed" or counts is None:
            lines.append(f"| {version} | {'FAIL' if outcome == 'failed' else outcome} |" + " |" * len(DECLARED_KINDS))
            continue
        lines.append(f"| {version} | {counts['declared']} | " + " | ".join(str(counts[k]) for k in DECLARED_KINDS) + " |")
    return lines + [""]


def render_family(legs: dict) -> list:
    """Function x release: did the function trace under fullgraph with 0 breaks, run and match eager?"""
    prefix, suffix = FAMILY_TEST.split("{}")
    functions = sorted({name[len(prefix):-len(suffix)] for leg in legs.values() for name in leg.get("outcomes", {})
                        if name.startswith(prefix) and name.endswith(suffix)})
    words = {"passed": "pass", "skipped": "absent", "failed": "FAIL"}
    lines = ["## FP4 family: function x release", "",
             "`pass`: traced by `torch.compile(fullgraph=True)` with 0 graph breaks, ran on CPU (reference) and matched",
             "eager, both with the eager and the inductor backend (`tests/fp4/test_fp4_family_traces_and_matches_eager.py`); `absent`: the release does",
             "not have the function.", "",
             "| FlashInfer | " + " | ".join(f"`{f}`" for f in functions) + " |",
             "|---|" + "---|" * len(functions)]
    for version, leg in legs.items():
        if "outcomes" not in leg:
            continue
        row = [words.get(leg["outcomes"].get(FAMILY_TEST.format(f)), "-") for f in functions]
        lines.append(f"| {version} | " + " | ".join(row) + " |")
    return lines + [""]


#: Model family x SGLang release, with the torch.compile prefill graph and the shim: data, with what each cell says.
MODEL_FAMILIES = ROOT / "tools" / "matrix" / "model_families.toml"


def render_model_families() -> list:
    import tomllib

    table = tomllib.loads(MODEL_FAMILIES.read_text())
    columns, shared = table["columns"], table["shared"]
    lines = ["## Model families x SGLang, with its torch.compile prefill graph and the shim", "",
             "Cells marked **measured** were run on the H200 with SGLang's own engine "
             "(`tests/gpu/test_gpu_engine.py`, tiny ModelOpt NVFP4 checkpoints, the release's FlashInfer NVFP4 path "
             "forced); \"CPU\" cells come from the named CPU test; \"read\" cells from reading SGLang's code, not "
             "run; \"to be measured\" cells are written in the GPU test and have not run yet; \"-\": the family is "
             "not in that release or not looked at. Users of the NSA models: keep piecewise CUDA graphs off "
             "(`--disable-piecewise-cuda-graph` on 0.5.9, where it is opt-in anyway; 0.5.10/0.5.11 turn them off by "
             "themselves); the shim is harmless there but does not make those forwards traceable.", "",
             "| model family | " + " | ".join(f"SGLang {r}" for r in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for family in table["family"]:
        cells = [family["cells"].get(column, "-") for column in columns]
        lines.append(f"| {family['name']} | " + " | ".join(shared.get(cell, cell) for cell in cells) + " |")
    return lines + [""]


_BINDINGS = {"call-time": "imported at call time", "module-global": "module global (SM12x)",
             "sglang-op": "SGLang's own ops"}
_GRAPHS = {"none": "none", "opt-in": "off (PCG opt-in)", "piecewise": "piecewise (PCG)", "tc_piecewise": "tc_piecewise",
           "breakable": "breakable (no torch.compile)"}


def render_sglang_releases() -> list:
    """One row per SGLang release, from ``_fp4_dynamo_shim.sglang.sglang_releases`` (held against every wheel by
    ``tests/sglang/test_sglang_release_table_matches_wheels.py``)."""
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    import sglang_facts
    from _fp4_dynamo_shim.sglang import sglang_releases

    lines = ["## SGLang releases", "",
             "What each release needs from the shim, from `src/_fp4_dynamo_shim/sglang/sglang_releases.py` (the table "
             "`status()[\"sglang\"]` and `verify` read; `tests/sglang/test_sglang_release_table_matches_wheels.py` holds it against facts read "
             "off every wheel, `tests/data/sglang_facts.json`; `python tests/support/sglang_facts.py --check` re-reads the wheels). "
             "\"default path\": the prefill graph a CUDA run gets without options. Releases newer than the last row "
             "are unknown to the shim: `verify` fails there.", "",
             "| SGLang | prefill graph by default | tc_piecewise | FP4 calls reach FlashInfer | plugins | "
             "shim on the default path | needed when opted in | not covered | pins: torch, flashinfer, sglang-kernel |",
             "|---|---|---|---|---|---|---|---|---|"]
    for version in sglang_facts.RELEASES:
        row = sglang_releases.release_for(version)
        pins = sglang_releases.PINS.get(version)
        covered = ", ".join(f"`{c.function}` ({c.where})" for c in row.raw_calls if c.covered)
        uncovered = ", ".join(f"`{c.function}` ({c.where})" for c in row.raw_calls if not c.covered)
        if row.prefill_graph == "none":
            default = "not needed (no torch.compile graph)"
        elif sglang_releases.needed_by_default(row):
            default = f"**needed**: {covered}"
        else:
            default = "not needed; harmless"
        opt_in = "" if sglang_releases.needed_by_default(row) or row.prefill_graph == "none" else covered
        lines.append(" | ".join([
            f"| {version}", _GRAPHS[row.prefill_graph], row.tc_piecewise or "-", _BINDINGS[row.fp4_quantize_binding]
            + (", `mm_fp4` in `sglang::fp4_gemm`" if row.mm_fp4_in_sglang_op and row.fp4_quantize_binding != "sglang-op"
               else ""), "yes" if row.loads_plugins else "no", default, opt_in or "-", uncovered or "-",
            f"{pins.torch}, {pins.flashinfer}, {pins.sglang_kernel}" if pins else "-"]) + " |")
    return lines + [""]


def brief(difference: str) -> str:
    """A difference's first clause, and how many more there are (the tool prints them all)."""
    clauses = difference.split("; ")
    return clauses[0] + (f"; {len(clauses) - 1} more" if len(clauses) > 1 else "")


def render_newer(legs: dict) -> list:
    """What the shim does on a release newer than the tested range, and the tool's judgement of each leg's
    release as if it were one (``tools/release_parts.py``)."""
    lines = ["## Newer than tested", "",
             "`pyproject.toml` requires flashinfer-python >= the first tested release and names no upper bound: installing",
             "the shim never changes FlashInfer. A release above the tested range is applied part by part: the shim",
             "reads the installed sources (nothing is imported for it) and compares each part it patches with the newest",
             "tested release's (`src/_fp4_dynamo_shim/tested_sources.py`): a part that matches is patched as that",
             "release's row says; one that differs, or runs through one that does, stays FlashInfer's, with one warning",
             "naming it and the difference. `status()[\"flashinfer\"]` holds `tested`, `matched_row` and every part;",
             "`verify` prints one line and skips the checks of a part left as FlashInfer's; `FP4_DYNAMO_SHIM_STRICT=1`",
             "refuses an untested release (`ApplyError`). FlashInfer's declared ops are read from the installed sources",
             "as on every release; the `proven` gate has no GPU record for an untested release, so it turns on SGLang's",
             "raw calls only.", "",
             "`python tools/release_parts.py [WHEEL]` prints the same judgement for any release. Here, each release of",
             "the matrix judged as if it were newer than the tested range:", "",
             "| FlashInfer | parts matching the newest tested release | left as FlashInfer's |", "|---|---|---|"]
    for name, leg in legs.items():
        judged = leg.get("release_parts")
        if not judged or "error" in judged:
            lines.append(f"| {name} | ERROR | {(judged or {}).get('error', 'not run')[:200]} |")
            continue
        parts = judged["parts"]
        matching = sum(part["matches"] and not part["left_because"] for part in parts.values())
        left = [f"`{p}` ({brief(part['difference'] or part['left_because'])})" for p, part in parts.items()
                if not part["matches"] or part["left_because"]]
        lines.append(f"| {name} | {matching} of {len(parts)} ({judged['compared_with']}) | {'; '.join(left) or '-'} |")
    return lines + [""]


def render(legs: dict, refusals: dict) -> str:
    columns = list(CHECKS)
    lines = [
        "# Compatibility",
        "",
        "Generated by `python tools/matrix/run_matrix.py --output docs/compatibility.md` from one CPU run of",
        "the test files below against each FlashInfer release (CI runs it with `--check` on every push and",
        "fails when this file is stale), on the torch each row names: this environment's for every release but",
        "0.7.2, which runs in a virtual environment of its own with SGLang 0.5.23's pins (torch 2.14.1). Cells:",
        "tests passed (and skipped, where a release lacks what a test needs). These files are the tests whose outcome depends on the",
        "installed release (docs/testing.md says why the others run once). GPU results are in",
        "[performance.md](performance.md) and [testing.md](testing.md).",
        "",
        "| FlashInfer | torch | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    not_importable = {}
    for version, leg in legs.items():
        version, torch = release_of(version), leg.get("torch", "?")
        if "import_error" in leg:
            not_importable[version] = leg
            lines.append(f"| {version} | {torch} | " + " | ".join(["does not import on CPU (below)"] + [""] * (len(columns) - 1)) + " |")
            continue
        if "error" in leg:
            lines.append(f"| {version} | {torch} | " + " | ".join(["ERROR"] * len(columns)) + " |")
            continue
        row = [cell(leg["counts"].get(CHECKS[c])) for c in columns]
        if leg.get("stand_in"):
            not_importable[version] = leg["stand_in"]
            version = f"{version} *"
        lines.append(f"| {version} | {torch} | " + " | ".join(row) + " |")
    lines += ["", "Test files per column: " + "; ".join(f"{c}: `{p}`" for c, p in CHECKS.items()) + ".", ""]
    lines += render_family(legs)
    lines += render_sglang_releases()
    lines += render_declared(legs)
    lines += render_declared_functions(legs)
    lines += render_model_families()
    if not_importable:
        lines += ["## \\* Releases that need a GPU to import", "",
                  "These releases fail `import flashinfer` with a CPU-only torch: they call",
                  "`torch.cuda.get_device_properties(0)` at import time. On such a machine the shim stays off and says",
                  "why (below). Their rows above ran with `tools/matrix/gpu_query_stand_in` answering that one query;",
                  "they also import nvidia-cutlass-dsl (about 0.5 GB), which cannot travel to the GPU machine, so they",
                  "were not run on a GPU.", "",
                  "| FlashInfer | `import flashinfer` on CPU | what the shim reports |", "|---|---|---|"]
        for version, leg in not_importable.items():
            lines.append(f"| {version} | `{leg['import_error']}` | {leg['shim_problem']} |")
        lines.append("")
    lines += render_newer(legs)
    lines += ["## Outside the supported range", "",
              "| FlashInfer | refused with one warning, nothing patched | FP4_DYNAMO_SHIM_STRICT=1 raises |",
              "|---|---|---|"]
    for version, result in refusals.items():
        lines.append(f"| {version} | {'yes' if result.get('refused_cleanly') else 'NO'} "
                     f"| {'yes' if result.get('strict_raises') else 'NO'} |")
    lines.append("")
    return "\n".join(lines)


