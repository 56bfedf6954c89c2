"""What the FP4 family's ops say to a bad argument, word for word, and what they let through.

Every op runs its check before its fake, its reference and FlashInfer's kernel alike, so one check decides
the error eagerly and under torch.compile (tests/fp4/test_family.py shows the class reaches the user both
ways, for meta tensors); here each check is held to its words and its limits on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from _fp4_dynamo_shim.errors import InvalidArgumentError
from _fp4_dynamo_shim.fp4 import family_ops

U8, BF16, F16, F32 = torch.uint8, torch.bfloat16, torch.float16, torch.float32
EXPERTS = "scaled_fp4_grouped_quantize"
SILU = "silu_and_mul_scaled_nvfp4_experts_quantize"


def t(*shape, dtype=F32):
    return torch.zeros(shape, dtype=dtype)


def transposed(rows, columns, dtype):
    """A non-contiguous [rows, columns] tensor."""
    return torch.zeros((columns, rows), dtype=dtype).t()


def scale(n=1):
    return torch.ones(n, dtype=F32)


REFUSED = [
    (family_ops._check_interleave, (t(4, dtype=U8),),
     "block_scale_interleave: expected a 2-D or 3-D tensor, got shape (4,)"),
    (family_ops._check_interleave, (t(2, 4),), "block_scale_interleave only supports uint8 and bfloat16, got torch.float32"),
    (family_ops._check_interleave, (transposed(4, 8, U8),), "block_scale_interleave: the input must be contiguous"),
    (family_ops._check_dequantize, (t(2, 2, 2, dtype=U8), t(4, dtype=U8), scale(), 16, 1),
     "e2m1 values must be a 2-D uint8 tensor, got (2, 2, 2) torch.uint8"),
    (family_ops._check_dequantize, (t(2, 8, dtype=torch.int8), t(4, dtype=U8), scale(), 16, 1),
     "e2m1 values must be a 2-D uint8 tensor, got (2, 8) torch.int8"),
    (family_ops._check_dequantize, (transposed(2, 8, U8), t(4, dtype=U8), scale(), 16, 1), "e2m1 values must be contiguous"),
    (family_ops._check_dequantize, (t(2, 8, dtype=U8), t(4), scale(), 16, 1), "scale factors must be uint8, got torch.float32"),
    (family_ops._check_dequantize, (t(2, 8, dtype=U8), t(4, dtype=U8), scale(), 0, 1),
     "sf_vec_size 0 must divide the row length 16"),
    (family_ops._check_dequantize, (t(2, 8, dtype=U8), t(4, dtype=U8), scale(), 5, 1),
     "sf_vec_size 5 must divide the row length 16"),
    (family_ops._check_dequantize_host, (t(2, 16, dtype=torch.int8), t(2, 1, dtype=U8), 32),
     "mxfp4_dequantize_host: weight and scale must be 2-D uint8 tensors"),
    (family_ops._check_dequantize_host, (t(2, 16, dtype=U8), t(2, dtype=U8), 32),
     "mxfp4_dequantize_host: weight and scale must be 2-D uint8 tensors"),
    (family_ops._check_dequantize_host, (t(0, 16, dtype=U8), t(0, 1, dtype=U8), 32),
     "mxfp4_dequantize_host: weight (0, 16) and scale (0, 1) do not match group_size 32"),
    (family_ops._check_dequantize_host, (t(2, 16, dtype=U8), t(3, 1, dtype=U8), 32),
     "mxfp4_dequantize_host: weight (2, 16) and scale (3, 1) do not match group_size 32"),
    (family_ops._check_dequantize_host, (t(2, 16, dtype=U8), t(2, 2, dtype=U8), 32),
     "mxfp4_dequantize_host: weight (2, 16) and scale (2, 2) do not match group_size 32"),
    (family_ops._check_quantize_input, (t(2, 32), scale(), 32, 16, (F16, BF16), "q"),
     "q only supports input dtypes torch.float16, torch.bfloat16, got torch.float32"),
    (family_ops._check_quantize_input, (t(2, 20, dtype=BF16), scale(), 20, 16, (F16, BF16), "q"),
     "q: the last dimension (20) must be a multiple of 16"),
    (family_ops._check_quantize_input, (transposed(2, 32, BF16), scale(), 32, 16, (F16, BF16), "q"),
     "q: input must be contiguous"),
    (family_ops._check_quantize_input, (t(2, 32, dtype=BF16), torch.ones(1, dtype=F16), 32, 16, (F16, BF16), "q"),
     "q: global scale must be float32, got torch.float16"),
    (family_ops._check_batched, (t(4, 32, dtype=BF16), scale(), 16, 0),
     "nvfp4_batched_quantize: input should be a 3-D tensor, got (4, 32)"),
    (family_ops._check_batched, (t(2, 4, 32, dtype=BF16), scale(), 32, 0),
     "nvfp4_batched_quantize: sf_vec_size can only be 16, got 32"),
    (family_ops._check_batched, (t(2, 4, 32), scale(), 16, 0),
     "nvfp4_batched_quantize only supports input dtypes torch.float16, torch.bfloat16, torch.float8_e4m3fn, got torch.float32"),
    (family_ops._check_batched, (t(2, 4, 32, dtype=BF16), scale(3), 16, 0),
     "nvfp4_batched_quantize: global scale should have shape [1] or [num_tokens]"),
    *[(family_ops._check_experts, (t(4, 32, dtype=BF16), scale(2), t(2, dtype=torch.int32), silu),
       f"{name}: input should be a 3-D [experts, rows, columns] tensor") for silu, name in ((False, EXPERTS), (True, SILU))],
    (family_ops._check_experts, (t(2, 4, 48, dtype=BF16), scale(2), t(2, dtype=torch.int32), True),
     f"{SILU}: the last dimension (24) must be a multiple of 16"),  # silu_and_mul halves the columns first
    (family_ops._check_experts, (t(2, 4, 32), scale(2), t(2, dtype=torch.int32), False),
     f"{EXPERTS} only supports input dtypes torch.float16, torch.bfloat16, got torch.float32"),
    (family_ops._check_experts, (t(2, 4, 32, dtype=BF16), scale(3), t(2, dtype=torch.int32), False),
     f"{EXPERTS}: global scale must have one value per expert ([2])"),
    (family_ops._check_experts, (t(2, 4, 32, dtype=BF16), t(2, 1), t(2, dtype=torch.int32), False),
     f"{EXPERTS}: global scale must have one value per expert ([2])"),
    *[(family_ops._check_experts, (t(2, 4, 32, dtype=BF16), scale(2), mask, False),
       f"{EXPERTS}: mask must be a 1-D int32 tensor with one value per expert")
      for mask in (t(2, dtype=torch.int64), t(2, 1, dtype=torch.int32), t(3, dtype=torch.int32))],
]


@pytest.mark.parametrize("check, args, said", REFUSED, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(REFUSED)])
def test_a_bad_argument_is_refused_in_words_that_name_it(check, args, said):
    with pytest.raises(InvalidArgumentError) as refused:
        check(*args)
    assert str(refused.value) == said


ACCEPTED = [
    (family_ops._check_interleave, (t(2, 4, dtype=U8),)),
    (family_ops._check_interleave, (t(2, 128, 4, dtype=BF16),)),
    (family_ops._check_dequantize, (t(2, 8, dtype=U8), t(4, dtype=U8), scale(), 1, 1)),
    (family_ops._check_dequantize, (t(2, 8, dtype=U8), t(4, dtype=U8), scale(), 16, 1)),
    (family_ops._check_dequantize_host, (t(2, 16, dtype=U8), t(2, 1, dtype=U8), 32)),
    (family_ops._check_quantize_input, (t(2, 32, dtype=F16), scale(), 32, 16, (F16, BF16), "q")),
    (family_ops._check_batched, (t(2, 4, 32, dtype=torch.float8_e4m3fn), scale(), 16, 0)),
    (family_ops._check_batched, (t(2, 4, 32, dtype=BF16), scale(4), 16, 0)),  # one scale per token
    (family_ops._check_experts, (t(2, 4, 64, dtype=BF16), scale(2), t(2, dtype=torch.int32), True)),
    (family_ops._check_experts, (t(2, 4, 32, dtype=F16), scale(2), t(2, dtype=torch.int32), False)),
]


@pytest.mark.parametrize("check, args", ACCEPTED, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(ACCEPTED)])
def test_what_each_check_lets_through(check, args):
    assert check(*args) is None


def test_the_ops_hand_their_check_the_flags_it_reads():
    """The fake (meta tensors) and the reference (CPU tensors) each run the check with the op's own
    arguments: silu_and_mul halves the columns the check measures, so 48 columns pass without it and are
    refused with it, on both paths."""
    experts = family_ops.op("fp4_experts_quantize")
    for device in ("cpu", "meta"):
        arguments = (torch.zeros(2, 4, 48, dtype=BF16, device=device), torch.ones(2, device=device),
                     torch.zeros(2, dtype=torch.int32, device=device))
        with pytest.raises(InvalidArgumentError, match=f"{SILU}: the last dimension \\(24\\) must be a multiple of 16"):
            experts(*arguments, True, 0)
        experts(*arguments, False, 0)


def test_host_dequantize_refuses_float_scales_beside_uint8_weights():
    with pytest.raises(InvalidArgumentError, match="weight and scale must be 2-D uint8 tensors"):
        family_ops._check_dequantize_host(t(2, 16, dtype=U8), t(2, 1), 32)


def test_the_dequantize_fake_is_float32_whatever_the_default_dtype():
    """FlashInfer's kernel writes float32; a fake that took torch's default dtype would tell the compiled graph
    float64 after ``torch.set_default_dtype(torch.float64)``."""
    dequantize = family_ops.op("e2m1_and_ufp8sf_scale_to_float")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        values = dequantize(torch.zeros(2, 8, dtype=U8, device="meta"), torch.zeros(4, dtype=U8, device="meta"),
                            torch.ones(1, device="meta", dtype=F32), 16, 1, False, False)
    finally:
        torch.set_default_dtype(previous)
    assert (values.dtype, values.device.type, tuple(values.shape)) == (F32, "meta", (2, 16))


def test_batched_quantize_passes_the_ue8m0_switch_to_the_reference():
    """UE8M0 scales are powers of two, E4M3 ones are not in general: the same input gives other scale bytes."""
    batched = family_ops.op("fp4_batched_quantize")
    input = (torch.arange(2 * 4 * 32, dtype=F32).reshape(2, 4, 32) / 7 - 9).to(BF16)
    _, e4m3_scales = batched(input, scale(), 16, False, 0)
    _, ue8m0_scales = batched(input, scale(), 16, True, 0)
    assert not torch.equal(e4m3_scales, ue8m0_scales)
