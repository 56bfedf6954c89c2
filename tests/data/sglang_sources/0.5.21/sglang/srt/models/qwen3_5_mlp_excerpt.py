# sglang/srt/models/qwen2_moe.py:219-243 (_silu_fp4_quant_fused), models/qwen2_moe.py:245-255 (forward), models/qwen3_5.py:189-213 (_maybe_enable_silu_fp4_quant_fusion); verbatim, methods dedented out of Qwen2MoeMLP

def _silu_fp4_quant_fused(self, gate_up: torch.Tensor) -> tuple:
    from flashinfer import silu_and_mul_scaled_nvfp4_experts_quantize

    if self._down_input_scale_inv_1d is None:
        self._down_input_scale_inv_1d = self.down_proj.input_scale_inv.reshape(1)
    num_tokens = gate_up.shape[0]
    masked_m = self._masked_m_cache.get(num_tokens)
    if masked_m is None:
        masked_m = torch.tensor(
            [num_tokens], dtype=torch.int32, device=gate_up.device
        )
        self._masked_m_cache[num_tokens] = masked_m
    y_fp4, y_sf = silu_and_mul_scaled_nvfp4_experts_quantize(
        gate_up.unsqueeze(0),
        masked_m,
        self._down_input_scale_inv_1d,
    )
    # [M, K/2, 1] -> [M, K/2]; scale: expert-grouped 6-D swizzle
    # (32, 4, m_blocks, 4, K/64, 1) -> the dense swizzled layout
    # fp4_gemm expects (verified bit-exact vs fp4_quantize up to FP4
    # rounding ties for M in 64..8192).
    y_fp4 = y_fp4.squeeze(-1).view(torch.uint8)
    m_padded = y_sf.shape[2] * y_sf.shape[0] * y_sf.shape[3]  # m_blocks*32*4
    y_sf = y_sf.view(torch.uint8).permute(2, 4, 0, 1, 3, 5).reshape(m_padded, -1)
    return y_fp4, y_sf


def forward(
    self,
    x,
):
    gate_up, _ = self.gate_up_proj(x)
    if self._enable_silu_fp4_quant_fusion and not isinstance(gate_up, tuple):
        x, _ = self.down_proj(self._silu_fp4_quant_fused(gate_up))
        return x
    x = self.act_fn(gate_up)
    x, _ = self.down_proj(x)
    return x


def _maybe_enable_silu_fp4_quant_fusion(mlp: nn.Module) -> None:
    """Fuse SiLU+mul with the down_proj NVFP4 input quantization.

    Replaces the separate act_and_mul and per-token FP4 quantize kernels with
    one FlashInfer kernel and feeds down_proj a prequantized (fp4, scale)
    tuple. Enabled when both dense-MLP projections use the NVFP4 (W4A4)
    linear method; kill switch: SGLANG_DISABLE_SILU_FP4_QUANT_FUSION=1.
    """
    if os.environ.get("SGLANG_DISABLE_SILU_FP4_QUANT_FUSION", "0") == "1":
        return
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4LinearMethod

    if not (
        isinstance(mlp.gate_up_proj.quant_method, ModelOptFp4LinearMethod)
        and mlp.gate_up_proj.quant_method.quant_mode == "w4a4"
        and isinstance(mlp.down_proj.quant_method, ModelOptFp4LinearMethod)
    ):
        return
    try:
        from flashinfer import silu_and_mul_scaled_nvfp4_experts_quantize  # noqa: F401
    except ImportError:
        return
    mlp._enable_silu_fp4_quant_fusion = True
    mlp.down_proj._accepts_prequantized_fp4 = True
    logger.info("Enabled fused SiLU+mul+FP4-quant for dense MLP down_proj input.")
