"""Interpreter start-up with the import hook installed vs not (issue 3): ``python -c pass``.

Three fresh virtual environments built from this checkout: without the package, with it and
FP4_DYNAMO_SHIM unset, with it and FP4_DYNAMO_SHIM=1 (the hook then imports wrapt and registers a
post-import hook; torch and flashinfer are never imported at start-up). Runs alternate between the
three; the figures are medians and median per-round ratios against the environment without the package.

    python benchmarks/startup.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from common import add_save_option, environment, now, table, write  # noqa: E402
import venvs  # noqa: E402


def start(python: Path, env: dict) -> float:
    started = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], check=True, env={"PATH": "/usr/bin:/bin", **env})
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    add_save_option(parser)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        bare = venvs.create(Path(scratch) / "bare", with_project=False)
        installed = venvs.create(Path(scratch) / "installed")
        variants = {
            "no package": (bare.python, {}),
            "hook installed, FP4_DYNAMO_SHIM unset": (installed.python, {}),
            "hook installed, FP4_DYNAMO_SHIM=1": (installed.python, {"FP4_DYNAMO_SHIM": "1"}),
        }
        for python, env in variants.values():
            start(python, env)
        samples = {name: [] for name in variants}
        for _ in range(options.rounds):
            for name, (python, env) in variants.items():
                samples[name].append(start(python, env))
    baseline = samples["no package"]
    rows, results = [], {}
    for name, values in samples.items():
        ratio = statistics.median(v / b for v, b in zip(values, baseline))
        results[name] = {"median_ms": statistics.median(values) * 1e3, "ratio": ratio}
        rows.append([name, f"{statistics.median(values) * 1e3:.1f}", f"{ratio:.3f}"])
    print(table(["python -c pass", "median ms", "ratio to no package"], rows))
    saved = write("startup", {"benchmark": "interpreter start-up with the import hook", "when": now(),
                             "environment": environment(), "rounds": options.rounds,
                             "command": " ".join(["python"] + sys.argv), "results": results}, options.save)
    print(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
