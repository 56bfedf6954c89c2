"""SGLang's other compiled path, ``--enable-torch-compile`` (the decode graphs under torch.compile, not
fullgraph): how many Dynamo graph breaks, how many of them FlashInfer's, and the decode throughput, with and
without the shim and with the declared-ops gate at each value.

    bash tools/gpu/stage.sh kernel-0.5.14; bash tools/gpu/stage.sh engine-0.5.14 w1; ... w2   (three calls)
    PYTHONPATH=/tmp/site14:src python3 tools/gpu/graph_breaks.py $OUT/breaks [qwen3 [case,case,...]]

Each case is one engine (``tests/gpu/engine/run_engine.py --torch-compile --decode-tokens 64``) with
``TORCH_LOGS=graph_breaks``; all start at once (the breaks are counted while compiling), and each times
its decode (best of three) alone, once every engine is ready (``--decode-turns``); a break
is FlashInfer's when its logged block names a ``flashinfer`` file. Writes
``breaks.json`` (per case: breaks, FlashInfer's breaks with their first lines, decode tokens/s), rewritten as
each case ends, so a run its call's limit stops keeps the cases done. Six engines compiling at once on the
H200's 16 cores were not all ready after 250 s (2026-12-03): name fewer cases per call when time is short.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
import test_gpu_engine as engine_test  # noqa: E402  (its engine runner and checkpoints)

SHIM = {"FP4_DYNAMO_SHIM_FALLBACK": "reference", "TORCH_LOGS": "graph_breaks"}
CASES = {  # name: (extra runner arguments, environment)
    "no-shim-triton": ([], {"FP4_DYNAMO_SHIM_DISABLE": "1", "TORCH_LOGS": "graph_breaks"}),
    "shim-proven-triton": ([], SHIM),
    "shim-sglang-triton": ([], {**SHIM, "FP4_DYNAMO_SHIM_FLASHINFER_OPS": "sglang"}),
    "shim-off-triton": ([], {**SHIM, "FP4_DYNAMO_SHIM_FLASHINFER_OPS": "off"}),
    "no-shim-flashinfer": (["--attention-backend", "flashinfer"], {"FP4_DYNAMO_SHIM_DISABLE": "1",
                                                                   "TORCH_LOGS": "graph_breaks"}),
    "shim-proven-flashinfer": (["--attention-backend", "flashinfer"], SHIM),
}
BREAK = re.compile(r"graph break", re.I)


def breaks_in(log_text: str) -> list:
    """Each logged graph break as its block of lines (up to the next break, at most 40 lines)."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if BREAK.search(line)]
    return ["\n".join(lines[s:min(s + 40, *(n for n in starts if n > s), len(lines))]) for s in starts]


def summarise(run: dict) -> dict:
    blocks = breaks_in(run["log_text"])
    theirs = [b for b in blocks if "flashinfer" in b.lower()]
    return {"started": bool(run.get("started")), "error": run.get("error"),
            "graph_breaks": len(blocks), "flashinfer_breaks": len(theirs),
            "flashinfer_first_lines": sorted({b.splitlines()[0][:300] for b in theirs}),
            "other_first_lines": sorted({b.splitlines()[0][:300] for b in blocks if b not in theirs})[:20],
            "decode_tokens_per_s": run.get("decode_tokens_per_s"),
            "shim_applied": [s.get("shim", {}).get("applied") for s in run["schedulers"]]}


def main(out: Path, architecture: str, names: list) -> int:
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; the cases are {', '.join(CASES)}")
    out.mkdir(parents=True, exist_ok=True)
    turns = out / "decode-turns"  # the engines start together; each times its decode alone on the GPU
    model = engine_test.checkpoints.write_checkpoint(architecture, Path("/tmp/graph-breaks-model") / architecture)
    for name in names:
        arguments, environment = CASES[name]
        engine_test.CASES[name] = {"env": environment, "args": ["--torch-compile", "--decode-tokens", "64",
                                                                "--decode-turns", f"{turns}:{len(names)}", *arguments]}
    summary = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {pool.submit(engine_test._run, architecture, name, model, Path("/tmp/graph-breaks-runs"),
                               engine_test.PORT_BASE + 10 * i, 3.0 * i): name for i, name in enumerate(names)}
        for future in concurrent.futures.as_completed(futures):
            name, run = futures[future], future.result()
            summary[name] = summarise(run)
            (out / f"{name}.log").write_text(run["log_text"][-300000:])
            (out / "breaks.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: {kk: v for kk, v in r.items() if kk != "other_first_lines"} for k, r in summary.items()},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "qwen3",
                  sys.argv[3].split(",") if len(sys.argv) > 3 else list(CASES)))
