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
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.verify import sglang
from _fp4_dynamo_shim.sglang import sglang_releases

release = sglang_releases.release_for(sglang_releases.installed_version())
pytestmark = pytest.mark.skipif(release is None or not release.compile_path_check,
                                reason="needs an SGLang whose compile path verify drives (0.5.3.post2-0.5.9); "
                                       "0.5.11's real engine is tests/gpu/test_gpu_engine.py")


def test_unpatched_fails_in_sglangs_compile_path_with_the_allocate_lock_error(kernel_mode):
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    try:
        with pytest.raises(torch._dynamo.exc.Unsupported, match="_thread.allocate_lock"):
            sglang.compile_path_check(compare_values=False)
    finally:
        torch._dynamo.reset()
        assert fp4_dynamo_shim.apply()


def test_with_the_shim_sglang_traces_captures_and_replays(device_mode):
    outcome = sglang.compile_path_check(compare_values=device_mode.computes_values)
    device_mode.assert_branch()
    assert set(outcome) == {"capture_sizes", "replays_equal_eager", "cuda_graphs_captured"}, outcome
    assert outcome["capture_sizes"] == [2, 4, 8]  # verify's sglang-compile line prints these
    assert outcome["cuda_graphs_captured"] >= 3  # one graph per capture size at least: SGLang captured them
    assert outcome["replays_equal_eager"] is (True if device_mode.computes_values else None)


class _EagerDiffersOnItsFirstCall(torch.nn.Module):
    """Fault: the eager forward's first call (the comparison of the first capture size, 2) gives its rows in
    reverse order; every compiled call and every later eager call gives ``2 * x``. A compare that runs the
    compiled path for "eager", compares no values, keeps only the last size's count, uses the built-in block
    instead of this one, or replays inputs whose rows are all equal, reports no mismatch. ``forward`` has no
    annotation, so SGLang cannot infer the dynamic dimension: compile_path_check must name it."""

    def __init__(self):
        super().__init__()
        self.eager_calls = 0

    def forward(self, x):
        if torch.compiler.is_compiling():
            return (x * 2,)
        self.eager_calls += 1
        return ((x.flip(0) if self.eager_calls == 1 else x) * 2,)


def test_a_replay_that_differs_from_eager_for_one_capture_size_is_reported():
    outcome = sglang.compile_path_check(compare_values=True, block=_EagerDiffersOnItsFirstCall())
    assert outcome == {"capture_sizes": [2, 4, 8], "replays_equal_eager": False,
                       "cuda_graphs_captured": outcome["cuda_graphs_captured"]}, outcome
    assert outcome["cuda_graphs_captured"] >= 3


def test_verify_fails_its_sglang_line_when_replays_differ_from_eager(reference_mode, monkeypatch):
    # Fault: verify's check drives the block above (reference mode: the check compares values).
    compile_path_check = sglang.compile_path_check
    monkeypatch.setattr(sglang, "compile_path_check",
                        lambda **options: compile_path_check(block=_EagerDiffersOnItsFirstCall(), **options))
    with pytest.raises(AssertionError) as raised:
        sglang.check_sglang_compile_path("cuda")
    assert str(raised.value) == "replays through SGLang's piecewise CUDA graphs differ from eager"


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


def test_module_global_bound_before_the_shim_fails_unpatched_and_passes_rebound(device_mode, tmp_path, monkeypatch):
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
    with device_mode.recording():  # the shim was re-applied: count its new launchers
        outcome = sglang.compile_path_check(compare_values=device_mode.computes_values, block=module.Fp4Linear(256))
        device_mode.assert_branch()
    assert outcome["cuda_graphs_captured"] >= 3
    assert outcome["replays_equal_eager"] is (True if device_mode.computes_values else None)


def test_modelopt_fp4_linear_apply_traces_and_computes_with_fp4_quantize_bound_as_on_sm12x(reference_mode, monkeypatch):
    """SGLang's ModelOptFp4LinearMethod.apply, with its module global bound to FlashInfer's function.
    Reference branch only: the layer's FP4 GEMM (FlashInfer's mm_fp4) has no backend on SM90.

    On SM12x SGLang binds `fp4_quantize` to flashinfer's; on SM90 it would bind sgl_kernel's, so the test
    binds FlashInfer's original itself and lets the shim rebind it by identity. The FP4 GEMM (SGLang's
    fp4_gemm op calling FlashInfer's mm_fp4) and the quantizer run the shim's reference on this GPU
    (FP4_DYNAMO_SHIM_FALLBACK=reference): the layer computes real values, compared with the reference
    product of the same quantized operands on the CPU. With SGLang 0.5.9 the sgl_kernel stand-in
    (tests/gpu/stand_ins) answers the module's sgl_kernel imports; none of those kernels is called.
    """
    from _fp4_dynamo_shim.fp4 import layout
    from _fp4_dynamo_shim.fp4 import reference

    try:
        modelopt = importlib.import_module("sglang.srt.layers.quantization.modelopt_quant")
    except Exception as error:  # record exactly which import this machine cannot satisfy
        pytest.skip(f"sglang.srt.layers.quantization.modelopt_quant does not import here: {error!r}")
    original = lifecycle.original_function()
    fp4_dynamo_shim.revert()
    monkeypatch.setattr(modelopt, "fp4_quantize", original, raising=False)
    assert fp4_dynamo_shim.apply()
    assert modelopt.fp4_quantize is not original and getattr(modelopt.fp4_quantize, "__fp4_dynamo_shim__", False)
    assert getattr(modelopt.flashinfer_fp4_gemm, "__fp4_dynamo_shim__", False)

    out_features, in_features = 256, 512
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5).to(torch.bfloat16)
    weight_scale_2 = weight.float().abs().max() / (6 * 448)
    packed, scales = reference.quantize(weight, (1 / weight_scale_2).reshape(1), 16, False)
    input_scale = torch.tensor(8.0 / (6 * 448))
    layer = torch.nn.Module()
    layer.output_size_per_partition = out_features
    layer.weight = torch.nn.Parameter(packed.cuda(), requires_grad=False)
    swizzled = layout.swizzle(scales, False).view(out_features, in_features // 16)
    layer.weight_scale_interleaved = torch.nn.Parameter(swizzled.view(torch.float8_e4m3fn).cuda(), requires_grad=False)
    layer.input_scale_inv = (1 / input_scale).cuda()
    layer.alpha = (input_scale * weight_scale_2).to(torch.float32).cuda()
    method = modelopt.ModelOptFp4LinearMethod.__new__(modelopt.ModelOptFp4LinearMethod)

    def forward(x):
        return method.apply(layer, x)

    x = torch.randn(8, in_features, generator=generator).to(torch.bfloat16)
    gpu_x = x.cuda()
    torch._dynamo.mark_dynamic(gpu_x, 0)
    explanation = torch._dynamo.explain(forward)(gpu_x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    out = torch.compile(forward, fullgraph=True, backend="eager")(gpu_x)
    assert out.shape == (8, out_features) and out.dtype == torch.bfloat16
    x_packed, x_scales = reference.quantize(x, (1 / input_scale).reshape(1), 16, False)
    expected = reference.mm_fp4(x_packed, packed.t(), layout.swizzle(x_scales, False), swizzled.t(),
                                layer.alpha.cpu(), torch.float32, 16, False, True)
    assert torch.allclose(out.float().cpu(), expected, rtol=1e-2, atol=1e-2)
    assert torch.corrcoef(torch.stack([out.float().cpu().flatten(), (x.float() @ weight.float().t()).flatten()]))[0, 1] > 0.95
