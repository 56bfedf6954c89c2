"""What the FP4 family computes where a common value would hide a wrong result: one global scale per row, the
kernel mode in force, the ufp8 dequantize types, silu_and_mul's rounding."""

from __future__ import annotations

import flashinfer
import pytest
import torch

import fp4_oracle
from nvfp4_inputs import row_of


def test_batched_quantize_takes_one_global_scale_per_row_not_per_batch():
    # B = 2 batches of M = 3 rows: a per-row scale has 3 values; 2 (the batch count) is refused.
    x = torch.full((2, 3, 16), 6.0, dtype=torch.bfloat16)
    _, scales = flashinfer.nvfp4_batched_quantize(x, torch.tensor([1.0, 2.0, 4.0]))
    from _fp4_dynamo_shim.fp4 import layout

    assert [layout.unswizzle(batch, 3, 1, False).flatten().tolist() for batch in scales] == [[0x38, 0x40, 0x48]] * 2
    with pytest.raises(ValueError, match="global scale"):
        flashinfer.nvfp4_batched_quantize(x, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("ufp8_type, factor", [(0, None), (1, 0.5), (2, 1.0)])
def test_dequantize_applies_the_global_scale_only_for_ufp8_type_1(ufp8_type, factor):
    # Codes 2 (1.0); scale byte 0x40 is e4m3 2.0, or as UE8M0 (type 0) 2^(64-127). Global scale 0.5.
    packed = torch.full((1, 8), 0x22, dtype=torch.uint8)
    scale = torch.tensor([0x40], dtype=torch.uint8)
    values = flashinfer.e2m1_and_ufp8sf_scale_to_float(packed, scale, torch.tensor([0.5]), 16, ufp8_type, False)
    expected = 2.0 ** (0x40 - 127) if ufp8_type == 0 else 2.0 * factor
    assert values.tolist() == [[expected] * 16]


def test_the_batched_and_grouped_quantizers_compute_in_the_kernel_mode_in_force(monkeypatch):
    # Fast math off changes this block's bytes (the NaN amax case above: scale 0x7F, codes 7 then 0 instead of
    # all 7): the family's quantizers read the switch as fp4_quantize does, rather than the default recipe.
    x = row_of({0: 1.0, **{i: float("nan") for i in range(1, 16, 2)}})
    scale = torch.tensor([3.0])
    default = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1")
    monkeypatch.setenv("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH", "1")
    want_packed, want_sf = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    assert (want_packed.tolist(), want_sf.tolist()) != (default[0].tolist(), default[1].tolist())
    from _fp4_dynamo_shim.fp4 import layout

    if hasattr(flashinfer, "nvfp4_batched_quantize"):
        packed, sf = flashinfer.nvfp4_batched_quantize(x.reshape(1, 1, 16), scale)
        assert packed.reshape(1, 8).tolist() == want_packed.tolist()
        assert layout.unswizzle(sf[0], 1, 1, False).tolist() == want_sf.tolist()
    if hasattr(flashinfer, "scaled_fp4_grouped_quantize"):
        packed, sf = flashinfer.scaled_fp4_grouped_quantize(x.reshape(1, 1, 16), torch.tensor([1], dtype=torch.int32),
                                                           scale)
        assert packed.permute(2, 0, 1).reshape(1, 8).tolist() == want_packed.tolist()
        grid = sf.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(-1)
        assert layout.unswizzle(grid, 1, 1, False).tolist() == want_sf.tolist()


def test_silu_and_mul_rounds_its_product_to_the_input_dtype_before_quantizing():
    # The kernel computes silu(gate) * up in float and stores it in the input dtype before quantizing; found
    # by search: quantizing this row's float32 product instead gives byte 73 and code 228 where bf16 gives 74, 227.
    if not hasattr(flashinfer, "silu_and_mul_scaled_nvfp4_experts_quantize"):
        pytest.skip("this FlashInfer has no silu_and_mul_scaled_nvfp4_experts_quantize")
    gate = [1.4765625, 2.90625, 3.546875, 5.3125, 2.875, 5.0625, -5.65625, -0.412109375, 5.3125, 1.7890625, 4.8125,
            -4.65625, -0.37109375, -3.046875, 0.5234375, 0.88671875]
    up = [-5.84375, -3.40625, -2.640625, 5.0, 3.1875, -4.09375, 3.5625, -4.34375, 1.40625, -4.46875, -5.96875,
          4.46875, -3.484375, -3.421875, 5.78125, 4.46875]
    x = torch.tensor([[gate + up]], dtype=torch.bfloat16)
    values, scales = flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(x, torch.tensor([1], dtype=torch.int32),
                                                                           torch.tensor([1.0]))
    from _fp4_dynamo_shim.fp4 import layout

    product = (x[..., :16].float() / (1.0 + torch.exp(-x[..., :16].float())) * x[..., 16:].float()).to(torch.bfloat16)
    want_packed, want_scales = fp4_oracle.quantize(product[0].float().tolist(), [1.0], 16, False)
    assert want_packed == [[203, 124, 227, 8, 179, 143, 0, 17]] and want_scales == [[74]]
    assert values.permute(2, 0, 1).reshape(1, 8).tolist() == want_packed
    grid = scales.permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(-1)
    assert layout.unswizzle(grid, 1, 1, False).tolist() == want_scales
