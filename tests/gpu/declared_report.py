"""The declared ops' GPU table: per FlashInfer module, declared ops registered / public functions traced / bit-exact /
captured / opcheck-clean, and declarations not registered (by kind), for the installed release, as JSON.

    python3 tests/gpu/declared_report.py --output $OUT/declared_report_<version>.json

``tests/gpu/test_gpu_declared.py`` writes the same table from its own run when ``$OUT`` is set.

Every measure comes from ``declared_checks.check`` on the ``declared_examples`` calls (real CUDA tensors,
FP4_DYNAMO_SHIM_FLASHINFER_OPS=all); counts of registrations come from ``status()["flashinfer_ops"]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "support")]

import torch  # noqa: E402

import fp4_dynamo_shim  # noqa: E402

import declared_checks  # noqa: E402
import declared_examples  # noqa: E402


def document(layer: dict, functions: list, seconds: float) -> dict:
    """The JSON table from the layer's status and each function's ``declared_checks.check`` row."""
    modules = {}  # by FlashInfer's top-level module: flashinfer.fused_moe.core and .fused_routing_dsv3 -> fused_moe
    for module, counts in layer["by_module"].items():
        entry = modules.setdefault(module.split(".")[1], {"registered": 0, "not_registered": {}})
        entry["registered"] += counts["registered"]
        for kind, n in counts.items():
            if kind not in ("declared", "registered") and n:
                entry["not_registered"][kind] = entry["not_registered"].get(kind, 0) + n
    for row in functions:
        if not row.get("present"):
            continue
        entry = modules.setdefault(row["name"].split(".")[0], {"registered": 0, "not_registered": {}})
        entry["functions"] = entry.get("functions", 0) + 1
        for measure in ("traced", "bit_exact", "graph"):
            entry[measure] = entry.get(measure, 0) + (row.get(measure) is True)
        clean = isinstance(row.get("opcheck"), dict) and all(v is True for v in row["opcheck"].values())
        entry["opcheck_clean"] = entry.get("opcheck_clean", 0) + clean
    return {"flashinfer": fp4_dynamo_shim.status()["flashinfer"]["version"], "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0), "counts": layer["counts"], "modules": modules,
            "functions": functions, "seconds": round(seconds, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    options = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with declared_checks.every_op_on() as layer:
        functions = []
        for example in declared_examples.EXAMPLES:
            try:
                functions.append(declared_checks.check(example))
            except Exception as error:  # one function's crash is its row, not the report's end
                functions.append({"name": example.name, "present": True, "error": f"{type(error).__name__}: {error}"})
            print(json.dumps(functions[-1])[:400], flush=True)
    result = document(layer, functions, time.perf_counter() - started)
    options.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"counts": result["counts"], "modules": result["modules"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
