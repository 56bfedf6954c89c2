"""Start one SGLang engine on a tiny NVFP4 checkpoint, generate greedily, and write what happened as JSON.

    python run_engine.py --model DIR --out result.json [--disable-pcg] [--tp 1] [--nccl-port N]

One engine per process: SGLang's shutdown and its failure handler kill every child of the process that
started the engine. The script never imports fp4_dynamo_shim (``run_engine_import.py`` does, for the
import route); whether the shim is active is up to the route under test. The scheduler's log goes to
this process's stderr, which the test reads.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

#: Two prompts, 17 tokens together: within the smallest capture size above (32), so prefill replays a
#: piecewise CUDA graph.
PROMPTS = [[1, 17, 93, 211, 45, 302, 7, 88, 150, 401], [1, 260, 33, 19, 480, 5, 77]]
MAX_NEW_TOKENS = 8
CAPTURE_TOKENS = [8, 16, 32]


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
    if sglang_version.startswith("0.5.11"):
        arguments.update(disable_cuda_graph=True, disable_piecewise_cuda_graph=options.disable_pcg,
                         piecewise_cuda_graph_tokens=CAPTURE_TOKENS)
    else:  # 0.5.14: per-phase CUDA graph options; the prefill backend is left at its default, tc_piecewise
        arguments.update(disable_decode_cuda_graph=True, disable_prefill_cuda_graph=options.disable_pcg,
                         cuda_graph_bs_prefill=CAPTURE_TOKENS,
                         # SGLang's NVFP4 MoE on SM90 is Marlin (a JIT build there); "triton" reaches SGLang's
                         # cutlass_moe_fp4, which sm120_path/sitecustomize.py stands in for, as on 0.5.11.
                         moe_runner_backend="triton")
    return arguments


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--disable-pcg", action="store_true")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--nccl-port", type=int, default=None)
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
        engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": 1})
        result["first_token_s"] = time.perf_counter() - begin
        outputs = engine.generate(input_ids=PROMPTS, sampling_params={
            "temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True})
        result["output_ids"] = [output["output_ids"] for output in outputs]
        result["started"] = True
    except Exception as error:  # the failure is the result (the shim-off run expects one)
        result.update(started=False, error=f"{type(error).__name__}: {error}")
    finally:
        with open(options.out, "w") as stream:
            json.dump(result, stream)
        if engine is not None:
            engine.shutdown()
        else:
            from sglang.srt.utils import kill_process_tree

            kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGQUIT, on_scheduler_failure)
    sys.exit(main())
