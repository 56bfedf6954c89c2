"""What SGLang's piecewise CUDA graph (PCG) buys: prefill and decode with it on and off, in a real engine.

SGLang 0.5.11's engine (the release that runs on the GPU machine; PCG is on by default there), bf16 models
with dummy weights (``load_format="dummy"``: the arithmetic, not the values, is what is timed), triton
attention, decode CUDA graphs on in both runs (SGLang's default), everything else at SGLang's defaults. Two
shapes, written as config.json only:

* ``qwen3-1.3b``: Qwen3-shaped, hidden 2048, 20 layers, 16 heads / 8 KV heads of 128, MLP 6144, tied
  embeddings (about 1.3B parameters);
* ``llama-8b``: Llama-3-8B-shaped, hidden 4096, 32 layers, 32 / 8 heads, MLP 14336.

For each model the engine is started twice, one at a time (PCG on, then off), and measures, each the
median of ``--repeats`` runs after a warm-up: single-request prefill time (``max_new_tokens=1``, the time to
the first token) for each ``--prompt-lengths``; a batch of ``--batch-prefill`` prompts of 512 tokens; and
decode throughput (output tokens per second, ``--decode-tokens`` new tokens, ``ignore_eos``) at each
``--decode-batch``. The table prints PCG-off over PCG-on for prefill times and PCG-on over PCG-off for
decode throughput, so above 1 is PCG winning. Each engine start captures its graphs (a tiny Qwen3 took
111-135 s on the H200, /work/shared/gpu/README.md), so run one model per command:

    FP4_DYNAMO_SHIM_DISABLE=1 python benchmarks/pcg_engine.py --model qwen3-1.3b [--save DIR]
    FP4_DYNAMO_SHIM_DISABLE=1 python benchmarks/pcg_engine.py --model llama-8b [--save DIR]

No shim is involved (bf16 models; FP4_DYNAMO_SHIM_DISABLE=1 keeps an installed plugin out of the schedulers):
this measures SGLang, to say what users lose when they turn PCG off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import add_save_option, environment, now, table, write  # noqa: E402

MODELS = {
    "qwen3-1.3b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048,
                   "intermediate_size": 6144, "num_hidden_layers": 20, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
                   "rope_theta": 1000000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                   "attention_bias": False},
    "llama-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
                 "rope_theta": 500000.0, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                 "attention_bias": False},
}
COMMON = {"hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}


def write_model(name: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**COMMON, **MODELS[name]}, indent=2))
    return directory


def prompt(length: int, seed: int) -> list:
    return [(seed * 7919 + i * 104729) % 30000 + 10 for i in range(length)]


def measure(engine, options) -> dict:
    def timed(input_ids, new_tokens):
        started = time.perf_counter()
        outputs = engine.generate(input_ids=input_ids, sampling_params={
            "temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True})
        return time.perf_counter() - started, outputs

    def median_of(make, new_tokens):
        timed(make(-1), new_tokens)  # warm-up (first use of these shapes)
        return statistics.median(timed(make(r), new_tokens)[0] for r in range(options.repeats))

    result = {"prefill_s": {}, "decode_tokens_per_s": {}}
    for length in options.prompt_lengths:
        result["prefill_s"][str(length)] = median_of(lambda r, n=length: [prompt(n, r)], 1)
    batch = options.batch_prefill
    result["batch_prefill_s"] = median_of(lambda r: [prompt(512, r * batch + i) for i in range(batch)], 1)
    for size in options.decode_batch:
        def make(r, size=size):
            return [prompt(32, r * size + i) for i in range(size)]
        seconds = median_of(make, options.decode_tokens)
        result["decode_tokens_per_s"][str(size)] = size * options.decode_tokens / seconds
    return result


def run_engine(model_dir: Path, pcg: bool, options) -> dict:
    import sglang

    started = time.perf_counter()
    engine = sglang.Engine(model_path=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                           attention_backend="triton", disable_piecewise_cuda_graph=not pcg, random_seed=0,
                           mem_fraction_static=options.mem_fraction_static, log_level="warning")
    try:
        startup = time.perf_counter() - started
        return {"pcg": pcg, "startup_s": startup, **measure(engine, options)}
    finally:
        engine.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[64, 256, 1024, 2048, 4096])
    parser.add_argument("--batch-prefill", type=int, default=8)
    parser.add_argument("--decode-batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mem-fraction-static", type=float, default=0.7)
    add_save_option(parser)
    options = parser.parse_args()
    import importlib.metadata

    model_dir = write_model(options.model, Path(tempfile.mkdtemp()) / options.model)
    runs = {pcg: run_engine(model_dir, pcg, options) for pcg in (True, False)}
    on, off = runs[True], runs[False]
    rows = [[f"prefill {n} tokens (s)", f"{on['prefill_s'][n]:.4f}", f"{off['prefill_s'][n]:.4f}",
             f"{off['prefill_s'][n] / on['prefill_s'][n]:.2f}x faster with PCG"] for n in on["prefill_s"]]
    rows.append([f"prefill {options.batch_prefill} x 512 (s)", f"{on['batch_prefill_s']:.4f}",
                 f"{off['batch_prefill_s']:.4f}", f"{off['batch_prefill_s'] / on['batch_prefill_s']:.2f}x faster with PCG"])
    rows += [[f"decode batch {b} (tok/s)", f"{on['decode_tokens_per_s'][b]:.1f}", f"{off['decode_tokens_per_s'][b]:.1f}",
              f"{on['decode_tokens_per_s'][b] / off['decode_tokens_per_s'][b]:.2f}x with PCG"]
             for b in on["decode_tokens_per_s"]]
    print(f"SGLang {importlib.metadata.version('sglang')}, {options.model}, bf16 dummy weights, triton attention")
    print(table(["measure", "PCG on", "PCG off", "on vs off"], rows))
    print(write(f"pcg_engine_{options.model}", {
        "benchmark": "SGLang engine prefill and decode with piecewise CUDA graphs on and off",
        "when": now(), "environment": {**environment(), "sglang": importlib.metadata.version("sglang")},
        "model": options.model, "config": MODELS[options.model], "command": " ".join(["python"] + sys.argv),
        "options": {k: v for k, v in vars(options).items() if k != "save"}, "pcg_on": on, "pcg_off": off,
    }, options.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
