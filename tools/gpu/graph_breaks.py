"""SGLang's other compiled path, ``--enable-torch-compile`` (the decode graphs under torch.compile, not
fullgraph): how many Dynamo graph breaks, how many of them FlashInfer's, and the decode throughput, with and
without the shim and with the declared-ops gate at each value.

    (SGLang 0.5.14 staged: tools/gpu/stage.sh kernel-0.5.14, engine-0.5.14 w1, engine-0.5.14 w2)
    PYTHONPATH=/tmp/site14:src python3 tools/gpu/graph_breaks.py $OUT/breaks [qwen3 [case,case,...]]
    python3 tools/gpu/graph_breaks.py --count LOG...      (recount logs a run brought back)

Each case is one engine (``tests/gpu/engine/run_engine.py --torch-compile --decode-tokens 64``) with
``TORCH_LOGS=graph_breaks``; all start at once (the breaks are counted while compiling), and each times
its decode (the median of five) alone, once every engine is ready (``--decode-turns``). A break is counted once,
at the place Dynamo names (the innermost user frame), and is FlashInfer's when that place is a file of the
``flashinfer`` package. Writes ``breaks.json`` (per case: breaks, FlashInfer's, the count at each place,
decode tokens/s, the greedy ids, whether they equal those of the same attention backend without the shim, and
how near a tie the closest greedy choice came; the checkpoint is a decisive one, tests/gpu/engine/checkpoints.py)
and each case's log, rewritten as each case ends, so a run its call's limit stops keeps the
cases done. Six engines compiling at once on the H200's 16 cores were not all ready after 250 s; three were
ready and timed in 186 s (2026-12-03): name at most three cases per call.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import sys
from pathlib import Path

SHIM = {"FP4_DYNAMO_SHIM_FALLBACK": "reference", "TORCH_LOGS": "graph_breaks"}
CASES = {  # name: (extra runner arguments, environment)
    "no-shim-triton": ([], {"FP4_DYNAMO_SHIM_DISABLE": "1", "TORCH_LOGS": "graph_breaks"}),
    "shim-proven-triton": ([], SHIM),
    "shim-sglang-triton": ([], {**SHIM, "FP4_DYNAMO_SHIM_FLASHINFER_OPS": "sglang"}),
    "shim-off-triton": ([], {**SHIM, "FP4_DYNAMO_SHIM_FLASHINFER_OPS": "off"}),
    "no-shim-flashinfer": (["--attention-backend", "flashinfer"], {"FP4_DYNAMO_SHIM_DISABLE": "1",
                                                                   "TORCH_LOGS": "graph_breaks"}),
    "shim-proven-flashinfer": (["--attention-backend", "flashinfer"], SHIM),
    # SGLang without torch.compile: what each compiled run's greedy ids are judged against.
    "eager-flashinfer": (["--attention-backend", "flashinfer"], {"FP4_DYNAMO_SHIM_DISABLE": "1"}),
}
#: One logged break: Dynamo writes this line once per break (the explanation, hints and traceback follow on
#: lines that say "graph break" too, so counting those counts one break several times).
BREAK = re.compile(r"\[__graph_breaks\] Graph break (?:\(user stack suppressed[^)]*\) )?in user code at (\S+)")


def breaks_at(log_text: str) -> collections.Counter:
    """How many breaks were logged at each place (the file and line of the innermost user frame)."""
    return collections.Counter(BREAK.findall(log_text))


def summarise(run: dict) -> dict:
    places = breaks_at(run["log_text"])
    theirs = {place: n for place, n in places.items() if "/flashinfer/" in place}
    return {"started": bool(run.get("started")), "error": run.get("error"),
            "graph_breaks": sum(places.values()), "flashinfer_breaks": sum(theirs.values()),
            "breaks_at": dict(places.most_common()),
            "decode_tokens_per_s": run.get("decode_tokens_per_s"), "decode_runs": run.get("decode_tokens_per_s_runs"),
            "output_ids": run.get("output_ids"), "closest_margin": closest_margin(run.get("top_logprobs")),
            "top_logprobs": run.get("top_logprobs"),
            "shim_applied": [s.get("shim", {}).get("applied") for s in run["schedulers"]]}


def closest_margin(top_logprobs):
    """The smallest lead of a generated token's logprob over the runner-up's, over every prompt and step: how near
    a tie the greedy choice came (None without logprobs)."""
    leads = [token[0][0] - token[1][0] for prompt in top_logprobs or [] for token in prompt if len(token) > 1]
    return min(leads) if leads else None


def first_difference(case: dict, baseline: dict):
    """Where the greedy ids first differ from the baseline's, with both runs' two best logprobs there: how close
    each greedy choice was (a near tie lets a different order of float operations pick the other token)."""
    for prompt, (ids, baseline_ids) in enumerate(zip(case["output_ids"] or [], baseline["output_ids"] or [])):
        for position, (token, baseline_token) in enumerate(zip(ids, baseline_ids)):
            if token != baseline_token:
                best = [(run.get("top_logprobs") or [[]] * (prompt + 1))[prompt][position:position + 1]
                        for run in (case, baseline)]
                return {"prompt": prompt, "position": position, "token": token, "baseline_token": baseline_token,
                        "top_logprobs": best[0], "baseline_top_logprobs": best[1]}
    return None


def main(out: Path, architecture: str, names: list) -> int:
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; the cases are {', '.join(CASES)}")
    shimmed = [name for name in names if "FP4_DYNAMO_SHIM_DISABLE" not in CASES[name][1]]
    if shimmed and not _scheduler_route():
        raise SystemExit(f"{', '.join(shimmed)}: no route reaches SGLang's scheduler (the shim's plugin entry point "
                         "or its .pth hook): install the shim as a wheel (tools/gpu/stage.sh shim), or those cases "
                         "measure SGLang without it")
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
    import test_gpu_engine as engine_test  # its engine runner and checkpoints (on the GPU machine only)

    turns = out / "decode-turns"  # the engines start together; each times its decode alone on the GPU
    # Decisive: no near tie between the best two tokens, so a greedy id differs only where the model's outputs do.
    model = engine_test.checkpoints.write_checkpoint(architecture, Path("/tmp/graph-breaks-model") / architecture,
                                                     decisive=True)
    for name in names:
        arguments, environment = CASES[name]
        engine_test.CASES[name] = {"env": environment, "args": [
            *([] if name.startswith("eager") else ["--torch-compile"]), "--decode-tokens", "64", "--decode-turns", f"{turns}:{len(names)}", "--logprobs",
            *arguments]}
    summary = {"inductor_deterministic": os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1"}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {pool.submit(engine_test._run, architecture, name, model, Path("/tmp/graph-breaks-runs"),
                               engine_test.PORT_BASE + 10 * i, 3.0 * i): name for i, name in enumerate(names)}
        for future in concurrent.futures.as_completed(futures):
            name, run = futures[future], future.result()
            summary[name] = summarise(run)
            for case_name, case in ((k, v) for k, v in summary.items() if isinstance(v, dict)):  # greedy ids as the engine of its backend without the shim
                baseline = summary.get("no-shim-" + ("flashinfer" if "flashinfer" in case_name else "triton"))
                baseline = None if baseline is case else baseline
                case["same_ids_as_no_shim"] = None if baseline is None else case["output_ids"] == baseline["output_ids"]
                case["first_difference"] = None if baseline is None else first_difference(case, baseline)
            (out / f"{name}.log").write_text(run["log_text"][-300000:])
            (out / "breaks.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    unapplied = [name for name in shimmed if not all(summary[name]["shim_applied"] or [False])]
    if unapplied:
        print(f"the shim was not applied in every scheduler of {', '.join(unapplied)}: not a measurement of it",
              file=sys.stderr)
    return 1 if unapplied else 0


def _scheduler_route() -> bool:
    """Whether a spawned SGLang scheduler can apply the shim: its plugin entry point or its .pth hook installed."""
    from _fp4_dynamo_shim import startup_files
    from _fp4_dynamo_shim.sglang import sglang_releases

    routes = startup_files.installed_routes()
    return bool(sglang_releases.plugin_entry_point() or routes["pth"] or routes["hook_pth"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--count"]:
        print(json.dumps({log: dict(breaks_at(Path(log).read_text(errors="replace")).most_common())
                          for log in sys.argv[2:]}, indent=1))
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "qwen3",
                  sys.argv[3].split(",") if len(sys.argv) > 3 else list(CASES)))
