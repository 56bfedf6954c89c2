"""Start one SGLang engine on a tiny NVFP4 checkpoint, generate greedily, and write what happened as JSON.

    python run_engine.py --model DIR --out result.json [--disable-pcg] [--tp 1] [--nccl-port N]
                         [--bf16] [--prompts padded|exact|swapped] [--logprobs] [--capture-tokens 8,16,32]
                         [--torch-compile] [--attention-backend triton] [--decode-tokens N] [--decode-turns DIR:N]

One engine per process: SGLang's shutdown and its failure handler kill every child of the process that
started the engine. The script never imports fp4_dynamo_shim (``run_engine_import.py`` does, for the
import route); whether the shim is active is up to the route under test. The scheduler's log goes to
this process's stderr, which the test reads.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

#: Two prompts, 17 tokens together: within the smallest capture size above (32), so prefill replays a
#: piecewise CUDA graph.
PROMPTS = [[1, 17, 93, 211, 45, 302, 7, 88, 150, 401], [1, 260, 33, 19, 480, 5, 77]]
MAX_NEW_TOKENS = 8
CAPTURE_TOKENS = [8, 16, 32]
#: Two prompts, 32 tokens together: exactly a capture size, so the captured prefill runs with no padding rows.
PROMPTS_EXACT = [[1, 17, 93, 211, 45, 302, 7, 88, 150, 401, 12, 64, 333, 21, 500, 9, 256, 71],
                 [1, 260, 33, 19, 480, 5, 77, 140, 61, 402, 38, 199, 6, 350]]


def on_scheduler_failure(signum, frame):
    """SGLang's default SIGQUIT handler kills this process too; this one lets Engine() raise instead.
    Top-level so that ServerArgs, which carries it to the scheduler, can be pickled."""


def engine_arguments(options, sglang_version: str) -> dict:
    """Engine options. Decode CUDA graphs are off to save GPU minutes; the prefill graphs (torch.compile,
    piecewise) are what the shim is for and stay at each release's default unless --disable-pcg. SGLang's own
    choice of FP4 GEMM on SM90 (0.5.14: Marlin) never calls FlashInfer, so both releases are given the
    FlashInfer cuDNN backend (sglang::fp4_gemm -> flashinfer.mm_fp4), as a Blackwell GPU would run it."""
    arguments = dict(
        model_path=options.model, quantization="modelopt_fp4", skip_tokenizer_init=True,
        attention_backend="triton", fp4_gemm_runner_backend="flashinfer_cudnn", sampling_backend="pytorch",
        mem_fraction_static=0.5, max_total_tokens=2048,
        max_running_requests=4, chunked_prefill_size=256, context_length=512, disable_radix_cache=True,
        random_seed=0, log_level="info", custom_sigquit_handler=on_scheduler_failure, tp_size=options.tp,
        nccl_port=options.nccl_port, kv_cache_dtype="auto",
    )
    arguments["attention_backend"] = options.attention_backend
    if options.bf16:  # a checkpoint with no quantization: SGLang's own bf16 path, no FP4 call anywhere
        del arguments["quantization"], arguments["fp4_gemm_runner_backend"]
    capture = [int(n) for n in options.capture_tokens.split(",")] if options.capture_tokens else CAPTURE_TOKENS
    if sglang_version.startswith("0.5.11"):
        arguments.update(disable_cuda_graph=True, disable_piecewise_cuda_graph=options.disable_pcg,
                         piecewise_cuda_graph_tokens=capture)
    else:  # 0.5.14: per-phase CUDA graph options; the prefill backend is left at its default, tc_piecewise
        arguments.update(disable_decode_cuda_graph=True, disable_prefill_cuda_graph=options.disable_pcg,
                         cuda_graph_bs_prefill=capture,
                         # SGLang's NVFP4 MoE on SM90 is Marlin (a JIT build there); "triton" reaches SGLang's
                         # cutlass_moe_fp4, which sm120_path/sitecustomize.py stands in for, as on 0.5.11.
                         moe_runner_backend="triton")
    if options.torch_compile:  # SGLang's other compiled path: the decode graphs under torch.compile (not fullgraph)
        arguments.update(enable_torch_compile=True, torch_compile_max_bs=4,
                         **({"disable_cuda_graph": False, "cuda_graph_max_bs": 4} if sglang_version.startswith("0.5.11")
                            else {"disable_decode_cuda_graph": False, "cuda_graph_max_bs_decode": 4}))
    return arguments


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--disable-pcg", action="store_true")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--nccl-port", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="the checkpoint is bf16 (written with --bf16)")
    parser.add_argument("--prompts", choices=("padded", "exact", "swapped"), default="padded",
                        help="17 tokens (padded to the capture size 32), exactly 32, or the 17 in the other order")
    parser.add_argument("--capture-tokens", default=None, help="prefill capture sizes (default 8,16,32)")
    parser.add_argument("--torch-compile", action="store_true", help="enable_torch_compile with decode graphs on")
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--decode-turns", default=None, metavar="DIR:N",
                        help="engines timing decode at once on one GPU: wait until N have written DIR/ready-*, "
                             "then time one at a time under a lock on DIR/turn (else each measures the others)")
    parser.add_argument("--decode-tokens", type=int, default=0,
                        help="then time a greedy decode of this many tokens for the prompts, five times (decode_tokens_per_s: the median)")
    parser.add_argument("--logprobs", action="store_true",
                        help="also record each generated token's two best logprobs (how close the greedy choice was)")
    options = parser.parse_args()
    result = {"pid": os.getpid(), "shim_imported_by_launcher": "fp4_dynamo_shim" in sys.modules,
              "FP4_DYNAMO_SHIM": os.environ.get("FP4_DYNAMO_SHIM")}
    started = time.perf_counter()
    engine = None
    try:
        import importlib.metadata

        import sglang

        result["sglang"] = importlib.metadata.version("sglang")
        engine = sglang.Engine(**engine_arguments(options, result["sglang"]))
        result["startup_s"] = time.perf_counter() - started
        begin = time.perf_counter()
        prompts = {"padded": PROMPTS, "exact": PROMPTS_EXACT, "swapped": PROMPTS[::-1]}[options.prompts]
        engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": 1})
        result["first_token_s"] = time.perf_counter() - begin
        # The generated tokens' logprobs only: asking for the prompt's (logprob_start_len=0) makes SGLang run
        # that prefill without its graphs (PiecewiseCudaGraphRunner.can_run), so on and off would both be eager.
        extra = {"return_logprob": True, "top_logprobs_num": 2} if options.logprobs else {}
        outputs = engine.generate(input_ids=prompts, sampling_params={
            "temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}, **extra)
        result["output_ids"] = [output["output_ids"] for output in outputs]
        if options.logprobs:
            try:
                result["top_logprobs"] = [[[[float(p), int(t)] for p, t, *_ in token] for token in
                                           output["meta_info"]["output_top_logprobs"]] for output in outputs]
            except Exception as error:  # a diagnostic: the ids stand without it
                result["top_logprobs_error"] = f"{error!r}: {str(outputs[0].get('meta_info'))[:2000]}"
        if options.decode_tokens:
            engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": 4})  # warm
            with _decode_turn(options.decode_turns, result):
                rates = []
                for _ in range(5):
                    begin = time.perf_counter()
                    engine.generate(input_ids=prompts, sampling_params={
                        "temperature": 0.0, "max_new_tokens": options.decode_tokens, "ignore_eos": True})
                    rates.append(len(prompts) * options.decode_tokens / (time.perf_counter() - begin))
            result["decode_tokens_per_s_runs"] = rates
            result["decode_tokens_per_s"] = statistics.median(rates)
        result["started"] = True
    except Exception as error:  # the failure is the result (the shim-off run expects one)
        result.update(started=False, error=f"{type(error).__name__}: {error}")
        if options.decode_turns:  # counted as ready, so the engines that did start do not wait 300 s for this one
            _mark_ready(options.decode_turns)
    finally:
        with open(options.out, "w") as stream:
            json.dump(result, stream)
        if engine is not None:
            engine.shutdown()
        else:
            from sglang.srt.utils import kill_process_tree

            kill_process_tree(os.getpid(), include_parent=False)
    return 0


def _mark_ready(turns: str) -> tuple:
    directory, count = turns.rsplit(":", 1)
    Path(directory).mkdir(parents=True, exist_ok=True)
    Path(directory, f"ready-{os.getpid()}").touch()
    return directory, count


@contextlib.contextmanager
def _decode_turn(turns: str | None, result: dict):
    """Hold the GPU alone while timing: every engine of the run is ready (or 300 s passed), then one at a time."""
    if not turns:
        yield
        return
    directory, count = _mark_ready(turns)
    deadline = time.monotonic() + 300
    while len(list(Path(directory).glob("ready-*"))) < int(count) and time.monotonic() < deadline:
        time.sleep(1)
    result["decode_turn_waited_for_all"] = len(list(Path(directory).glob("ready-*"))) >= int(count)
    with open(Path(directory, "turn"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    signal.signal(signal.SIGQUIT, on_scheduler_failure)
    sys.exit(main())
