"""The tiny NVFP4 checkpoints the engine test writes: names, shapes and dtypes as SGLang 0.5.11's ModelOpt
loader reads them (listed here from its source, independently of the writer), read back with the real
safetensors library, and weights that dequantize to what was quantized."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu" / "engine"))
import checkpoints  # noqa: E402
from fp4_dynamo_shim import reference  # noqa: E402

U8, F8, F32, BF16 = torch.uint8, torch.float8_e4m3fn, torch.float32, torch.bfloat16


def expected_layer(architecture):
    """name suffix -> (dtype, shape) for layer 0, from modelopt_quant.py's create_weights and the model code."""
    h, q, kv, i, e, mi = 256, 4 * 64, 2 * 64, 512, 8, 128
    linears = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
               "self_attn.o_proj": (h, q)}
    if architecture == "qwen3_moe":
        for expert in range(e):
            linears.update({f"mlp.experts.{expert}.gate_proj": (mi, h), f"mlp.experts.{expert}.up_proj": (mi, h),
                            f"mlp.experts.{expert}.down_proj": (h, mi)})
    else:
        linears.update({"mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)})
    layer = {"input_layernorm.weight": (BF16, (h,)), "post_attention_layernorm.weight": (BF16, (h,))}
    for name, (n, k) in linears.items():
        layer.update({f"{name}.weight": (U8, (n, k // 2)), f"{name}.weight_scale": (F8, (n, k // 16)),
                      f"{name}.weight_scale_2": (F32, ()), f"{name}.input_scale": (F32, ())})
    if architecture != "llama":
        layer.update({"self_attn.q_norm.weight": (BF16, (64,)), "self_attn.k_norm.weight": (BF16, (64,))})
    if architecture == "qwen3_moe":
        layer["mlp.gate.weight"] = (BF16, (e, h))
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
        expected.update({f"model.layers.{layer}.{k}": v for k, v in expected_layer(architecture).items()})
    assert {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()} == expected


def test_the_quantization_config_is_in_the_form_sglang_parses(written):
    architecture, directory, _ = written
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                        "qwen3_moe": "Qwen3MoeForCausalLM"}[architecture]]
    if "quantization_config" in config:  # flat form: the exclude key is "ignore"
        quantization = config["quantization_config"]
        assert quantization["quant_method"] == "modelopt" and "lm_head" in quantization["ignore"]
        assert not (directory / "hf_quant_config.json").exists()
    else:  # nested form: "exclude_modules"
        quantization = json.loads((directory / "hf_quant_config.json").read_text())["quantization"]
        assert "lm_head" in quantization["exclude_modules"]
    assert (quantization["quant_algo"], quantization["group_size"]) == ("NVFP4", 16)


def test_fused_linears_share_their_per_tensor_scales(written):
    architecture, _, tensors = written
    groups = [("self_attn", ("q_proj", "k_proj", "v_proj"))]
    groups += [("mlp.experts.3", ("gate_proj", "up_proj"))] if architecture == "qwen3_moe" else [
        ("mlp", ("gate_proj", "up_proj"))]
    for parent, members in groups:
        for scale in ("weight_scale_2", "input_scale"):
            values = {tensors[f"model.layers.1.{parent}.{m}.{scale}"].item() for m in members}
            assert len(values) == 1, (parent, scale, values)


def test_weights_dequantize_to_what_was_quantized(written):
    architecture, _, tensors = written
    original = checkpoints.bf16_model(architecture)[1][0][1]["q_proj"]
    packed, scale = tensors["model.layers.0.self_attn.q_proj.weight"], tensors["model.layers.0.self_attn.q_proj.weight_scale"]
    weight_scale_2 = tensors["model.layers.0.self_attn.q_proj.weight_scale_2"]
    # ModelOpt's convention: W = e2m1 * weight_scale * weight_scale_2; even element in the low nibble.
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(packed.shape[0], -1)
    values = reference.e2m1_to_float(codes).view(packed.shape[0], -1, 16) * scale.float().unsqueeze(-1)
    restored = values.view(packed.shape[0], -1) * weight_scale_2
    blocks = original.float().view(original.shape[0], -1, 16)
    error = (restored.view_as(blocks) - blocks).abs()
    assert (error <= blocks.abs().amax(-1, keepdim=True) / 6 + blocks.abs().amax(-1, keepdim=True) / 16).all()
    assert torch.corrcoef(torch.stack([restored.flatten(), original.float().flatten()]))[0, 1] > 0.98


def test_the_projects_writer_and_reader_agree_with_safetensors(tmp_path):
    tensors = {"a": torch.arange(6, dtype=torch.uint8).view(2, 3), "b": torch.tensor(0.25), "c": torch.ones(3).to(BF16),
               "d": torch.tensor([1.0, -2.0]).to(F8)}
    checkpoints.save_safetensors(tensors, tmp_path / "t.safetensors")
    for loaded in (load_file(str(tmp_path / "t.safetensors")), checkpoints.load_safetensors(tmp_path / "t.safetensors")):
        assert loaded.keys() == tensors.keys()
        assert all(torch.equal(loaded[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
                   and loaded[k].shape == v.shape and loaded[k].dtype == v.dtype for k, v in tensors.items())
