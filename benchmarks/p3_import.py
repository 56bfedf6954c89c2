"""P3: ``import fp4_dynamo_shim`` vs ``import flashinfer`` with a warm JIT cache (goal <= 1.1x), and the cold build.

Each sample is a fresh interpreter; samples alternate between the two commands and the figure is the
median of per-pair ratios. The cold-cache build time is ``import fp4_dynamo_shim`` with FlashInfer's
workspace pointed at an empty directory (FLASHINFER_WORKSPACE_BASE).

On SM<100 the shim builds nothing unless asked to launch the kernel, so run it with
FP4_DYNAMO_SHIM_FALLBACK=launch to measure the build/load it does on Blackwell:
    FP4_DYNAMO_SHIM_FALLBACK=launch python benchmarks/p3_import.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import add_save_option, environment, now, table, write  # noqa: E402

SHIM = "import fp4_dynamo_shim"
FLASHINFER = "import flashinfer"


def run(code: str, env=None) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, **(env or {})},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--skip-cold", action="store_true")
    add_save_option(parser)
    options = parser.parse_args()
    run(SHIM)  # warm the JIT cache (and the OS page cache) once
    pairs = [(run(FLASHINFER), run(SHIM)) for _ in range(options.samples)]
    ratio = statistics.median(s / f for f, s in pairs)
    warm = {"flashinfer_s": statistics.median(f for f, _ in pairs), "shim_s": statistics.median(s for _, s in pairs),
            "ratio": ratio, "pairs": pairs}
    cold = None
    if not options.skip_cold:
        with tempfile.TemporaryDirectory() as workspace:
            code = (f"{SHIM}, json; print(json.dumps([d['load_seconds'] for d in "
                    "fp4_dynamo_shim.status()['devices'] or []]))")
            started = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                 env={**os.environ, "FLASHINFER_WORKSPACE_BASE": workspace})
            cold = {"import_s": time.perf_counter() - started, "build_s": json.loads(out.stdout.strip().splitlines()[-1])}
    rows = [["import flashinfer (warm)", f"{warm['flashinfer_s']:.2f}"], ["import fp4_dynamo_shim (warm)", f"{warm['shim_s']:.2f}"],
            ["ratio (median of pairs)", f"{ratio:.3f}"]]
    if cold:
        rows.append(["import fp4_dynamo_shim (cold JIT cache)", f"{cold['import_s']:.1f}"])
        rows.append(["of which FP4 module build (per GPU)", ", ".join(f"{b:.1f}" for b in cold["build_s"] if b)])
    print(table(["what", "seconds"], rows))
    saved = write("p3_import", {"benchmark": "P3 import cost", "when": now(), "environment": environment(),
                               "command": " ".join(["python"] + sys.argv),
                               "fallback": os.environ.get("FP4_DYNAMO_SHIM_FALLBACK", "error"),
                               "warm": warm, "cold": cold}, options.save)
    print(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
