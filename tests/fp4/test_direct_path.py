"""The replacement's direct eager path (the common call on a GPU with the FP4 kernel) on uncommon shapes.

Stand-in: the GPU's JIT entry, which cannot run here (``stand_in_gpu.reference_entry`` says what it does); CPU
tensors take the direct path through it.
"""

from __future__ import annotations

import flashinfer
import pytest
import torch


def row_of(values, width=16, dtype=torch.bfloat16):
    x = torch.zeros(1, width, dtype=torch.float32)
    for index, value in values.items():
        x[0, index] = value
    return x.to(dtype)


def test_the_direct_path_never_hands_an_empty_input_to_the_kernel(direct_entry):
    # FlashInfer launches an empty grid for M = 0, which leaves a stale CUDA error behind.
    packed, sf = flashinfer.fp4_quantize(torch.empty(0, 64, dtype=torch.bfloat16), torch.tensor([1.0]), nvfp4_4over6=None)
    assert direct_entry == [] and packed.shape == (0, 32) and sf.shape == (0, 4)
    flashinfer.fp4_quantize(torch.ones(1, 64, dtype=torch.bfloat16), torch.tensor([1.0]), nvfp4_4over6=None)
    assert len(direct_entry) == 1  # the stand-in is reached for M = 1


@pytest.mark.parametrize("columns", [64, 80, 96, 112])  # K/16 % 4 = 0, 1, 2, 3
def test_the_direct_path_pads_scale_columns_to_a_multiple_of_four(direct_entry, columns):
    x = torch.randn(3, columns, dtype=torch.bfloat16)
    scale = torch.tensor([7.0])
    general = flashinfer.fp4_quantize(x, scale)  # the 4over6 sentinel: the general path
    direct = flashinfer.fp4_quantize(x, scale, nvfp4_4over6=None)
    assert direct_entry and direct_entry[-1][2] == (128, -(-columns // 64) * 4)
    for got, want in zip(direct, general):
        assert got.shape == want.shape and torch.equal(got, want)
