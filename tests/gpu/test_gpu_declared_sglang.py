"""SGLang's NSA indexer LayerNorm through SGLang's own compile path, with the shim's default gate.

The indexer's ``k_norm = LayerNorm(head_dim, dtype=torch.float32)`` (sglang 0.5.9-0.5.12) calls the
module-level ``flashinfer.norm.layernorm`` that ``sglang.srt.layers.layernorm`` bound at import, on bf16 keys.
Stand-in: SGLang's compile path imports only ``weak_ref_tensor`` from sgl_kernel here
(tests/gpu/stand_ins, as in test_gpu_sglang.py). The indexer's other, SGLang-side blockers are out of scope.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.verify import sglang
from _fp4_dynamo_shim.sglang import sglang_releases


release = sglang_releases.release_for(sglang_releases.installed_version())


class _IndexerKeyNorm(torch.nn.Module):
    """The NSA indexer's ``k_norm = LayerNorm(self.head_dim, dtype=torch.float32)`` applied to bf16 keys, with
    SGLang's own LayerNorm (its forward_cuda calls the module-level ``flashinfer.norm.layernorm``)."""

    def __init__(self, head_dim: int):
        super().__init__()
        try:
            layernorm = importlib.import_module("sglang.srt.layers.layernorm")
        except Exception as error:  # record exactly which import this machine cannot satisfy
            pytest.skip(f"sglang.srt.layers.layernorm does not import here: {error!r}")
        if not getattr(layernorm, "_flashinfer_layernorm_available", False):
            pytest.skip("SGLang's layernorm module did not bind flashinfer.norm.layernorm here")
        self.k_norm = layernorm.LayerNorm(head_dim, dtype=torch.float32).cuda()

    def forward(self, x):
        return (self.k_norm(x),)


@pytest.mark.skipif(release is None or not release.compile_path_check,
                    reason="needs an SGLang whose compile path the shim drives (0.5.3.post2-0.5.9)")
def test_nsa_indexer_layernorm_traces_and_replays_through_sglangs_compile_path():
    """Default gate: the layer is on for flashinfer.norm.layernorm without any setting."""
    assert fp4_dynamo_shim.status()["flashinfer_ops"]["gate"] == switches.VARIABLES[switches.FLASHINFER_OPS].default
    block = _IndexerKeyNorm(128)
    outcome = sglang.compile_path_check(capture_sizes=(2, 4, 8), hidden=128, compare_values=True, block=block)
    assert outcome["cuda_graphs_captured"] >= 3 and outcome["replays_equal_eager"] is True, outcome


@pytest.mark.skipif(release is None or not release.compile_path_check,
                    reason="needs an SGLang whose compile path the shim drives (0.5.3.post2-0.5.9)")
def test_nsa_indexer_layernorm_fails_sglangs_compile_path_with_the_layer_off(monkeypatch):
    monkeypatch.setenv("FP4_DYNAMO_SHIM_FLASHINFER_OPS", "off")
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    assert fp4_dynamo_shim.apply()
    try:
        with pytest.raises(Exception):
            sglang.compile_path_check(capture_sizes=(2,), hidden=128, compare_values=False, block=_IndexerKeyNorm(128))
    finally:
        monkeypatch.delenv("FP4_DYNAMO_SHIM_FLASHINFER_OPS")
        fp4_dynamo_shim.revert()
        torch._dynamo.reset()
        assert fp4_dynamo_shim.apply()
