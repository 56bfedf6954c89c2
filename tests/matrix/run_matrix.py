"""Run the CPU test suite against every FlashInfer release an SGLang 0.5.x release pins; write the table.

One environment holds the union of their dependencies (the newest release's); each leg swaps in one
FlashInfer with ``pip install --no-deps`` and runs the version-sensitive test files once, and the
environment's original FlashInfer is put back at the end. Besides the supported releases, one real
release below the range is installed to prove it is refused cleanly.

    python tests/matrix/run_matrix.py --output docs/compatibility.md           # regenerate
    python tests/matrix/run_matrix.py --output docs/compatibility.md --check   # CI: fail if stale

Exit status 1 when any check of a supported release fails, when the unsupported release is not
refused cleanly, or (with --check) when the committed table differs from this run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: FlashInfer releases pinned by SGLang 0.5.x releases that import on CPU (issue 5), oldest first.
VERSIONS = ["0.5.3", "0.6.1", "0.6.3", "0.6.7.post2", "0.6.8.post1", "0.6.11.post1", "0.6.12", "0.6.15.post1",
            "0.6.18", "0.7.1", "0.7.2", "0.7.4"]
#: A real release outside the supported range: it must be refused with one clear warning.
UNSUPPORTED = ["0.5.2"]
#: Table column -> test file run for it.
CHECKS = {
    "apply / revert / status": "tests/test_lifecycle.py",
    "fullgraph trace, compiled = eager": "tests/test_compile.py",
    "op: opcheck, fake = real": "tests/test_op.py",
    "reference values": "tests/test_reference.py",
    "kernel-call parity": "tests/test_parity.py",
    "bad input": "tests/test_battery.py",
    "FP4 family": "tests/test_family.py",
    "kernel modes and edges": "tests/test_kernel_modes.py",
    "FlashInfer's own op": "tests/test_flashinfer_op.py",
    "FlashInfer's declared ops": "tests/test_declared.py",
}

REFUSAL_PROBE = """
import json, logging, io
stream = io.StringIO(); logging.basicConfig(stream=stream, level=logging.WARNING)
import fp4_dynamo_shim, flashinfer
status = fp4_dynamo_shim.status()
untouched = not getattr(flashinfer.fp4_quantize, "__fp4_dynamo_shim__", False)
print(json.dumps({"applied": status["applied"], "problem": status["problem"], "untouched": untouched,
                  "warnings": [l for l in stream.getvalue().splitlines() if "not supported" in l]}))
"""


def pip_install(version: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    f"flashinfer-python=={version}"], check=True)
    # Two metadata directories mean an earlier install or uninstall was interrupted: the package directory
    # then mixes releases and every leg's result is noise (seen here as parity failures that moved
    # between legs from run to run). Say so instead of writing such a table.
    site = Path(importlib.util.find_spec("flashinfer").submodule_search_locations[0]).parent
    records = sorted(path.name for path in site.glob("flashinfer_python-*.dist-info"))
    if records != [f"flashinfer_python-{version}.dist-info"]:
        raise SystemExit(f"{site} holds {records} after installing flashinfer-python {version}: the environment "
                         "mixes releases; remove its flashinfer/ and every flashinfer_python-*.dist-info, reinstall")


STAND_IN = ROOT / "tests" / "matrix" / "gpu_query_stand_in"


def with_stand_in() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(STAND_IN), os.environ.get("PYTHONPATH")) if p)}


def import_error(env=None) -> str | None:
    """Why ``import flashinfer`` fails in this environment, or None (some releases need a GPU to import)."""
    completed = subprocess.run([sys.executable, "-c", "import flashinfer"], cwd=ROOT, capture_output=True, text=True,
                               env=env)
    if completed.returncode == 0:
        return None
    lines = [line for line in completed.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {completed.returncode}"


def run_leg(version: str) -> dict:
    env, stand_in = None, None
    failure = import_error()
    if failure is not None:
        shim = subprocess.run([sys.executable, "-c", "import fp4_dynamo_shim; print(fp4_dynamo_shim.status()['problem'])"],
                              cwd=ROOT, capture_output=True, text=True)
        stand_in = {"import_error": failure, "shim_problem": shim.stdout.strip().splitlines()[-1] if shim.stdout else None}
        if import_error(with_stand_in()) is not None:
            return {**stand_in, "seconds": 0.0, "failures": []}
        env = with_stand_in()  # the release imports once its one GPU query is answered: run the suite
    files = [path for path in CHECKS.values() if (ROOT / path).exists()]
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        started = time.perf_counter()
        # Each release compiles into its own inductor cache: torch's cache key does not include a custom op's
        # schema, so a graph of torch.ops.flashinfer.fp4_quantize compiled under 0.7.4 (8 parameters) was
        # loaded under 0.6.12 (7) and called the op with 8 arguments.
        completed = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *files],
            cwd=ROOT, capture_output=True, text=True,
            env={**(env or os.environ), "TORCHINDUCTOR_CACHE_DIR": str(Path(scratch) / "inductor")},
        )
        seconds = time.perf_counter() - started
        if not report.exists():
            return {"error": (completed.stdout + completed.stderr)[-2000:], "seconds": seconds}
        counts = {path: {"passed": 0, "failed": 0, "skipped": 0} for path in files}
        failures, outcomes, skip_reasons = [], {}, {}
        for case in ElementTree.parse(report).iter("testcase"):
            parts = case.get("classname", "").split(".")
            path = next((p for p in files if Path(p).stem in parts), case.get("classname", "?"))
            outcome = "passed"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "failed"
                failures.append(f"{case.get('classname')}::{case.get('name')}")
            elif case.find("skipped") is not None:
                outcome = "skipped"
                skip_reasons[case.get("name", "")] = case.find("skipped").get("message", "")
            counts.setdefault(path, {"passed": 0, "failed": 0, "skipped": 0})[outcome] += 1
            outcomes[case.get("name", "")] = outcome
    return {"counts": counts, "failures": failures, "seconds": seconds, "stand_in": stand_in, "outcomes": outcomes,
            "skip_reasons": skip_reasons,
            "tail": completed.stdout[-3000:] if failures else ""}


def probe_refusal(version: str) -> dict:
    completed = subprocess.run([sys.executable, "-c", REFUSAL_PROBE], cwd=ROOT, capture_output=True, text=True)
    if completed.returncode != 0:
        return {"ok": False, "detail": completed.stderr[-1500:]}
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["refused_cleanly"] = (not result["applied"] and result["untouched"] and len(result["warnings"]) == 1
                                 and "not supported" in (result["problem"] or ""))
    strict = subprocess.run([sys.executable, "-c", "import fp4_dynamo_shim"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "FP4_DYNAMO_SHIM_STRICT": "1"})
    result["strict_raises"] = strict.returncode != 0 and "ApplyError" in strict.stderr
    result["ok"] = result["refused_cleanly"] and result["strict_raises"]
    return result


def cell(counts: dict | None) -> str:
    if not counts:
        return "-"
    if counts["failed"]:
        return f"FAIL {counts['failed']}/{sum(counts.values())}"
    skipped = f", {counts['skipped']} skipped" if counts["skipped"] else ""
    return f"pass {counts['passed']}{skipped}"


FAMILY_TEST = "test_traces_with_no_graph_breaks_runs_and_matches_eager[{}]"
DECLARED_TABLE = ROOT / "tests" / "declared_releases.json"
DECLARED_TEST = "test_the_release_table_row_matches_what_the_shim_does_with_this_release"
DECLARED_KINDS = ("registered", "covered by the FP4 layer", "out of scope", "not expressible", "FlashInfer's own op",
                  "failed")


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
             "`fp4_dynamo_shim_flashinfer` op, on fake CUDA tensors (`tests/test_declared.py`; the kernels run in",
             "`tests/gpu/test_gpu_declared.py`); `-`: the release lacks the function; `gpu`: the path asks",
             "`torch.cuda.is_current_stream_capturing()`, which only a CUDA torch answers.", ""]
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
    """FlashInfer's declared ops per release: counts from tests/declared_releases.json, shown for a release
    whose leg confirmed that its row is what the shim does (tests/test_declared.py)."""
    table = json.loads(DECLARED_TABLE.read_text())["releases"] if DECLARED_TABLE.exists() else {}
    lines = ["## FlashInfer's declared ops: release x kind (`FP4_DYNAMO_SHIM_FLASHINFER_OPS=all`)", "",
             "Every `@register_custom_op` FlashInfer wrote, by what the shim does with it (the reasons, op by op, are in",
             "`tests/declared_releases.json`); a row shows once the release's leg confirmed the table against the live",
             "shim. The default gate registers only what SGLang's traced paths call raw (see how-it-works.md).", "",
             "| FlashInfer | declared | " + " | ".join(DECLARED_KINDS) + " |",
             "|---|---|" + "---|" * len(DECLARED_KINDS)]
    for version, leg in legs.items():
        outcome = leg.get("outcomes", {}).get(DECLARED_TEST)
        if outcome is None:
            continue
        counts = table.get(version, {}).get("counts")
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
             "eager, both with the eager and the inductor backend (`tests/test_family.py`); `absent`: the release does",
             "not have the function.", "",
             "| FlashInfer | " + " | ".join(f"`{f}`" for f in functions) + " |",
             "|---|" + "---|" * len(functions)]
    for version, leg in legs.items():
        if "outcomes" not in leg:
            continue
        row = [words.get(leg["outcomes"].get(FAMILY_TEST.format(f)), "-") for f in functions]
        lines.append(f"| {version} | " + " | ".join(row) + " |")
    return lines + [""]


#: Model family x SGLang release with the torch.compile prefill graph and the shim: (family, {column: cell}).
#: "**measured**" cells come from tests/gpu/test_gpu_engine.py on the H200 (each release's FlashInfer NVFP4
#: path forced, see engine/sm120_path/sitecustomize.py); "CPU" cells from the named CPU test; "read" cells from
#: reading SGLang's code, not run; "to be measured" cells are written in the GPU test and have not run yet.
SGLANG_COLUMNS = ["0.5.9", "0.5.10", "0.5.11", "0.5.12-0.5.13", "0.5.14", "0.5.15-0.5.18", "0.5.19-0.5.21",
                  "0.5.22-0.5.23"]
_WRAPPED = "read: not needed (SGLang's own ops); harmless: CPU, `tests/test_sglang_wrapper.py`"
_BREAKABLE = "read: not needed by default (breakable prefill graphs, no torch.compile); with tc_piecewise as 0.5.14"
_NO_COMPILE = "read: not needed (no torch.compile prefill graph)"
MODEL_FAMILIES = [
    ("Llama (`LlamaForCausalLM`)", {
        "0.5.9": "read: works (PCG opt-in); `fp4_quantize` is the only untraceable call",
        "0.5.10": "read: works (PCG on by default)",
        "0.5.11": "**measured**: serves with PCG; greedy ids equal PCG off; without the shim PCG capture fails",
        "0.5.12-0.5.13": _WRAPPED, "0.5.14": _WRAPPED, "0.5.15-0.5.18": _BREAKABLE, "0.5.19-0.5.21": _BREAKABLE,
        "0.5.22-0.5.23": _NO_COMPILE}),
    ("Qwen3 (`Qwen3ForCausalLM`)", {
        "0.5.9": "read: works (PCG opt-in)", "0.5.10": "read: works (PCG on by default)",
        "0.5.11": "**measured**: as Llama", "0.5.12-0.5.13": _WRAPPED,
        "0.5.14": "to be measured (0.5.14 engine matrix: shim off must serve with tc_piecewise; every route and PCG off "
                  "the same greedy ids); read: not needed",
        "0.5.15-0.5.18": _BREAKABLE, "0.5.19-0.5.21": _BREAKABLE, "0.5.22-0.5.23": _NO_COMPILE}),
    ("Qwen3-MoE (`Qwen3MoeForCausalLM`)", {
        "0.5.9": "read: works (PCG opt-in); the FP4 MoE runs inside an SGLang custom op",
        "0.5.10": "read: works (PCG on by default)",
        "0.5.11": "**measured**: as Llama (SGLang's SM12x FP4 MoE kernel replaced by a reference in the test)",
        "0.5.12-0.5.13": _WRAPPED, "0.5.14": "to be measured (0.5.14 engine matrix, as Qwen3)",
        "0.5.15-0.5.18": _BREAKABLE, "0.5.19-0.5.21": _BREAKABLE, "0.5.22-0.5.23": _NO_COMPILE}),
    ("DeepSeek-V3 (`DeepseekV3ForCausalLM`: MLA, grouped top-k, fused shared expert)", {
        "0.5.9": "not established", "0.5.10": "not established",
        "0.5.11": "to be measured (0.5.11 engine matrix: PCG on = off, shim off fails in capture); read: the dense "
                  "NVFP4 layers bind FlashInfer's `fp4_quantize` on SM12x as Llama's do"}),
    ("GLM-4.5 MoE (`Glm4MoeForCausalLM`)", {
        "0.5.9": "not established", "0.5.10": "not established",
        "0.5.11": "to be measured (0.5.11 engine matrix, as DeepSeek-V3)"}),
    ("Qwen3.5 NVFP4 (dense MLP)", {
        "0.5.19-0.5.21": "CPU, `tests/test_sglang_qwen3_5.py` (SGLang's own MLP code, fake CUDA tensors): needed with "
                         "tc_piecewise: the fused path calls `silu_and_mul_scaled_nvfp4_experts_quantize` raw; fails "
                         "under fullgraph without the shim, traces with it",
        "0.5.22-0.5.23": "read: the raw call remains; no torch.compile prefill graph to trace it"}),
    ("FP8 per-tensor checkpoints (RMSNorm + FP8 quant)", {
        "0.5.15-0.5.18": "read: 0.5.18 calls `flashinfer.norm.rmsnorm_quant` raw; with tc_piecewise NOT covered by "
                         "the shim (not an FP4 function)",
        "0.5.19-0.5.21": "read: as 0.5.18: NOT covered by the shim", "0.5.22-0.5.23": _NO_COMPILE}),
    ("GLM-5 / DeepSeek-V3.2 (NSA)", {
        "0.5.9": "read: fails after the shim, in SGLang's NSA indexer (`Tensor.item()` on `seq_lens_cpu`, a raw "
                 "`flashinfer.norm.layernorm`, the JIT hadamard, deep_gemm, a split op without `topk_indices`)",
        "0.5.10": "read: SGLang switches PCG off for these architectures", "0.5.11": "read: as 0.5.10"}),
]


def render_model_families() -> list:
    lines = ["## Model families x SGLang, with its torch.compile prefill graph and the shim", "",
             "Cells marked **measured** were run on the H200 with SGLang's own engine "
             "(`tests/gpu/test_gpu_engine.py`, tiny ModelOpt NVFP4 checkpoints, the release's FlashInfer NVFP4 path "
             "forced); \"CPU\" cells come from the named CPU test; \"read\" cells from reading SGLang's code, not "
             "run; \"to be measured\" cells are written in the GPU test and have not run yet; \"-\": the family is "
             "not in that release or not looked at. Users of the NSA models: keep piecewise CUDA graphs off "
             "(`--disable-piecewise-cuda-graph` on 0.5.9, where it is opt-in anyway; 0.5.10/0.5.11 turn them off by "
             "themselves); the shim is harmless there but does not make those forwards traceable.", "",
             "| model family | " + " | ".join(f"SGLang {r}" for r in SGLANG_COLUMNS) + " |",
             "|---|" + "---|" * len(SGLANG_COLUMNS)]
    for family, cells in MODEL_FAMILIES:
        lines.append(f"| {family} | " + " | ".join(cells.get(r, "-") for r in SGLANG_COLUMNS) + " |")
    return lines + [""]


_BINDINGS = {"call-time": "imported at call time", "module-global": "module global (SM12x)",
             "sglang-op": "SGLang's own ops"}
_GRAPHS = {"none": "none", "opt-in": "off (PCG opt-in)", "piecewise": "piecewise (PCG)", "tc_piecewise": "tc_piecewise",
           "breakable": "breakable (no torch.compile)"}


def render_sglang_releases() -> list:
    """One row per SGLang release, from ``fp4_dynamo_shim.sglang_releases`` (held against every wheel by
    ``tests/test_sglang_releases.py``)."""
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "tests"))
    import sglang_facts
    from fp4_dynamo_shim import sglang_releases

    lines = ["## SGLang releases", "",
             "What each release needs from the shim, from `src/fp4_dynamo_shim/sglang_releases.py` (the table "
             "`status()[\"sglang\"]` and `verify` read; `tests/test_sglang_releases.py` holds it against facts read "
             "off every wheel, `tests/sglang_facts.json`; `python tests/sglang_facts.py --check` re-reads the wheels). "
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


def render(legs: dict, refusals: dict) -> str:
    columns = list(CHECKS)
    lines = [
        "# Compatibility",
        "",
        "Generated by `python tests/matrix/run_matrix.py --output docs/compatibility.md` from one CPU run of",
        "the test files below against each FlashInfer release (CI runs it with `--check` on every push and",
        "fails when this file is stale). Cells: tests passed (and skipped, where a release lacks what a test",
        "needs). GPU results are in [performance.md](performance.md) and the issue notes.",
        "",
        "| FlashInfer | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    not_importable = {}
    for version, leg in legs.items():
        if "import_error" in leg:
            not_importable[version] = leg
            lines.append(f"| {version} | " + " | ".join(["does not import on CPU (below)"] + [""] * (len(columns) - 1)) + " |")
            continue
        if "error" in leg:
            lines.append(f"| {version} | " + " | ".join(["ERROR"] * len(columns)) + " |")
            continue
        row = [cell(leg["counts"].get(CHECKS[c])) for c in columns]
        if leg.get("stand_in"):
            not_importable[version] = leg["stand_in"]
            version = f"{version} *"
        lines.append(f"| {version} | " + " | ".join(row) + " |")
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
                  "why (below). Their rows above ran with `tests/matrix/gpu_query_stand_in` answering that one query;",
                  "they also import nvidia-cutlass-dsl (about 0.5 GB), which cannot travel to the GPU machine, so they",
                  "were not run on a GPU.", "",
                  "| FlashInfer | `import flashinfer` on CPU | what the shim reports |", "|---|---|---|"]
        for version, leg in not_importable.items():
            lines.append(f"| {version} | `{leg['import_error']}` | {leg['shim_problem']} |")
        lines.append("")
    lines += ["## Outside the supported range", "",
              "| FlashInfer | refused with one warning, nothing patched | FP4_DYNAMO_SHIM_STRICT=1 raises |",
              "|---|---|---|"]
    for version, result in refusals.items():
        lines.append(f"| {version} | {'yes' if result.get('refused_cleanly') else 'NO'} "
                     f"| {'yes' if result.get('strict_raises') else 'NO'} |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "compatibility.md")
    parser.add_argument("--check", action="store_true", help="fail if the committed --output differs")
    parser.add_argument("--versions", nargs="+", default=VERSIONS)
    options = parser.parse_args()
    original = importlib.metadata.version("flashinfer-python")
    legs, refusals, failed = {}, {}, False
    try:
        for version in options.versions:
            pip_install(version)
            leg = run_leg(version)
            legs[version] = leg
            bad = "error" in leg or leg["failures"]  # a release that needs a GPU to import is not a failure here
            failed |= bool(bad)
            print(f"flashinfer {version}: {'FAILED' if bad else 'ok'} in {leg['seconds']:.0f} s", flush=True)
            if bad:
                print(leg.get("error") or "\n".join(leg["failures"]) + "\n" + leg["tail"], flush=True)
        for version in UNSUPPORTED:
            pip_install(version)
            refusals[version] = probe_refusal(version)
            failed |= not refusals[version]["ok"]
            print(f"flashinfer {version} (unsupported): {'refused cleanly' if refusals[version]['ok'] else refusals[version]}",
                  flush=True)
    finally:
        pip_install(original)
    text = render(legs, refusals)
    if options.check:
        committed = options.output.read_text() if options.output.exists() else ""
        if committed != text:
            print(f"{options.output} is stale; regenerate it with: python tests/matrix/run_matrix.py", flush=True)
            print(text)
            failed = True
    else:
        options.output.write_text(text)
        print(f"wrote {options.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
