"""Shared helpers for the benchmarks: environment capture, interleaved timing, tables and JSON."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import importlib.metadata as metadata

        info["flashinfer"] = metadata.version("flashinfer-python")
    except Exception:
        info["flashinfer"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = "SM%d%d" % torch.cuda.get_device_capability(0)
    return info


def timed(function: Callable[[], object], calls: int, synchronize: Callable[[], None] = lambda: None,
          warmup: int = 0) -> float:
    """Microseconds per call of ``function``, over ``calls`` calls between two ``synchronize()``s (a GPU's
    ``torch.cuda.synchronize``: the launches are asynchronous) after ``warmup`` untimed calls."""
    for _ in range(warmup):
        function()
    synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        function()
    synchronize()
    return (time.perf_counter() - started) / calls * 1e6


def interleaved_ratio(candidates: Dict[str, Callable[[], None]], calls: int, rounds: int,
                      synchronize: Callable[[], None]) -> Dict[str, dict]:
    """Time each candidate for ``calls`` calls, alternating candidates every round (machines are noisy).

    Returns, per candidate, the median microseconds per call over the rounds and every round's value.
    """
    per_round: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, function in candidates.items():
            synchronize()
            started = time.perf_counter()
            for _ in range(calls):
                function()
            synchronize()
            per_round[name].append((time.perf_counter() - started) / calls * 1e6)
    return {name: {"median_us": statistics.median(values), "rounds_us": values} for name, values in per_round.items()}


def median_ratio(numerator: List[float], denominator: List[float]) -> float:
    """Median over rounds of the per-round ratio, so slow phases of the machine cancel out."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def add_save_option(parser) -> None:
    """``--save [DIR]``: write the JSON result (to benchmarks/results/ by default). Without it nothing is
    written, so a run never overwrites the committed results by accident."""
    parser.add_argument("--save", nargs="?", const=str(RESULTS), default=None, metavar="DIR",
                        help=f"write the JSON result into DIR (default {RESULTS.relative_to(RESULTS.parent.parent)})")


def write(name: str, document: dict, save) -> str:
    """Write ``document`` as ``<save>/<name>.json`` when ``save`` is a directory; say what happened."""
    if save is None:
        return "result not saved (pass --save to write it)"
    directory = Path(save)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return f"wrote {path}"


def table(headers: List[str], rows: List[list]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    lines = [" | ".join(str(h).ljust(w) for h, w in zip(headers, widths))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def stand_in_sm100() -> None:
    """FlashInfer's function and the shim, on CPU tensors, as on an SM100 whose JIT module does nothing (the
    tests' stand-in, tests/support/stand_in_gpu.py): each path's host cost with a kernel launch of zero, where
    no GPU is."""
    import builtins
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    import stand_in_gpu

    stand_in_gpu.install_sm100(builtins.setattr, stand_in_gpu.NoKernel())
    import fp4_dynamo_shim

    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    cpu_as_stand_in_gpu()


def cpu_as_stand_in_gpu() -> None:
    """CPU tensors take the shim's paths for the stand-in GPU (until the next apply(), which resets them)."""
    from _fp4_dynamo_shim.fp4 import devices

    devices.replace(**devices.serving_cpu_as(0))
