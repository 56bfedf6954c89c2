"""The replacement's direct eager path (the common call on a GPU with the FP4 kernel) on uncommon shapes.

Stand-in: the GPU's JIT entry, which cannot run here (``stand_in_gpu.reference_entry`` says what it does); CPU
tensors take the direct path through it.
"""

from __future__ import annotations

import inspect
import itertools

import flashinfer
import pytest
import torch

from nvfp4_inputs import nvfp4_input


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


RECIPES = [(16, False), (32, True)]  # NVFP4, MXFP4
DIRECT = dict(sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True, is_sf_8x4_layout=False)


@pytest.mark.parametrize("rows, columns", [(1, 64), (130, 96), (128, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_layout_flag_combination_gives_the_general_paths_bytes(direct_entry, rows, columns, dtype):
    """Every flag combination the replacement can be called with: the direct path takes exactly the common one
    (NVFP4, swizzled 128x4; inversed scale and PDL either way) and gives what the general path gives; every
    other combination leaves it for the general path. Limits of the stand-in entry: the reference's bytes
    and layouts, not the kernel's."""
    if "nvfp4_4over6" not in inspect.signature(flashinfer.fp4_quantize).parameters:
        pytest.skip("the general path is told apart by nvfp4_4over6's sentinel (FlashInfer 0.7.1+)")
    x, scale = nvfp4_input(rows, columns, dtype=dtype, seed=rows + columns)
    for (sf_vec_size, ue8m0), swizzled, is_8x4, inversed, enable_pdl in itertools.product(
            RECIPES, (True, False), (False, True), (False, True), (None, False, True)):
        flags = dict(sf_vec_size=sf_vec_size, sf_use_ue8m0=ue8m0, is_sf_swizzled_layout=swizzled,
                     is_sf_8x4_layout=is_8x4, is_global_scale_inversed=inversed, enable_pdl=enable_pdl)
        calls = len(direct_entry)
        general = flashinfer.fp4_quantize(x, scale, **flags)  # the 4over6 sentinel: always the general path
        assert len(direct_entry) == calls, flags
        direct = flashinfer.fp4_quantize(x, scale, nvfp4_4over6=None, **flags)
        took_direct = len(direct_entry) > calls
        assert took_direct == all(flags[name] == value for name, value in DIRECT.items()), flags
        for got, want in zip(direct, general):
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype), flags
            assert torch.equal(got, want), flags
