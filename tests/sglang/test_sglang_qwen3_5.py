"""Where today's SGLang still needs the shim: Qwen3.5 NVFP4's dense MLP under ``tc_piecewise`` (0.5.19-0.5.21).

With ``--cuda-graph-backend-prefill tc_piecewise`` (opt-in in 0.5.15-0.5.21) SGLang compiles the model
forward with ``fullgraph=True``. In 0.5.19-0.5.21 ``qwen3_5.py``'s ``_maybe_enable_silu_fp4_quant_fusion``
switches the NVFP4 dense MLP (``Qwen2MoeMLP``) to a fused path whose ``_silu_fp4_quant_fused`` imports
``flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize`` at call time and calls it raw, not through one
of SGLang's ops. Those three functions run here verbatim (``tests/data/sglang_sources/<release>/sglang/srt/
models/qwen3_5_mlp_excerpt.py``, copied from each wheel by ``tests/support/sglang_facts.py``), compiled with
``fullgraph=True`` on fake CUDA tensors. Stand-ins, because SGLang's model package does not import
without a GPU stack:

* the MLP's two linear layers: ``gate_up_proj`` a bf16 matmul returning ``(output, None)`` as SGLang's
  linear layers do; ``down_proj`` returns the prequantized ``(fp4, scale)`` pair it is handed (SGLang's NVFP4
  linear would feed it to its own ``sglang::fp4_gemm`` op, which Dynamo does not enter), so the test sees
  what the fused path produced;
* ``ModelOptFp4LinearMethod`` (what the enabling function checks for), with ``quant_mode = "w4a4"``;
* without the shim, FlashInfer's capability lookup answers SM100 (10, 0), as an SM100 GPU would, so that
  FlashInfer's function reaches its JIT-module path as it does there.
"""

from __future__ import annotations

import logging
import os
import sys
import types

import flashinfer
import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_dynamo_shim

import sglang_facts

HIDDEN, INTERMEDIATE, TOKENS = 256, 512, 128
MODELOPT = "sglang.srt.layers.quantization.modelopt_quant"


class ModelOptFp4LinearMethod:
    """Stand-in for SGLang's NVFP4 linear method (the enabling function checks its type and quant_mode)."""

    quant_mode = "w4a4"


class GateUpProj(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant_method = ModelOptFp4LinearMethod()
        self.weight = nn.Parameter(torch.randn(2 * INTERMEDIATE, HIDDEN, dtype=torch.bfloat16) * 0.05,
                                   requires_grad=False)

    def forward(self, x):
        return x @ self.weight.t(), None


class DownProj(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant_method = ModelOptFp4LinearMethod()
        self.register_buffer("input_scale_inv", torch.tensor(448.0 * 6.0 / 16.0))

    def forward(self, prequantized):
        return prequantized, None


def sglang_mlp(version):
    """A Qwen2MoeMLP carrying SGLang ``version``'s own forward and fused path, enabled by its own function."""
    path = sglang_facts.SOURCES / version / sglang_facts.MLP_EXCERPT
    namespace = {"torch": torch, "nn": nn, "os": os, "logger": logging.getLogger("sglang.srt.models.qwen3_5")}
    exec(compile(path.read_text(), str(path), "exec"), namespace)

    class Qwen2MoeMLP(nn.Module):
        _silu_fp4_quant_fused = namespace["_silu_fp4_quant_fused"]
        forward = namespace["forward"]

        def __init__(self):
            super().__init__()
            self.gate_up_proj, self.down_proj = GateUpProj(), DownProj()
            self._enable_silu_fp4_quant_fusion = False  # as Qwen2MoeMLP.__init__ sets them
            self._masked_m_cache = {}
            self._down_input_scale_inv_1d = None

    mlp = Qwen2MoeMLP()
    namespace["_maybe_enable_silu_fp4_quant_fusion"](mlp)
    return mlp


@pytest.fixture
def modelopt_stand_in(monkeypatch):
    module = types.ModuleType(MODELOPT)
    module.ModelOptFp4LinearMethod = ModelOptFp4LinearMethod
    monkeypatch.setitem(sys.modules, MODELOPT, module)


def compiled_on_fake_cuda(version):
    """SGLang's MLP built and compiled with fullgraph=True on fake CUDA tensors; its output, or the error."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device("cuda"):
            mlp = sglang_mlp(version)
            x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
        assert mlp._enable_silu_fp4_quant_fusion, "SGLang's enabling function did not switch the fused path on"
        return torch.compile(mlp, fullgraph=True, backend="eager")(x)


@pytest.mark.filterwarnings("ignore::UserWarning")  # Dynamo's notes while it traces into FlashInfer's JIT loader
@pytest.mark.parametrize("version", sglang_facts.MLP_RELEASES)
def test_without_the_shim_sglangs_qwen3_5_mlp_fails_under_fullgraph_on_flashinfers_jit_path(
        version, modelopt_stand_in, unpatched, monkeypatch):
    monkeypatch.setattr(sys.modules["flashinfer.activation"], "get_compute_capability", lambda device: (10, 0))
    with pytest.raises(torch._dynamo.exc.Unsupported, match="_thread.allocate_lock"):
        compiled_on_fake_cuda(version)


@pytest.mark.parametrize("version", sglang_facts.MLP_RELEASES)
def test_with_the_shim_sglangs_qwen3_5_mlp_traces_and_hands_down_proj_its_nvfp4_layout(version, modelopt_stand_in):
    assert fp4_dynamo_shim.status()["family"]["silu_and_mul_scaled_nvfp4_experts_quantize"].startswith("op-backed")
    packed, scales = compiled_on_fake_cuda(version)
    # What fp4_gemm takes for an [M, I] activation: [M, I/2] codes and the 128x4-swizzled [128, I/16] scales.
    assert (tuple(packed.shape), packed.dtype, packed.device.type) == ((TOKENS, INTERMEDIATE // 2), torch.uint8, "cuda")
    assert (tuple(scales.shape), scales.dtype) == ((TOKENS, INTERMEDIATE // 16), torch.uint8)


@pytest.mark.parametrize("version", sglang_facts.MLP_RELEASES)
def test_with_the_shim_the_fused_path_runs_eagerly_on_cpu_and_traces_in_one_graph(version, modelopt_stand_in):
    """The same module on real CPU tensors (the shim's reference quantizer): eager and compiled agree."""
    torch.manual_seed(0)
    mlp = sglang_mlp(version)
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    eager = mlp(x)
    explanation = torch._dynamo.explain(mlp)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    compiled = torch.compile(mlp, fullgraph=True, backend="eager")(x)
    assert all(torch.equal(c, e) for c, e in zip(compiled, eager))
    assert flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize.__fp4_dynamo_shim__
