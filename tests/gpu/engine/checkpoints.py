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

Weights are random bf16 quantized with the project's reference quantizer (global scale
``1 / weight_scale_2``, ``weight_scale_2 = amax / (6 * 448)``), so they dequantize to sensible values.
All dimensions are multiples of 128 where SGLang pads or its MoE kernels need it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from fp4_dynamo_shim import reference

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
}
#: How each architecture's checkpoint carries its quantization config (both of SGLang's forms are covered).
FLAT_CONFIG = {"llama": False, "qwen3": True, "qwen3_moe": False}

_DTYPES = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32", torch.bfloat16: "BF16"}


def save_safetensors(tensors: dict, path: Path) -> None:
    """The safetensors format (8-byte little-endian header length, JSON header, raw little-endian data)."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)) + encoded)
        for blob in blobs:
            stream.write(blob)


def load_safetensors(path: Path) -> dict:
    """Read back what :func:`save_safetensors` wrote (for the CPU test of the format)."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    header.pop("__metadata__", None)
    dtypes = {v: k for k, v in _DTYPES.items()}
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        data = bytearray(raw[8 + length + begin: 8 + length + end])
        flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        tensors[name] = flat.view(dtypes[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def quantize_weight(weight: torch.Tensor, weight_scale_2: torch.Tensor) -> dict:
    """``weight`` / ``weight_scale`` of an ``[N, K]`` bf16 weight, for a given per-tensor ``weight_scale_2``."""
    packed, scale_bytes = reference.quantize(weight, (1.0 / weight_scale_2).reshape(1), 16, False)
    return {"weight": packed, "weight_scale": scale_bytes.view(torch.float8_e4m3fn)}


def _linear(generator, rows, columns):
    return (torch.randn(rows, columns, generator=generator) / columns ** 0.5).to(torch.bfloat16)


def bf16_model(architecture: str, seed: int = 0):
    """(the bf16 tensors that stay bf16, the bf16 weights of the quantized linears grouped as SGLang fuses
    them: ``[(prefix, {name: weight})]``), from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    plain = {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=generator).to(torch.bfloat16),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": _linear(generator, VOCAB, HIDDEN),
    }
    groups = []
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        plain[f"{prefix}.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        plain[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        groups.append((f"{prefix}.self_attn", {"q_proj": _linear(generator, HEADS * HEAD_DIM, HIDDEN),
                                               "k_proj": _linear(generator, KV_HEADS * HEAD_DIM, HIDDEN),
                                               "v_proj": _linear(generator, KV_HEADS * HEAD_DIM, HIDDEN)}))
        groups.append((f"{prefix}.self_attn", {"o_proj": _linear(generator, HIDDEN, HEADS * HEAD_DIM)}))
        if architecture != "llama":
            plain[f"{prefix}.self_attn.q_norm.weight"] = torch.ones(HEAD_DIM, dtype=torch.bfloat16)
            plain[f"{prefix}.self_attn.k_norm.weight"] = torch.ones(HEAD_DIM, dtype=torch.bfloat16)
        if architecture == "qwen3_moe":
            plain[f"{prefix}.mlp.gate.weight"] = _linear(generator, EXPERTS, HIDDEN)
            experts = [f"{prefix}.mlp.experts.{expert}" for expert in range(EXPERTS)]
            for parent in experts:
                groups.append((parent, {"gate_proj": _linear(generator, MOE_INTERMEDIATE, HIDDEN),
                                        "up_proj": _linear(generator, MOE_INTERMEDIATE, HIDDEN)}))
                groups.append((parent, {"down_proj": _linear(generator, HIDDEN, MOE_INTERMEDIATE)}))
        else:
            groups.append((f"{prefix}.mlp", {"gate_proj": _linear(generator, INTERMEDIATE, HIDDEN),
                                             "up_proj": _linear(generator, INTERMEDIATE, HIDDEN)}))
            groups.append((f"{prefix}.mlp", {"down_proj": _linear(generator, HIDDEN, INTERMEDIATE)}))
    return plain, groups


def model_tensors(architecture: str, seed: int = 0) -> dict:
    """Every tensor of the checkpoint: fused groups share one weight_scale_2 and one input_scale (SGLang
    keeps the max of each over the group)."""
    plain, groups = bf16_model(architecture, seed)
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
    return ["lm_head"] + (["model.layers.*.mlp.gate"] if architecture == "qwen3_moe" else [])


def write_checkpoint(architecture: str, directory: Path, seed: int = 0) -> Path:
    """Write ``config.json``, the quantization config and ``model.safetensors`` for one architecture."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**COMMON, **ARCHITECTURES[architecture]}
    if FLAT_CONFIG[architecture]:
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                         "ignore": exclude_modules(architecture)}
    else:
        (directory / "hf_quant_config.json").write_text(json.dumps({
            "producer": {"name": "modelopt", "version": "0.35.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": exclude_modules(architecture)}}, indent=2))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_safetensors(model_tensors(architecture, seed), directory / "model.safetensors")
    return directory
