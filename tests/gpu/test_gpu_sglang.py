"""SGLang's own compile path on the GPU: install_torch_compiled + SGLangBackend (0.5.3.post2-0.5.13).

Stand-in: sgl_kernel's large binary wheel cannot travel to the GPU machine; SGLang's compile path
imports only `weak_ref_tensor` from it on CUDA, so tests/gpu/stand_ins/sgl_kernel provides that one
function (put tests/gpu/stand_ins on PYTHONPATH when the real sgl_kernel is absent).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import fp4_dynamo_shim
from fp4_dynamo_shim import patching, sglang, sglang_releases
from gpu_support import has_fp4_kernel

release = sglang_releases.release_for(sglang_releases.installed_version())
pytestmark = pytest.mark.skipif(release is None or not release.compile_path_check,
                                reason="needs an SGLang with install_torch_compiled (0.5.3.post2-0.5.13)")


def test_unpatched_fails_in_sglangs_compile_path_with_the_allocate_lock_error(launch_mode):
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    try:
        with pytest.raises(torch._dynamo.exc.Unsupported, match="_thread.allocate_lock"):
            sglang.compile_path_check(compare_values=False)
    finally:
        torch._dynamo.reset()
        assert fp4_dynamo_shim.apply()


def test_with_the_shim_sglang_traces_captures_and_replays_the_real_kernel_launch(launch_mode):
    outcome = sglang.compile_path_check(compare_values=has_fp4_kernel())
    assert outcome["cuda_graphs_captured"] >= 3  # one graph per capture size at least: SGLang captured them
    assert outcome["replays_equal_eager"] is (True if has_fp4_kernel() else None)


def test_with_the_reference_fallback_sglang_replays_equal_eager(reference_mode):
    outcome = sglang.compile_path_check(compare_values=True)
    assert outcome["cuda_graphs_captured"] >= 3
    assert outcome["replays_equal_eager"] is True


BOUND_AT_IMPORT = """
import torch
from flashinfer import fp4_quantize  # bound at import, as SGLang's modelopt_quant binds it on SM12x


class Fp4Linear(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16) * 0.05,
                                         requires_grad=False)
        self.register_buffer("input_scale_inv", torch.tensor([448.0 * 6.0 / 8.0], device="cuda"))

    def forward(self, x: torch.Tensor):
        x_fp4, x_scale = fp4_quantize(x, self.input_scale_inv)
        return x_fp4, x_scale, x @ self.weight  # a bf16 GEMM stands in for the FP4 GEMM SM90 cannot run
"""


def test_module_global_bound_before_the_shim_fails_unpatched_and_passes_rebound(launch_mode, tmp_path, monkeypatch):
    """The binding pattern of SGLang's ModelOptFp4LinearMethod (module-level `from flashinfer import
    fp4_quantize`) through SGLang's compile path, with a small model (see the modelopt test below)."""
    (tmp_path / "bound_at_import.py").write_text(BOUND_AT_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    module = importlib.import_module("bound_at_import")
    try:
        with pytest.raises(torch._dynamo.exc.Unsupported, match="_thread.allocate_lock"):
            sglang.compile_path_check(compare_values=False, block=module.Fp4Linear(256))
    finally:
        torch._dynamo.reset()
        assert fp4_dynamo_shim.apply()
    assert getattr(module.fp4_quantize, "__fp4_dynamo_shim__", False)  # rebound by identity
    outcome = sglang.compile_path_check(compare_values=False, block=module.Fp4Linear(256))
    assert outcome["cuda_graphs_captured"] >= 3


def test_modelopt_fp4_linear_apply_traces_with_fp4_quantize_bound_as_on_sm12x(launch_mode, monkeypatch):
    """SGLang's ModelOptFp4LinearMethod.apply, with its module global bound to FlashInfer's function.

    On SM12x SGLang binds `fp4_quantize` to flashinfer's; on SM90 it would bind sgl_kernel's, so the
    test binds FlashInfer's original itself and lets the shim rebind it by identity. The FP4 GEMM cannot
    run on SM90: the FlashInfer GEMM that SGLang's fp4_gemm op calls is replaced by a stand-in that
    returns an empty output of the right shape (SGLang's own fake is used while tracing).
    """
    try:
        modelopt = importlib.import_module("sglang.srt.layers.quantization.modelopt_quant")
    except Exception as error:  # record exactly which import this machine cannot satisfy
        pytest.skip(f"sglang.srt.layers.quantization.modelopt_quant does not import here: {error!r}")
    original = patching.original_function()
    fp4_dynamo_shim.revert()
    monkeypatch.setattr(modelopt, "fp4_quantize", original, raising=False)
    assert fp4_dynamo_shim.apply()
    assert modelopt.fp4_quantize is not original and getattr(modelopt.fp4_quantize, "__fp4_dynamo_shim__", False)
    monkeypatch.setattr(modelopt, "flashinfer_fp4_gemm",
                        lambda a, b, a_sf, b_sf, alpha, dtype, **kw: a.new_empty((a.shape[0], b.shape[-1]), dtype=dtype),
                        raising=False)

    out_features, in_features = 256, 512
    layer = torch.nn.Module()
    layer.output_size_per_partition = out_features
    layer.weight = torch.nn.Parameter(torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device="cuda"),
                                      requires_grad=False)
    layer.weight_scale_interleaved = torch.nn.Parameter(
        torch.zeros(out_features, in_features // 16, device="cuda").to(torch.float8_e4m3fn), requires_grad=False)
    layer.input_scale_inv = torch.tensor([1.0], device="cuda")
    layer.alpha = torch.tensor([1.0], device="cuda")
    method = modelopt.ModelOptFp4LinearMethod.__new__(modelopt.ModelOptFp4LinearMethod)

    def forward(x):
        return method.apply(layer, x)

    x = torch.randn(8, in_features, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.mark_dynamic(x, 0)
    explanation = torch._dynamo.explain(forward)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    out = torch.compile(forward, fullgraph=True, backend="eager")(x)
    assert out.shape == (8, out_features)
