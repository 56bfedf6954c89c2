"""What FlashInfer's FP4 family functions, once replaced, say to a bad argument, word for word, and what they let
through: called as users call them, ``flashinfer.<function>(...)``, on CPU tensors.

Each op runs its check before its fake, its reference and FlashInfer's kernel alike, so one check decides the
error eagerly and under torch.compile; tests/fp4/test_fp4_family_traces_and_matches_eager.py shows the class reaches the user both ways (for
meta tensors), and here each refusal is held to its words once, eagerly and compiled.
"""

from __future__ import annotations

import re

import flashinfer
import pytest
import torch

from _fp4_dynamo_shim.errors import InvalidArgumentError

U8, I32, BF16, F16, F32 = torch.uint8, torch.int32, torch.bfloat16, torch.float16, torch.float32
EXPERTS = "scaled_fp4_grouped_quantize"
SILU = "silu_and_mul_scaled_nvfp4_experts_quantize"


def t(*shape, dtype=F32):
    return torch.zeros(shape, dtype=dtype)


def transposed(rows, columns, dtype):
    """A non-contiguous [rows, columns] tensor."""
    return torch.zeros((columns, rows), dtype=dtype).t()


def scale(n=1):
    return torch.ones(n, dtype=F32)


def mask(n=2, dtype=I32):
    return torch.zeros(n, dtype=dtype)


DEQUANTIZE = "e2m1_and_ufp8sf_scale_to_float"
HOST = "mxfp4_dequantize_host"
BATCHED = "nvfp4_batched_quantize"

#: (function, args, kwargs, what the user reads): a regular expression where releases word it differently.
REFUSED = [
    ("block_scale_interleave", (t(4, dtype=U8),), {}, "block_scale_interleave: expected a 2-D or 3-D tensor, got shape (4,)"),
    ("block_scale_interleave", (transposed(4, 8, U8),), {}, "block_scale_interleave: the input must be contiguous"),
    ("block_scale_interleave", (t(2, 4),), {}, re.compile(r"block_scale_interleave: input dtype must be torch\.uint8"
                                                          r"( or torch\.bfloat16)?, got torch\.float32")),
    (DEQUANTIZE, (t(2, 2, 2, dtype=U8), t(4, dtype=U8), scale()), {},
     "e2m1 values must be a 2-D uint8 tensor, got (2, 2, 2) torch.uint8"),
    (DEQUANTIZE, (t(2, 8, dtype=torch.int8), t(4, dtype=U8), scale()), {},
     "e2m1 values must be a 2-D uint8 tensor, got (2, 8) torch.int8"),
    (DEQUANTIZE, (transposed(2, 8, U8), t(4, dtype=U8), scale()), {}, "e2m1 values must be contiguous"),
    (DEQUANTIZE, (t(2, 8, dtype=U8), t(4), scale()), {}, "scale factors must be uint8, got torch.float32"),
    (DEQUANTIZE, (t(2, 8, dtype=U8), t(4, dtype=U8), scale()), dict(sf_vec_size=0),
     "sf_vec_size 0 must divide the row length 16"),
    (DEQUANTIZE, (t(2, 8, dtype=U8), t(4, dtype=U8), scale()), dict(sf_vec_size=5),
     "sf_vec_size 5 must divide the row length 16"),
    (HOST, (t(2, 16, dtype=torch.int8), t(2, 1, dtype=U8)), {}, f"{HOST}: weight and scale must be 2-D uint8 tensors"),
    (HOST, (t(2, 16, dtype=U8), t(2, dtype=U8)), {}, f"{HOST}: weight and scale must be 2-D uint8 tensors"),
    (HOST, (t(2, 16, dtype=U8), t(2, 1)), {}, f"{HOST}: weight and scale must be 2-D uint8 tensors"),
    (HOST, (t(0, 16, dtype=U8), t(0, 1, dtype=U8)), {}, f"{HOST}: weight (0, 16) and scale (0, 1) do not match group_size 32"),
    (HOST, (t(2, 16, dtype=U8), t(3, 1, dtype=U8)), {}, f"{HOST}: weight (2, 16) and scale (3, 1) do not match group_size 32"),
    (HOST, (t(2, 16, dtype=U8), t(2, 2, dtype=U8)), {}, f"{HOST}: weight (2, 16) and scale (2, 2) do not match group_size 32"),
    (BATCHED, (t(4, 32, dtype=BF16), scale()), {}, f"{BATCHED}: input should be a 3-D tensor, got (4, 32)"),
    (BATCHED, (t(2, 4, 32, dtype=BF16), scale()), dict(sf_vec_size=32), f"{BATCHED}: sf_vec_size can only be 16, got 32"),
    (BATCHED, (t(2, 4, 32), scale()), {},
     f"{BATCHED} only supports input dtypes torch.float16, torch.bfloat16, torch.float8_e4m3fn, got torch.float32"),
    (BATCHED, (t(2, 4, 20, dtype=BF16), scale()), {}, f"{BATCHED}: the last dimension (20) must be a multiple of 16"),
    (BATCHED, (transposed(4, 32, BF16).unsqueeze(0), scale()), {}, f"{BATCHED}: input must be contiguous"),
    (BATCHED, (t(2, 4, 32, dtype=BF16), torch.ones(1, dtype=F16)), {},
     f"{BATCHED}: global scale must be float32, got torch.float16"),
    (BATCHED, (t(2, 4, 32, dtype=BF16), scale(3)), {},  # one value, or one per row from 0.6.11.post1
     re.compile(f"{BATCHED}: global scale (should have shape \\[1\\] or \\[num_tokens\\]|must have one element in this release)")),
    *[(name, (t(4, 32, dtype=BF16), mask(), scale(2)), {}, f"{name}: input should be a 3-D [experts, rows, columns] tensor")
      for name in (EXPERTS, SILU)],
    (SILU, (t(2, 4, 48, dtype=BF16), mask(), scale(2)), {},
     f"{SILU}: the last dimension (24) must be a multiple of 16"),  # silu_and_mul halves the columns first
    (EXPERTS, (t(2, 4, 32), mask(), scale(2)), {},
     f"{EXPERTS} only supports input dtypes torch.float16, torch.bfloat16, got torch.float32"),
    (EXPERTS, (t(2, 4, 32, dtype=BF16), mask(), scale(3)), {}, f"{EXPERTS}: global scale must have one value per expert ([2])"),
    (EXPERTS, (t(2, 4, 32, dtype=BF16), mask(), t(2, 1)), {}, f"{EXPERTS}: global scale must have one value per expert ([2])"),
    *[(EXPERTS, (t(2, 4, 32, dtype=BF16), bad_mask, scale(2)), {},
       f"{EXPERTS}: mask must be a 1-D int32 tensor with one value per expert")
      for bad_mask in (mask(dtype=torch.int64), t(2, 1, dtype=I32), mask(3))],
]


def _present(name):
    if not hasattr(flashinfer, name):
        pytest.skip(f"this FlashInfer has no {name}")
    return getattr(flashinfer, name)


def _said(text, expected):
    return expected.search(text) is not None if isinstance(expected, re.Pattern) else expected in text


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name, args, kwargs, said", REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)])
def test_a_bad_argument_is_refused_in_words_that_name_it(name, args, kwargs, said, compiled):
    function = _present(name)
    if not compiled:
        with pytest.raises(InvalidArgumentError) as refused:
            function(*args, **kwargs)
        text = str(refused.value)
        assert text == said if isinstance(said, str) else said.fullmatch(text), text
        return
    run = torch.compile(lambda *a: function(*a, **kwargs), fullgraph=True, backend="eager")
    with pytest.raises(Exception) as refused:  # Dynamo wraps what the fake raised while it traced
        run(*args)
    assert _said(str(refused.value), said), str(refused.value)[:600]


#: (function, args, kwargs) at the edges of what each check allows.
ACCEPTED = [
    ("block_scale_interleave", (t(2, 4, dtype=U8),), {}),
    (DEQUANTIZE, (t(2, 8, dtype=U8), t(32, dtype=U8), scale()), dict(sf_vec_size=1, is_sf_swizzled_layout=False)),
    (DEQUANTIZE, (t(2, 8, dtype=U8), t(2, dtype=U8), scale()), dict(is_sf_swizzled_layout=False)),
    (HOST, (t(2, 16, dtype=U8), t(2, 1, dtype=U8)), {}),
    (BATCHED, (t(2, 4, 32, dtype=BF16), scale()), {}),
    (EXPERTS, (t(2, 4, 32, dtype=F16), mask(), scale(2)), {}),
    (SILU, (t(2, 4, 64, dtype=BF16), mask(), scale(2)), {}),
]


@pytest.mark.parametrize("name, args, kwargs", ACCEPTED, ids=[f"{a[0]}-{i}" for i, a in enumerate(ACCEPTED)])
def test_what_each_function_lets_through(name, args, kwargs):
    _present(name)(*args, **kwargs)


def test_the_experts_quantizers_measure_the_columns_their_kernel_quantizes_on_cpu_and_meta_tensors():
    """silu_and_mul halves the columns first: 48 columns are fine without it and refused with it, eagerly on real
    tensors and on meta ones (whose outputs come from the fake)."""
    for device in ("cpu", "meta"):
        arguments = (torch.zeros(2, 4, 48, dtype=BF16, device=device), torch.zeros(2, dtype=I32, device=device),
                     torch.ones(2, device=device))
        with pytest.raises(InvalidArgumentError, match=f"{SILU}: the last dimension \\(24\\) must be a multiple of 16"):
            _present(SILU)(*arguments)
        _present(EXPERTS)(*arguments)


def test_dequantized_values_are_float32_whatever_the_default_dtype():
    """FlashInfer's kernel writes float32; a fake that took torch's default dtype would tell the compiled graph
    float64 after ``torch.set_default_dtype(torch.float64)``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        values = flashinfer.e2m1_and_ufp8sf_scale_to_float(
            torch.zeros(2, 8, dtype=U8, device="meta"), torch.zeros(4, dtype=U8, device="meta"),
            torch.ones(1, device="meta", dtype=F32), 16, 1, False)
    finally:
        torch.set_default_dtype(previous)
    assert (values.dtype, values.device.type, tuple(values.shape)) == (F32, "meta", (2, 16))
