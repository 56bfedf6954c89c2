"""Prefill graphs on against off, for one architecture, in the variants that tell the graphs' own numerics
from the shim's: the NVFP4 checkpoint through the shim (its reference FP4 values), and the same model in
bf16 with the shim switched off (no FP4 call anywhere, so the shim cannot take part); each with SGLang's
padding of the prefill to its capture size (17 tokens -> 32) and without it (exactly 32 tokens).

    bash tools/gpu/stage.sh engine   # SGLang 0.5.11's engine into /tmp/site (see tests/gpu/test_gpu_engine.py)
    PYTHONPATH=/tmp/site:src python3 tools/gpu/engine_pairs.py deepseek_v3 $OUT/pairs [variant,...]

Writes ``pairs.json``: per variant the greedy ids on and off, the first position where they differ, and the
two best logprobs there (how near the greedy choice was to a tie).
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
import test_gpu_engine as engine_test  # noqa: E402  (its engine runner and checkpoints)

SHIM = {"FP4_DYNAMO_SHIM_FALLBACK": "reference"}
NO_SHIM = {"FP4_DYNAMO_SHIM_DISABLE": "1"}
VARIANTS = {  # name: (bf16 checkpoint, extra runner arguments, environment)
    "nvfp4-shim-padded": (False, [], SHIM),
    "nvfp4-shim-exact": (False, ["--prompts", "exact"], SHIM),
    "bf16-noshim-padded": (True, ["--bf16"], NO_SHIM),
    "bf16-noshim-exact": (True, ["--bf16", "--prompts", "exact"], NO_SHIM),
    # where the padded prefill parts from the eager one: which prompt, and is it the padding
    "nvfp4-shim-swapped": (False, ["--prompts", "swapped"], SHIM),
    "nvfp4-shim-padded-unmasked": (False, [], {**SHIM, "FP4_DYNAMO_SHIM_TEST_MOE_UNMASKED": "1"}),
    "nvfp4-shim-capture17": (False, ["--capture-tokens", "8,16,17,32"], SHIM),
    "bf16-noshim-swapped": (True, ["--bf16", "--prompts", "swapped"], NO_SHIM),
}


def first_difference(on, off):
    for prompt, (a, b) in enumerate(zip(on, off)):
        for position, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return prompt, position
    return None


def main(architecture: str, out: Path, chosen: list) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="engine-pairs-"))  # checkpoints and logs: too large to send back
    models = {bf16: engine_test.checkpoints.write_checkpoint(architecture, work / "models" / str(bf16), bf16=bf16)
              for bf16 in (False, True)}
    runs = []
    variants = {name: VARIANTS[name] for name in chosen or VARIANTS}
    for name, (bf16, arguments, environment) in variants.items():
        for graphs in ("on", "off"):
            case = f"{name}-{graphs}"
            engine_test.CASES[case] = {"env": environment,
                                       "args": arguments + ["--logprobs"] + (["--disable-pcg"] if graphs == "off" else [])}
            runs.append((case, models[bf16]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {case: pool.submit(engine_test._run, architecture, case, model, work / "runs",
                                     engine_test.PORT_BASE + 10 * i, 2.0 * i)
                   for i, (case, model) in enumerate(runs)}
        results = {case: future.result() for case, future in futures.items()}
    summary = {}
    for name in variants:
        on, off = results[f"{name}-on"], results[f"{name}-off"]
        row = {"started": [bool(on.get("started")), bool(off.get("started"))],
               "errors": [on.get("error"), off.get("error")],
               "capture_s_on": on.get("pcg_capture_s"), "prefills_on": on.get("prefills"),
               "prefills_off": off.get("prefills"),
               "ids_on": on.get("output_ids"), "ids_off": off.get("output_ids")}
        if on.get("output_ids") and off.get("output_ids"):
            where = first_difference(on["output_ids"], off["output_ids"])
            row["equal"] = where is None
            if where and "top_logprobs" in on and "top_logprobs" in off:
                prompt, position = where
                row["first_difference"] = {"prompt": prompt, "position": position,
                                           "top2_on": on["top_logprobs"][prompt][position],
                                           "top2_off": off["top_logprobs"][prompt][position]}
            row["top_logprobs_error"] = on.get("top_logprobs_error")
            if "top_logprobs" in on and "top_logprobs" in off:
                # per generated position: the largest difference of the two best logprobs (position 0 is the
                # prefill's own output; the rest read the KV cache the prefill wrote)
                row["logprob_differences"] = [
                    [round(max(abs(x[0] - y[0]) for x, y in zip(a, b)), 6) for a, b in zip(on_prompt, off_prompt)]
                    for on_prompt, off_prompt in zip(on["top_logprobs"], off["top_logprobs"])]
            if "top_logprobs" in off:
                row["smallest_top2_gap_off"] = min(token[0][0] - token[1][0] for output in off["top_logprobs"]
                                                   for token in output)
        summary[name] = row
        for case, run in (("on", on), ("off", off)):
            if not run.get("started"):
                (out / f"{name}-{case}.log").write_text(run["log_text"][-100000:])
    (out / "pairs.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: {kk: v for kk, v in r.items() if not kk.startswith("ids")} for k, r in summary.items()},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), [v for v in (sys.argv[3:] or [""])[0].split(",") if v]))
