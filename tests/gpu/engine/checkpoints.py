"""Tiny NVFP4 checkpoints in NVIDIA ModelOpt's format, written by the project itself (no hub anywhere).

Laid out exactly as SGLang 0.5.11's ``modelopt_quant.py`` loads them (read from its source):

* the quantization config either as ``hf_quant_config.json`` (``{"quantization": {"quant_algo": "NVFP4",
  "group_size": 16, "exclude_modules": [...]}}``) or flat in ``config.json["quantization_config"]``
  (``{"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": [...]}``): both forms
  are written, one per architecture, since SGLang parses them on different paths;
* per quantized linear (unfused HF names): ``weight`` uint8 ``[N, K/2]`` (two e2m1 codes per byte, the
  even element in the low nibble), ``weight_scale`` float8_e4m3fn ``[N, K/16]`` in plain row-major order
  (SGLang swizzles it), ``weight_scale_2`` float32 0-dim, ``input_scale`` float32 0-dim;
* q/k/v and gate/up share one ``weight_scale_2`` and one ``input_scale`` (SGLang fuses them and keeps
  the max); Qwen3-MoE experts per expert as ``mlp.experts.{e}.{gate,up,down}_proj.*``;
* ``lm_head``, embeddings, norms, Qwen3's q/k norms and the MoE router stay bf16 (``lm_head`` and the
  router are in the exclude list, as ModelOpt writes it). Every parameter is written: SGLang does not
  check for missing tensors.
* DeepSeek-V3 (``DeepseekV3ForCausalLM``): MLA attention (``q_a_proj``/``q_a_layernorm``/``q_b_proj``,
  ``kv_a_proj_with_mqa``/``kv_a_layernorm``/``kv_b_proj``, DeepSeek's own head dims: kv_lora_rank 512, rope 64,
  nope 128, v 128) kept bf16 and excluded (``model.layers.*.self_attn*``, as NVIDIA's DeepSeek NVFP4
  checkpoints do); layer 0 a dense NVFP4 MLP (``first_k_dense_replace``), layer 1 256 routed experts with
  grouped top-k (8 groups, 4 chosen, ``noaux_tc`` with ``e_score_correction_bias``) and one shared expert,
  which SGLang fuses into the MoE as expert 256 (it does so only for exactly 256 routed and 1 shared);
* GLM-4.5 MoE (``Glm4MoeForCausalLM``): NVFP4 attention with q/k/v biases and q/k norms, partial rotary,
  layer 0 dense, layer 1 16 routed experts (``e_score_correction_bias``) and one shared expert (fused).

Weights are random bf16 quantized with the project's reference quantizer (global scale
``1 / weight_scale_2``, ``weight_scale_2 = amax / (6 * 448)``), so they dequantize to sensible values.
Random weights leave near ties between the best two tokens, where a different order of float operations (a
compiled graph against eager kernels) picks the other one. ``decisive=True`` writes a checkpoint with none, for
comparing greedy ids: ``lm_head`` row ``successor[i]`` is token ``i``'s embedding, so each token's own embedding,
still in the residual stream after the layers added theirs, makes its successor the greedy choice by a wide margin,
while the attention and MLP outputs, at their random scale, still move every logit. In a float32 forward of the
bf16 Llama and Qwen3 models (four prompts, 32 greedy steps each), the best two tokens were at least 98 logits apart
(median 134), against a median of 0.2 and exact ties with random weights.
All dimensions are multiples of 128 where SGLang pads or its MoE kernels need it. Written with the
``safetensors`` library.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from _fp4_dynamo_shim.fp4 import reference

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB, LAYERS = 256, 4, 2, 64, 512, 512, 2
EXPERTS, TOP_K, MOE_INTERMEDIATE = 8, 2, 128
#: The activation scale every quantized linear is written with: global scale 2688 / 16 = 168, so an
#: activation block amax up to 16 keeps its e4m3 scale below 448.
INPUT_AMAX = 16.0

COMMON = {
    "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
    "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}
ARCHITECTURES = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "intermediate_size": INTERMEDIATE,
              "rope_theta": 500000.0},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "intermediate_size": INTERMEDIATE,
              "rope_theta": 1000000.0},
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "intermediate_size": INTERMEDIATE, "rope_theta": 1000000.0, "num_experts": EXPERTS,
                  "num_experts_per_tok": TOP_K, "moe_intermediate_size": MOE_INTERMEDIATE, "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                    "num_key_value_heads": HEADS, "intermediate_size": INTERMEDIATE,
                    "moe_intermediate_size": MOE_INTERMEDIATE, "q_lora_rank": 128, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
                    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
                    "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                    "rope_theta": 10000.0, "rope_scaling": None},
    "glm4_moe": {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "intermediate_size": INTERMEDIATE,
                 "moe_intermediate_size": MOE_INTERMEDIATE, "n_routed_experts": 16, "n_shared_experts": 1,
                 "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                 "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "partial_rotary_factor": 0.5,
                 "attention_bias": True, "use_qk_norm": True, "rope_theta": 1000000.0},
}
#: How each architecture's checkpoint carries its quantization config (both of SGLang's forms are covered).
FLAT_CONFIG = {"llama": False, "qwen3": True, "qwen3_moe": False, "deepseek_v3": False, "glm4_moe": True}
#: Architectures whose layer 0 is dense and the rest MoE with a shared expert (DeepSeek's layout).
SHARED_EXPERT_MOE = ("deepseek_v3", "glm4_moe")

def quantize_weight(weight: torch.Tensor, weight_scale_2: torch.Tensor) -> dict:
    """``weight`` / ``weight_scale`` of an ``[N, K]`` bf16 weight, for a given per-tensor ``weight_scale_2``."""
    packed, scale_bytes = reference.quantize(weight, (1.0 / weight_scale_2).reshape(1), 16, False)
    return {"weight": packed, "weight_scale": scale_bytes.view(torch.float8_e4m3fn)}


def _linear(generator, rows, columns):
    return (torch.randn(rows, columns, generator=generator) / columns ** 0.5).to(torch.bfloat16)


def _norm(size):
    return torch.ones(size, dtype=torch.bfloat16)


def _mlp(generator, parent, intermediate):
    return [(parent, {"gate_proj": _linear(generator, intermediate, HIDDEN),
                      "up_proj": _linear(generator, intermediate, HIDDEN)}),
            (parent, {"down_proj": _linear(generator, HIDDEN, intermediate)})]


def _mla_attention(generator, prefix, config):
    """DeepSeek's MLA projections, bf16 (excluded from quantization)."""
    heads, q_lora, kv_lora = HEADS, config["q_lora_rank"], config["kv_lora_rank"]
    nope, rope, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    return {
        f"{prefix}.q_a_proj.weight": _linear(generator, q_lora, HIDDEN),
        f"{prefix}.q_a_layernorm.weight": _norm(q_lora),
        f"{prefix}.q_b_proj.weight": _linear(generator, heads * (nope + rope), q_lora),
        f"{prefix}.kv_a_proj_with_mqa.weight": _linear(generator, kv_lora + rope, HIDDEN),
        f"{prefix}.kv_a_layernorm.weight": _norm(kv_lora),
        f"{prefix}.kv_b_proj.weight": _linear(generator, heads * (nope + v), kv_lora),
        f"{prefix}.o_proj.weight": _linear(generator, HIDDEN, heads * v),
    }


def bf16_model(architecture: str, seed: int = 0, decisive: bool = False):
    """(the bf16 tensors that stay bf16, the bf16 weights of the quantized linears grouped as SGLang fuses
    them: ``[(prefix, {name: weight})]``), from one seeded generator (``decisive``: module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    config = {**COMMON, **ARCHITECTURES[architecture]}
    plain = {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=generator).to(torch.bfloat16),
        "model.norm.weight": _norm(HIDDEN),
        "lm_head.weight": _linear(generator, VOCAB, HIDDEN),
    }
    groups = []
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        plain[f"{prefix}.input_layernorm.weight"] = _norm(HIDDEN)
        plain[f"{prefix}.post_attention_layernorm.weight"] = _norm(HIDDEN)
        if architecture == "deepseek_v3":
            plain.update(_mla_attention(generator, f"{prefix}.self_attn", config))
        else:
            groups.append((f"{prefix}.self_attn", {"q_proj": _linear(generator, HEADS * HEAD_DIM, HIDDEN),
                                                   "k_proj": _linear(generator, KV_HEADS * HEAD_DIM, HIDDEN),
                                                   "v_proj": _linear(generator, KV_HEADS * HEAD_DIM, HIDDEN)}))
            groups.append((f"{prefix}.self_attn", {"o_proj": _linear(generator, HIDDEN, HEADS * HEAD_DIM)}))
        if architecture in ("qwen3", "qwen3_moe") or config.get("use_qk_norm"):
            plain[f"{prefix}.self_attn.q_norm.weight"] = _norm(HEAD_DIM)
            plain[f"{prefix}.self_attn.k_norm.weight"] = _norm(HEAD_DIM)
        if config.get("attention_bias"):
            for name, rows in (("q_proj", HEADS * HEAD_DIM), ("k_proj", KV_HEADS * HEAD_DIM),
                               ("v_proj", KV_HEADS * HEAD_DIM)):
                plain[f"{prefix}.self_attn.{name}.bias"] = (torch.randn(rows, generator=generator) * 0.02).to(
                    torch.bfloat16)
        if architecture == "qwen3_moe":
            plain[f"{prefix}.mlp.gate.weight"] = _linear(generator, EXPERTS, HIDDEN)
            for expert in range(EXPERTS):
                groups += _mlp(generator, f"{prefix}.mlp.experts.{expert}", MOE_INTERMEDIATE)
        elif architecture in SHARED_EXPERT_MOE and layer >= config["first_k_dense_replace"]:
            experts = config["n_routed_experts"]
            plain[f"{prefix}.mlp.gate.weight"] = _linear(generator, experts, HIDDEN)
            plain[f"{prefix}.mlp.gate.e_score_correction_bias"] = torch.randn(experts, generator=generator) * 0.01
            for expert in range(experts):
                groups += _mlp(generator, f"{prefix}.mlp.experts.{expert}", MOE_INTERMEDIATE)
            groups += _mlp(generator, f"{prefix}.mlp.shared_experts", MOE_INTERMEDIATE * config["n_shared_experts"])
        else:
            groups += _mlp(generator, f"{prefix}.mlp", INTERMEDIATE)
    if decisive:
        plain["lm_head.weight"] = decisive_lm_head(plain["model.embed_tokens.weight"], generator)
    return plain, groups


def successors(generator) -> torch.Tensor:
    """The token each token leads to under a decisive ``lm_head``: a random permutation of the vocabulary."""
    return torch.randperm(VOCAB, generator=generator)


def decisive_lm_head(embeddings: torch.Tensor, generator) -> torch.Tensor:
    """``lm_head`` whose row ``successor[i]`` is token ``i``'s embedding (the successors drawn from ``generator``)."""
    head = torch.empty_like(embeddings)
    head[successors(generator)] = embeddings
    return head


def model_tensors(architecture: str, seed: int = 0, decisive: bool = False) -> dict:
    """Every tensor of the checkpoint: fused groups share one weight_scale_2 and one input_scale (SGLang
    keeps the max of each over the group)."""
    plain, groups = bf16_model(architecture, seed, decisive)
    tensors = dict(plain)
    input_scale = torch.tensor(INPUT_AMAX / (6 * 448), dtype=torch.float32)
    for prefix, weights in groups:
        weight_scale_2 = (max(w.float().abs().max() for w in weights.values()) / (6 * 448)).reshape(())
        for name, weight in weights.items():
            for key, value in quantize_weight(weight, weight_scale_2).items():
                tensors[f"{prefix}.{name}.{key}"] = value
            tensors[f"{prefix}.{name}.weight_scale_2"] = weight_scale_2.clone()
            tensors[f"{prefix}.{name}.input_scale"] = input_scale.clone()
    return tensors


def exclude_modules(architecture: str) -> list:
    moe = architecture == "qwen3_moe" or architecture in SHARED_EXPERT_MOE
    return (["lm_head"] + (["model.layers.*.mlp.gate"] if moe else [])
            + (["model.layers.*.self_attn*"] if architecture == "deepseek_v3" else []))


def bf16_tensors(architecture: str, seed: int = 0, decisive: bool = False) -> dict:
    """The same model unquantized: what the NVFP4 checkpoint's linears were quantized from."""
    plain, groups = bf16_model(architecture, seed, decisive)
    return {**plain, **{f"{prefix}.{name}.weight": weight for prefix, weights in groups
                        for name, weight in weights.items()}}


def write_checkpoint(architecture: str, directory: Path, seed: int = 0, bf16: bool = False,
                     decisive: bool = False) -> Path:
    """Write ``config.json``, the quantization config and ``model.safetensors`` for one architecture
    (``bf16``: the unquantized model, no quantization config; ``decisive``: no near ties, module docstring)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**COMMON, **ARCHITECTURES[architecture]}
    if bf16:
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        tensors = {name: tensor.contiguous() for name, tensor in bf16_tensors(architecture, seed, decisive).items()}
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    if FLAT_CONFIG[architecture]:
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                         "ignore": exclude_modules(architecture)}
    else:
        (directory / "hf_quant_config.json").write_text(json.dumps({
            "producer": {"name": "modelopt", "version": "0.35.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": exclude_modules(architecture)}}, indent=2))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {name: tensor.contiguous() for name, tensor in model_tensors(architecture, seed, decisive).items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
