"""The tiny NVFP4 checkpoints the engine test writes: names, shapes and dtypes as SGLang 0.5.11's ModelOpt
loader reads them (listed here from its source, independently of the writer), read back with the
safetensors library that wrote them, and weights that dequantize to what was quantized."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "engine"))
import checkpoints  # noqa: E402
from _fp4_dynamo_shim.fp4 import arithmetic  # noqa: E402

U8, F8, F32, BF16 = torch.uint8, torch.float8_e4m3fn, torch.float32, torch.bfloat16


def _nvfp4(layer, name, n, k):
    layer.update({f"{name}.weight": (U8, (n, k // 2)), f"{name}.weight_scale": (F8, (n, k // 16)),
                  f"{name}.weight_scale_2": (F32, ()), f"{name}.input_scale": (F32, ())})


def expected_layer(architecture, index):
    """name suffix -> (dtype, shape) for layer ``index``, from modelopt_quant.py's create_weights and the model
    code (qwen3_moe.py, deepseek_v2.py + deepseek_common/deepseek_weight_loader.py, glm4_moe.py of 0.5.11)."""
    h, q, kv, i, mi = 256, 4 * 64, 2 * 64, 512, 128
    layer = {"input_layernorm.weight": (BF16, (h,)), "post_attention_layernorm.weight": (BF16, (h,))}
    if architecture == "deepseek_v3":  # MLA, bf16: kv_lora_rank 512, rope 64, nope 128, v 128, q_lora_rank 128
        layer.update({"self_attn.q_a_proj.weight": (BF16, (128, h)), "self_attn.q_a_layernorm.weight": (BF16, (128,)),
                      "self_attn.q_b_proj.weight": (BF16, (4 * (128 + 64), 128)),
                      "self_attn.kv_a_proj_with_mqa.weight": (BF16, (512 + 64, h)),
                      "self_attn.kv_a_layernorm.weight": (BF16, (512,)),
                      "self_attn.kv_b_proj.weight": (BF16, (4 * (128 + 128), 512)),
                      "self_attn.o_proj.weight": (BF16, (h, 4 * 128))})
    else:
        for name, (n, k) in {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}.items():
            _nvfp4(layer, f"self_attn.{name}", n, k)
    if architecture in ("qwen3", "qwen3_moe", "glm4_moe"):
        layer.update({"self_attn.q_norm.weight": (BF16, (64,)), "self_attn.k_norm.weight": (BF16, (64,))})
    if architecture == "glm4_moe":
        layer.update({"self_attn.q_proj.bias": (BF16, (q,)), "self_attn.k_proj.bias": (BF16, (kv,)),
                      "self_attn.v_proj.bias": (BF16, (kv,))})
    experts = {"qwen3_moe": 8, "deepseek_v3": 256, "glm4_moe": 16}.get(architecture)
    moe = experts is not None and (architecture == "qwen3_moe" or index >= 1)  # first_k_dense_replace = 1
    if not moe:
        for name, (n, k) in {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}.items():
            _nvfp4(layer, f"mlp.{name}", n, k)
        return layer
    layer["mlp.gate.weight"] = (BF16, (experts, h))
    parents = [f"mlp.experts.{expert}" for expert in range(experts)]
    if architecture != "qwen3_moe":
        layer["mlp.gate.e_score_correction_bias"] = (F32, (experts,))
        parents.append("mlp.shared_experts")  # n_shared_experts = 1, moe_intermediate_size wide
    for parent in parents:
        for name, (n, k) in {"gate_proj": (mi, h), "up_proj": (mi, h), "down_proj": (h, mi)}.items():
            _nvfp4(layer, f"{parent}.{name}", n, k)
    return layer


@pytest.fixture(scope="module", params=sorted(checkpoints.ARCHITECTURES))
def written(request, tmp_path_factory):
    directory = checkpoints.write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, directory, load_file(str(directory / "model.safetensors"))


def test_every_tensor_sglang_loads_is_there_with_its_dtype_and_shape(written):
    architecture, _, tensors = written
    expected = {"model.embed_tokens.weight": (BF16, (512, 256)), "model.norm.weight": (BF16, (256,)),
                "lm_head.weight": (BF16, (512, 256))}
    for layer in range(2):
        expected.update({f"model.layers.{layer}.{k}": v for k, v in expected_layer(architecture, layer).items()})
    assert {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()} == expected


def test_the_quantization_config_is_in_the_form_sglang_parses(written):
    architecture, directory, _ = written
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                        "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                                        "glm4_moe": "Glm4MoeForCausalLM"}[architecture]]
    if "quantization_config" in config:  # flat form: the exclude key is "ignore"
        quantization = config["quantization_config"]
        assert quantization["quant_method"] == "modelopt" and "lm_head" in quantization["ignore"]
        assert not (directory / "hf_quant_config.json").exists()
    else:  # nested form: "exclude_modules"
        quantization = json.loads((directory / "hf_quant_config.json").read_text())["quantization"]
        assert "lm_head" in quantization["exclude_modules"]
    assert (quantization["quant_algo"], quantization["group_size"]) == ("NVFP4", 16)
    excluded = quantization.get("ignore", quantization.get("exclude_modules"))
    if architecture == "deepseek_v3":  # the MLA projections stay bf16, as NVIDIA's DeepSeek NVFP4 checkpoints
        assert "model.layers.*.self_attn*" in excluded
    if architecture in ("qwen3_moe", "deepseek_v3", "glm4_moe"):
        assert "model.layers.*.mlp.gate" in excluded  # the router stays bf16


@pytest.mark.parametrize("written", ["deepseek_v3"], indirect=True)
def test_deepseek_v3_has_what_sglang_needs_to_fuse_its_shared_expert_and_group_its_top_k(written):
    """SGLang 0.5.11 fuses the shared expert into the MoE only for exactly 256 routed experts and 1 shared
    (deepseek_v2.py determine_num_fused_shared_experts); grouped top-k needs the experts to split into n_group."""
    _, directory, _ = written
    config = json.loads((directory / "config.json").read_text())
    assert (config["n_routed_experts"], config["n_shared_experts"]) == (256, 1)
    assert config["n_routed_experts"] % config["n_group"] == 0 and config["topk_group"] < config["n_group"]
    assert (config["topk_method"], config["kv_lora_rank"], config["qk_rope_head_dim"]) == ("noaux_tc", 512, 64)


def test_fused_linears_share_their_per_tensor_scales(written):
    architecture, _, tensors = written
    groups = [] if architecture == "deepseek_v3" else [(1, "self_attn", ("q_proj", "k_proj", "v_proj"))]
    if architecture == "qwen3_moe":
        groups.append((1, "mlp.experts.3", ("gate_proj", "up_proj")))
    elif architecture in ("deepseek_v3", "glm4_moe"):
        groups += [(0, "mlp", ("gate_proj", "up_proj")), (1, "mlp.experts.3", ("gate_proj", "up_proj")),
                   (1, "mlp.shared_experts", ("gate_proj", "up_proj"))]
    else:
        groups.append((1, "mlp", ("gate_proj", "up_proj")))
    for layer, parent, members in groups:
        for scale in ("weight_scale_2", "input_scale"):
            values = {tensors[f"model.layers.{layer}.{parent}.{m}.{scale}"].item() for m in members}
            assert len(values) == 1, (parent, scale, values)


def test_weights_dequantize_to_what_was_quantized(written):
    architecture, _, tensors = written
    prefix, weights = checkpoints.bf16_model(architecture)[1][0]  # the first quantized linear group
    name, original = next(iter(weights.items()))
    packed, scale = tensors[f"{prefix}.{name}.weight"], tensors[f"{prefix}.{name}.weight_scale"]
    weight_scale_2 = tensors[f"{prefix}.{name}.weight_scale_2"]
    # ModelOpt's convention: W = e2m1 * weight_scale * weight_scale_2; even element in the low nibble.
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(packed.shape[0], -1)
    values = arithmetic.e2m1_values(codes).view(packed.shape[0], -1, 16) * scale.float().unsqueeze(-1)
    restored = values.view(packed.shape[0], -1) * weight_scale_2
    blocks = original.float().view(original.shape[0], -1, 16)
    error = (restored.view_as(blocks) - blocks).abs()
    assert (error <= blocks.abs().amax(-1, keepdim=True) / 6 + blocks.abs().amax(-1, keepdim=True) / 16).all()
    assert torch.corrcoef(torch.stack([restored.flatten(), original.float().flatten()]))[0, 1] > 0.98


def _rms(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _rope(x, theta):
    half = x.shape[-1] // 2
    angles = torch.arange(x.shape[0])[:, None] * theta ** (-torch.arange(half) / half)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., half:] * cos + x[..., :half] * sin], -1)


def _last_logits(tensors, ids, theta):
    """The next token's logits of the bf16 Qwen3 model in float32: what SGLang computes, in plain torch (GQA,
    q/k norms, rotary embedding, SwiGLU), close enough to judge how far apart the best two tokens are."""
    h = checkpoints.HEAD_DIM
    x, rows = tensors["model.embed_tokens.weight"][ids], len(ids)
    for layer in range(checkpoints.LAYERS):
        w = {name[len(f"model.layers.{layer}."):]: t for name, t in tensors.items()
             if name.startswith(f"model.layers.{layer}.")}
        y = _rms(x, w["input_layernorm.weight"])
        q, k, v = (y @ w[f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q = _rope(_rms(q.view(rows, -1, h), w["self_attn.q_norm.weight"]), theta)
        k = _rope(_rms(k.view(rows, -1, h), w["self_attn.k_norm.weight"]), theta)
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v.view(rows, -1, h)))
        scores = torch.einsum("qhd,khd->hqk", q, k) / h ** 0.5
        scores = scores.masked_fill(torch.ones(rows, rows, dtype=torch.bool).triu(1), float("-inf"))
        x = x + torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(rows, -1) @ w["self_attn.o_proj.weight"].T
        y = _rms(x, w["post_attention_layernorm.weight"])
        x = x + (torch.nn.functional.silu(y @ w["mlp.gate_proj.weight"].T) * (y @ w["mlp.up_proj.weight"].T)) @ w[
            "mlp.down_proj.weight"].T
    return _rms(x[-1], tensors["model.norm.weight"]) @ tensors["lm_head.weight"].T


def test_a_decisive_checkpoint_has_no_near_tie_for_greedy_decoding_to_flip():
    """Greedy ids are compared between SGLang runs with and without the shim (tools/gpu/graph_breaks.py): with
    random weights the best two tokens are often within float error of each other, so the order of float operations
    decides; a decisive checkpoint keeps the greedy token ahead by a wide margin at every step."""
    tensors = {name: t.float() for name, t in checkpoints.bf16_tensors("qwen3", decisive=True).items()}
    margins = []
    for prompt in range(2):
        ids = torch.randint(3, checkpoints.VOCAB, (8,), generator=torch.Generator().manual_seed(prompt))
        for _ in range(16):
            logits = _last_logits(tensors, ids, checkpoints.ARCHITECTURES["qwen3"]["rope_theta"])
            best = logits.topk(2).values
            margins.append(float(best[0] - best[1]))
            ids = torch.cat([ids, logits.argmax().view(1)])
    assert min(margins) > 50, margins
