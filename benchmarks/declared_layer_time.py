"""The declared-ops layer's own time per gate: what ``FP4_DYNAMO_SHIM_FLASHINFER_OPS`` costs when
``torch._dynamo`` is imported (nothing is read or registered before).

Each sample is a fresh interpreter: ``import fp4_dynamo_shim``, then ``import torch._dynamo``, then
``status()["flashinfer_ops"]["seconds"]`` and the count registered. Medians per gate, min-max beside them.

    python benchmarks/declared_layer_time.py --rounds 8
    PYTHONPATH=<folder holding another flashinfer-python> python benchmarks/declared_layer_time.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

GATES = ("off", "sglang", "proven", "all")
SAMPLE = """
import json
import fp4_dynamo_shim
import torch._dynamo
layer = fp4_dynamo_shim.status()["flashinfer_ops"]
print(json.dumps({"seconds": layer["seconds"], "registered": layer["counts"]["registered"],
                  "declared": layer["counts"]["declared"], "flashinfer": fp4_dynamo_shim.status()["flashinfer"]["version"]}))
"""


def sample(gate: str) -> dict:
    environment = {**os.environ, "FP4_DYNAMO_SHIM_FLASHINFER_OPS": gate}
    completed = subprocess.run([sys.executable, "-c", SAMPLE], env=environment, capture_output=True, text=True,
                               check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    options = parser.parse_args()
    samples = {gate: [] for gate in GATES}
    for _ in range(options.rounds):
        for gate in GATES:  # interleaved: a load change on the machine touches every gate alike
            samples[gate].append(sample(gate))
    print(f"flashinfer-python {samples['off'][0]['flashinfer']}, {options.rounds} fresh interpreters per gate")
    print("| gate | registered | layer time, median (min-max) |\n|---|---|---|")
    for gate, rows in samples.items():
        seconds = [row["seconds"] for row in rows]
        print(f"| `{gate}` | {rows[0]['registered']} of {rows[0]['declared']} | {statistics.median(seconds):.3f} s "
              f"({min(seconds):.3f}-{max(seconds):.3f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
