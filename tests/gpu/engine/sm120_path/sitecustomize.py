"""Test-only start-up module for the SGLang engine test: SGLang's FlashInfer NVFP4 path on an H200 (SM90).

SGLang 0.5.11 takes it on SM12x; 0.5.14 on Blackwell (through its own ops). What is forced differs per
release (the second list below is 0.5.14's); the stand-ins for kernels with no SM90 body are shared.

On PYTHONPATH for the engine processes only, so that the spawned scheduler runs it too, and active only
with FP4_DYNAMO_SHIM_TEST_SM120_PATH=1. It never imports fp4_dynamo_shim: the routes under test decide
that. Each forced decision, and why (read from SGLang 0.5.11's code):

1. ``ModelOptFp4Config.get_min_capability`` -> 90: the loader refuses ModelOpt FP4 below capability 100.
   The FP4 kernels it would need are what the H200 lacks, and they are replaced below or by the shim.
2. ``modelopt_quant.fp4_quantize`` -> ``flashinfer.fp4_quantize``: on SM12x SGLang binds FlashInfer's
   quantizer at import (``if is_sm120_supported(): from flashinfer import fp4_quantize``), elsewhere its
   own JIT one. This is that binding, done once the module is imported.
3. ``modelopt_quant.is_blackwell_supported`` -> True (Qwen3-MoE only): the NVFP4 MoE method refuses
   non-Blackwell GPUs when it is constructed.
4. (not a patch) the engine is started with ``fp4_gemm_runner_backend="flashinfer_cudnn"``, what ``auto``
   picks on SM12x, so the GEMM goes through ``flashinfer.mm_fp4(..., backend="cudnn")``.

Stand-ins for kernels that cannot run on SM90, and only those:

* ``sglang.srt.layers.moe.cutlass_moe.cutlass_moe_fp4`` (the MoE SGLang runs on SM12x: its JIT FP4
  grouped GEMM raises below capability 10.0) -> a reference computing each expert with its dequantized
  FP4 weights in float32 (activations are not FP4-quantized inside the stand-in). No FlashInfer call. An
  expert id outside the experts (SGLang's mark for padding rows) routes nowhere, as in the real kernel.
* only when the shim is switched off (``FP4_DYNAMO_SHIM_DISABLE=1``): ``modelopt_quant.flashinfer_fp4_gemm``
  (FlashInfer's ``mm_fp4``, which has no SM90 backend) -> a reference, so that the engine gets as far as
  piecewise capture, where Dynamo meets FlashInfer's ``fp4_quantize``. With the shim on,
  ``FP4_DYNAMO_SHIM_FALLBACK=reference`` makes the shim's own ``mm_fp4`` compute it: that is under test.

SGLang 0.5.14 (read from its code; the release is read from the installed metadata):

1. ``modelopt_quant.is_blackwell_supported`` -> True: ``ModelOptFp4LinearMethod.process_weights_after_loading``
   refuses every non-Marlin FP4 GEMM backend below SM100 (modelopt_quant.py:1519), and the NVFP4 MoE method
   refuses non-Blackwell GPUs unless it runs Marlin (modelopt_quant.py:1774). (0.5.14 accepts ModelOpt FP4
   from capability 80, so nothing else is needed to load it.)
2. (not patches) the engine is started with ``fp4_gemm_runner_backend="flashinfer_cudnn"`` (SGLang's own
   choice on SM80-SM90 is Marlin, which never calls FlashInfer) and ``moe_runner_backend="triton"``, which
   reaches SGLang's ``cutlass_moe_fp4`` (stood in below, as on 0.5.11) instead of the Marlin MoE, a JIT build
   there; the MoE runs inside SGLang's own ``moe_forward_piecewise_cuda_graph_impl`` op either way.
3. ``fp4_utils.py`` is left as SGLang wrote it: its op ``sglang::flashinfer_fp4_quantize`` calls
   ``_flashinfer_fp4_quantize(..., backend="cuda")`` on SM90 as on SM12x.

Only when the shim is switched off (``FP4_DYNAMO_SHIM_DISABLE=1``), for 0.5.14 (whose engine then has to
serve, since SGLang wraps the calls itself): ``fp4_utils._flashinfer_fp4_quantize`` (FlashInfer's FP4
quantize kernel writes nothing on SM90) -> the project's reference quantizer with the installed FlashInfer's
arithmetic (what ``FP4_DYNAMO_SHIM_FALLBACK=reference`` computes when the shim is on), and
``modelopt_quant.flashinfer_fp4_gemm`` -> the reference below, so the shim-off engine's greedy ids can be
compared with the shimmed ones.

It also writes what each scheduler process ended up with to ``$FP4_DYNAMO_SHIM_TEST_STATUS_DIR/<pid>.json``
once ``Scheduler.__init__`` returns or fails (model loaded, graphs captured).
"""

import json
import os
import sys


def _active():
    return os.environ.get("FP4_DYNAMO_SHIM_TEST_SM120_PATH") == "1"


def _e2m1(codes):
    import torch

    exponent = ((codes >> 1) & 3).to(torch.float32)
    half = (codes & 1).to(torch.float32) * 0.5
    magnitude = torch.where(exponent == 0, half, torch.ldexp(1.0 + half, exponent - 1))
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def _unpack(packed):
    import torch

    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return _e2m1(codes).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _unswizzle(scales, rows, columns):
    """The 128x4 swizzled scale bytes of ``[..., padded rows, padded columns]`` back to ``[..., rows, columns]``
    (SGLang's ``swizzle_blockscale`` permutation (0, 1, 4, 3, 2, 5) is its own inverse)."""
    *batch, padded_rows, padded_columns = scales.shape
    tiles = scales.reshape(-1, padded_rows // 128, padded_columns // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    return tiles.reshape(*batch, padded_rows, padded_columns)[..., :rows, :columns]


def _dequantize(packed, scales_e4m3, factor):
    """FP4 weights ``[..., N, K/2]`` with swizzled e4m3 block scales, times ``factor`` per leading index."""
    import torch

    values = _unpack(packed)
    rows, columns = values.shape[-2], values.shape[-1]
    scales = _unswizzle(scales_e4m3.view(torch.float8_e4m3fn), rows, columns // 16).to(torch.float32)
    weights = values.view(*values.shape[:-1], columns // 16, 16) * scales.unsqueeze(-1)
    return weights.reshape(values.shape) * factor.to(torch.float32).reshape(-1, *([1] * (values.dim() - 1)))


_dequantized = {}


def reference_cutlass_moe_fp4(a, a1_gscale, w1_fp4, w1_blockscale, w1_alphas, a2_gscale, w2_fp4, w2_blockscale,
                              w2_alphas, topk_weights, topk_ids, params, apply_router_weight_on_input=False,
                              no_combine=False):
    """Stand-in for SGLang's cutlass_moe_fp4 (see the module docstring): capture-safe, no host copies."""
    import torch

    key = (w1_fp4.data_ptr(), w2_fp4.data_ptr())
    weights = _dequantized.get(key)
    if weights is None:
        # alpha = input_scale * weight_scale_2 and gscale = 1 / input_scale: their product is weight_scale_2.
        weights = (_dequantize(w1_fp4, w1_blockscale, w1_alphas * a1_gscale),
                   _dequantize(w2_fp4, w2_blockscale, w2_alphas * a2_gscale))
        if not torch.cuda.is_current_stream_capturing():
            _dequantized[key] = weights
    gate_up, down = weights
    x = a.to(torch.float32)
    routing = torch.zeros(x.shape[0], gate_up.shape[0], device=x.device, dtype=torch.float32)
    ids = topk_ids.to(torch.int64)
    if os.environ.get("FP4_DYNAMO_SHIM_TEST_MOE_UNMASKED") == "1":  # the stand-in as it was, for comparison
        routing.scatter_(1, ids, topk_weights.to(torch.float32))
    else:
        # An id outside the experts (SGLang marks padding rows -1) routes nowhere, as in the real kernel; a
        # scatter with it would write outside its row.
        valid = (ids >= 0) & (ids < gate_up.shape[0])
        routing.scatter_add_(1, torch.where(valid, ids, 0), torch.where(valid, topk_weights.to(torch.float32), 0.0))
    if apply_router_weight_on_input or no_combine:
        raise NotImplementedError("the stand-in does not apply router weights on the input or skip the combine")
    out = torch.zeros(x.shape[0], down.shape[1], device=x.device, dtype=torch.float32)
    for expert in range(gate_up.shape[0]):
        gate, up = (x @ gate_up[expert].t()).chunk(2, dim=-1)
        out += routing[:, expert:expert + 1] * ((torch.nn.functional.silu(gate) * up) @ down[expert].t())
    return out.to(a.dtype)


def reference_mm_fp4(a, b, a_descale, b_descale, alpha=None, out_dtype=None, *args, **kwargs):
    """Stand-in for FlashInfer's mm_fp4 when the shim is off: ``a [M, K/2]`` with swizzled scales, ``b`` the
    transpose of an ``[N, K/2]`` weight with the transposed swizzled scales (SGLang's layout)."""
    import torch

    left = _dequantize(a, a_descale.contiguous().view(torch.uint8).view(-1, a_descale.shape[-1]),
                       torch.ones(1, device=a.device))
    right = _dequantize(b.t(), b_descale.t().contiguous().view(torch.uint8), torch.ones(1, device=b.device))
    product = left @ right.t()
    if alpha is not None:
        product = product * alpha.to(torch.float32).reshape(-1)[0]
    return product.to(out_dtype or torch.bfloat16)


def reference_fp4_quantize(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True,
                           is_sf_8x4_layout=False, enable_pdl=None, backend="cuda"):
    """Stand-in for FlashInfer's fp4_quantize when the shim is off (0.5.14's fp4_utils op calls it): the
    project's reference quantizer with the installed FlashInfer's arithmetic, in FlashInfer's output layout
    (swizzled 128x4 scales viewed as [-1, round_up(K/16, 4)]). Imported only with FP4_DYNAMO_SHIM_DISABLE=1,
    so that importing the package applies nothing."""
    import importlib.metadata

    import torch

    from _fp4_dynamo_shim.fp4 import arithmetic
    from _fp4_dynamo_shim.fp4 import layout
    from _fp4_dynamo_shim.fp4 import fp4_releases

    if sf_vec_size != 16 or sf_use_ue8m0 or not is_sf_swizzled_layout or is_sf_8x4_layout or input.dim() != 2:
        raise NotImplementedError("the stand-in quantizes the call SGLang's linear layers make only")
    target = fp4_releases.target_for(importlib.metadata.version("flashinfer-python"))
    packed, scales = arithmetic.quantize(input.contiguous(), global_scale.to(torch.float32), 16, False,
                                             recipe=arithmetic.recipe(target.arithmetic, 0))
    columns = layout.round_up(input.shape[-1] // 16, 4)
    return packed, layout.swizzle(scales, False).reshape(-1, columns)


def _sglang_release():
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _patch_modelopt_0_5_14(module):
    module.is_blackwell_supported = lambda: True
    if os.environ.get("FP4_DYNAMO_SHIM_DISABLE") == "1":
        module.flashinfer_fp4_gemm = reference_mm_fp4


def _patch_fp4_utils_0_5_14(module):
    if os.environ.get("FP4_DYNAMO_SHIM_DISABLE") == "1":
        module._flashinfer_fp4_quantize = reference_fp4_quantize


def _patch_modelopt(module):
    import flashinfer

    module.ModelOptFp4Config.get_min_capability = classmethod(lambda cls: 90)
    module.fp4_quantize = flashinfer.fp4_quantize
    module.is_blackwell_supported = lambda: True
    if os.environ.get("FP4_DYNAMO_SHIM_DISABLE") == "1":
        module.flashinfer_fp4_gemm = reference_mm_fp4


def _patch_cutlass_moe(module):
    module.cutlass_moe_fp4 = reference_cutlass_moe_fp4


def _describe():
    report = {"pid": os.getpid(), "ppid": os.getppid(), "shim_imported": "_fp4_dynamo_shim.lifecycle" in sys.modules}
    shim = sys.modules.get("_fp4_dynamo_shim.lifecycle")
    if shim is not None:
        state = shim.status()
        report["shim"] = {key: state[key] for key in ("applied", "activated_by", "problem", "disabled", "fallback",
                                                       "devices", "flashinfer")}
    for short, module_name, names in (
            ("modelopt", "sglang.srt.layers.quantization.modelopt_quant", ("fp4_quantize", "flashinfer_fp4_gemm")),
            ("fp4_utils", "sglang.srt.layers.quantization.fp4_utils", ("_flashinfer_fp4_quantize",))):
        module = sys.modules.get(module_name)
        for name in names if module is not None else ():
            bound = getattr(module, name, None)
            report[f"{short}.{name}"] = ("shim" if getattr(bound, "__fp4_dynamo_shim__", False) else
                                         getattr(bound, "__module__", None) or repr(bound)[:80])
    return report


def _patch_scheduler(module):
    init = module.Scheduler.__init__

    def reporting_init(self, *args, **kwargs):
        error = None
        try:
            init(self, *args, **kwargs)
        except BaseException as exception:
            error = f"{type(exception).__name__}: {exception}"
            raise
        finally:
            directory = os.environ.get("FP4_DYNAMO_SHIM_TEST_STATUS_DIR")
            if directory:
                with open(os.path.join(directory, f"{os.getpid()}.json"), "w") as stream:
                    json.dump({**_describe(), "scheduler_error": error}, stream, default=str)

    module.Scheduler.__init__ = reporting_init


#: What each release needs forced, module by module (see the module docstring for why).
FORCED = {
    "0.5.11": (("sglang.srt.layers.quantization.modelopt_quant", _patch_modelopt),
               ("sglang.srt.layers.moe.cutlass_moe", _patch_cutlass_moe),
               ("sglang.srt.managers.scheduler", _patch_scheduler)),
    "0.5.14": (("sglang.srt.layers.quantization.modelopt_quant", _patch_modelopt_0_5_14),
               ("sglang.srt.layers.quantization.fp4_utils", _patch_fp4_utils_0_5_14),
               ("sglang.srt.layers.moe.cutlass_moe", _patch_cutlass_moe),
               ("sglang.srt.managers.scheduler", _patch_scheduler)),
}

if _active():
    import wrapt

    _release = _sglang_release()
    if _release not in FORCED:
        sys.stderr.write(f"sm120_path/sitecustomize.py: nothing written for SGLang {_release}; forcing nothing\n")
    for _name, _patch in FORCED.get(_release, ()):
        wrapt.register_post_import_hook(_patch, _name)
