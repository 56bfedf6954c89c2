"""Write the record of FlashInfer's declared ops proven on the GPU for one release
(``src/_fp4_dynamo_shim/declared/proven.py``), from that release's GPU run and a CPU trace.

    PYTHONPATH=<a folder holding flashinfer-python V> python tools/gpu/proven_record.py \
        --junit gpu_V.xml --commit 2f665b4 --date 2026-12-02 --gpu "NVIDIA H200" --torch 2.11.0+cu130

The GPU run (``bash tests/gpu/run.sh --junitxml=...``) says which public functions passed
``test_public_function_traces_compiles_bit_exact_captures_and_passes_opcheck``: traced with no break, compiled
equal to eager bit for bit, replayed from a CUDA graph and clean under ``torch.library.opcheck``. Their eager
cost is FlashInfer's own by construction (the layer rebinds nothing; ``tests/declared/test_declared_ops_trace_on_cpu.py``
holds it). The CPU trace of each function on fake CUDA tensors (the installed release, every op on) says
which declared ops it reaches. A declaration is proven when a passing function reaches its op and no failing one does.

The stateful attention wrappers' run() (``tests/gpu/test_gpu_attention.py``) names its public function and the op
it reached in JUnit properties instead; a function passes when all its tests do. ``--add`` adds such a file's run
to a release's record made by an earlier run (both commits and dates are kept):

    python tools/gpu/proven_record.py --add --junit gpu_attention_V.xml --commit 5c1e2a0 --date 2026-12-05 ...
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "src" / "_fp4_dynamo_shim" / "declared" / "proven.py"
TEST = "test_public_function_traces_compiles_bit_exact_captures_and_passes_opcheck"
#: The run's facts a record carries as fields (status() shows them; verify prints the first four).
MEASURED = ("date", "machine", "torch", "shim", "functions_passed", "functions_run")
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "support"), str(ROOT / "tools")]
import junit_reports  # noqa: E402


def gpu_outcomes(junit: Path) -> dict:
    """public function -> passed (True/False), from the GPU run's JUnit XML."""
    outcomes = {}
    for case in junit_reports.cases([junit]):
        match = re.fullmatch(rf"{TEST}\[(.+)\]", case.name)
        if match and case.outcome != "skipped":
            outcomes[match.group(1)] = case.outcome == "passed"
    return outcomes


def recorded_outcomes(junit: Path) -> tuple[dict, dict]:
    """(public function -> passed, public function -> {op}) from tests that name their function and the ops
    they reached as JUnit properties (a stateful wrapper's run() cannot be traced on fake tensors here: its
    plan() computes on the host). A function passes when every one of its tests does."""
    outcomes, ops = {}, {}
    for case in junit_reports.cases([junit]):
        if "function" not in case.properties or case.outcome == "skipped":
            continue
        name = case.properties["function"]
        outcomes[name] = outcomes.get(name, True) and case.outcome == "passed"
        ops.setdefault(name, set()).update(filter(None, (case.properties.get("declared_ops") or "").split(",")))
    return outcomes, ops


def reached_declarations() -> tuple:
    """(public function -> {declaration key: (module, op name)}, each traced on fake CUDA tensors with every
    declared op on; op name -> (declaration key, module), for the ops the installed release registers)."""
    os.environ["FP4_DYNAMO_SHIM_FLASHINFER_OPS"] = "all"
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fp4_dynamo_shim
    from _fp4_dynamo_shim.declared import declared_layer
    from _fp4_dynamo_shim.verify import checks
    import declared_examples

    import torch._dynamo  # noqa: F401  (the layer registers when Dynamo is imported)

    declared_layer.CAPABILITIES.setdefault(0, (9, 0))  # no GPU to ask: the H200's answer
    from _fp4_dynamo_shim.declared import built_modules, scan
    import flashinfer

    package = Path(flashinfer.__file__).parent  # what gate=all reads: the scan and the built modules' runs
    scanned = built_modules.extended(scan.scan(package), package, flashinfer.__version__, lambda key: True)
    modules = {d.key: d.module for d in scanned.declarations}
    registered = fp4_dynamo_shim.status()["flashinfer_ops"]["registered"]  # declaration key -> op
    key_of = {op.split("::")[1]: key for key, op in registered.items()}
    reached = {}
    for example in declared_examples.EXAMPLES:
        function = example.resolve()
        if function is None:
            continue
        with FakeTensorMode():
            args, kwargs = example.arguments("cuda")
        backend = checks._TraceOnly()
        torch._dynamo.reset()
        torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend=backend)(*args)
        ops = {str(node.target).split(".")[1] for graph in backend.graphs for node in graph.graph.nodes
               if node.op == "call_function" and declared_layer.NAMESPACE in str(node.target)}
        reached[example.name] = {key_of[op]: (modules[key_of[op]], op) for op in sorted(ops)}
    return reached, {op: (key, modules[key]) for op, key in key_of.items()}


def _added(earlier: dict, run: dict, failing: set) -> dict:
    """The release's record with a second run's functions added (a GPU test file run on its own, at another
    commit or on another machine, with the same torch): both runs' dates, machines and commits, their counts summed
    (a function both runs passed counts twice), a declaration this run's failing function reaches taken out."""
    if earlier["torch"] != run["torch"]:
        raise SystemExit(f"--add: the earlier run used torch {earlier['torch']}, this one {run['torch']}; measure both "
                         "with one torch, or record this run alone")
    joined = lambda field: ", ".join(dict.fromkeys(f"{earlier[field]}, {run[field]}".split(", ")))  # noqa: E731
    declarations = {key: dict(entry, functions=list(entry["functions"]))
                    for key, entry in earlier["declarations"].items() if key not in failing}
    for key, entry in run["declarations"].items():
        functions = declarations.setdefault(key, dict(entry, functions=[]))["functions"]
        functions.extend(name for name in entry["functions"] if name not in functions)
    return {**run, "date": joined("date"), "machine": joined("machine"), "shim": joined("shim"),
            "declarations": declarations,
            "functions_passed": earlier["functions_passed"] + run["functions_passed"],
            "functions_run": earlier["functions_run"] + run["functions_run"]}


def read_record() -> dict:
    namespace = {}
    if RECORD.exists():
        exec(compile(RECORD.read_text(), str(RECORD), "exec"), namespace)
    return namespace.get("PROVEN", {})


def write_record(record: dict) -> None:
    RECORD.write_text(
        '"""FlashInfer\'s declared ops proven on a GPU, per release: traced with no graph break, compiled equal to\n'
        "eager bit for bit, replayed from a CUDA graph, clean under torch.library.opcheck, through the public\n"
        "functions named (their eager cost is FlashInfer's own: the layer rebinds nothing). Read by the\n"
        "declared-ops layer (``FP4_DYNAMO_SHIM_FLASHINFER_OPS=proven``), ``status()`` and verify.\n\n"
        "Written by ``python tools/gpu/proven_record.py`` from a GPU run's JUnit XML; edit it only through that.\n"
        '"""\n\n'
        "#: What each release's record says of the run that measured it.\n"
        f"MEASURED = {MEASURED!r}\n\n"
        "#: FlashInfer release -> {each of MEASURED, \"declarations\": {key: {\"module\", \"op\", \"functions\"}}}\n"
        + "PROVEN = {\n" + "".join(_release_lines(version, record[version]) for version in sorted(record)) + "}\n")


def _release_lines(version: str, release: dict) -> str:
    """One release, one line per declaration (a record change reads as a diff of lines)."""
    lines = [f"    {version!r}: {{\n", *(f"        {field!r}: {release[field]!r},\n" for field in MEASURED),
             "        'declarations': {\n"]
    for key, entry in sorted(release["declarations"].items()):
        lines.append(f"            {key!r}: {{'module': {entry['module']!r}, 'op': {entry['op']!r}, "
                     f"'functions': {entry['functions']!r}}},\n")
    return "".join(lines) + "        },\n    },\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, required=True, action="append",
                        help="a GPU run's JUnit XML; repeat it for each file of one run")
    parser.add_argument("--add", action="store_true",
                        help="add to the release's record instead of replacing it (a run of another test file)")
    for name in ("commit", "date", "gpu", "torch"):
        parser.add_argument(f"--{name}", required=True)
    options = parser.parse_args()
    outcomes, recorded = {}, {}
    for junit in options.junit:
        outcomes.update(gpu_outcomes(junit))
        passed, ops = recorded_outcomes(junit)
        for name, ok in passed.items():  # a function passes when its tests in every file do
            outcomes[name] = outcomes.get(name, True) and ok
        recorded.update(ops)
    if not outcomes:
        raise SystemExit(f"{options.junit}: no {TEST} results and no test naming its function")
    import flashinfer

    reached, declaration_of = reached_declarations()
    for name, ops in recorded.items():
        reached[name] = {declaration_of[op][0]: (declaration_of[op][1], op) for op in sorted(ops)}
    failing = {key for name, keys in reached.items() if outcomes.get(name) is False for key in keys}
    proven = {}
    for name, keys in reached.items():
        if outcomes.get(name):
            for key, (module, op) in keys.items():
                if key not in failing:
                    proven.setdefault(key, {"module": module, "op": op, "functions": []})["functions"].append(name)
    record = read_record()
    release = {"date": options.date, "machine": options.gpu, "torch": options.torch, "shim": options.commit,
               "functions_passed": sum(outcomes.values()), "functions_run": len(outcomes), "declarations": proven}
    if options.add and flashinfer.__version__ in record:
        release = _added(record[flashinfer.__version__], release, failing)
    record[flashinfer.__version__] = release
    write_record(record)
    print(f"flashinfer {flashinfer.__version__}: {len(proven)} declarations proven through "
          f"{sum(outcomes.values())} functions; not proven: {sorted(n for n, ok in outcomes.items() if not ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
