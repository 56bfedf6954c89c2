"""The NVFP4 input every test quantizes: random values and the global scale SGLang computes for them."""

from __future__ import annotations

import torch

#: The layouts FlashInfer's fp4_quantize tells apart (it quantizes a column-major input transposed).
LAYOUTS = ("row-major", "column-major", "3-D", "3-D column-major")


def global_scale_for(x: torch.Tensor) -> torch.Tensor:
    """SGLang's NVFP4 input scale: FP8's largest value times FP4's over the input's largest magnitude, as a
    one-element float32 tensor on the input's device."""
    return (448.0 * 6.0 / x.float().abs().amax()).reshape(1)


def nvfp4_input(rows: int = 64, columns: int = 256, *, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                seed: int = 0, layout: str = "row-major", spread: float = 1.0):
    """``(x, global_scale)``: normal values times ``spread`` from a generator seeded with ``seed``, in ``layout``
    (3-D layouts have a leading dimension of 2)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def values(*shape):
        return (torch.randn(*shape, device=device, generator=generator) * spread).to(dtype)

    if layout == "row-major":
        x = values(rows, columns)
    elif layout == "column-major":
        x = values(columns, rows).t()
    elif layout == "3-D":
        x = values(2, rows, columns)
    elif layout == "3-D column-major":
        x = values(2, columns, rows).transpose(-2, -1)
    else:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return x, global_scale_for(x)


def row_of(values: dict, width: int = 16, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """One row of zeros with ``values`` ({column: value}) set: a block whose every element a test chose."""
    x = torch.zeros(1, width, dtype=torch.float32)
    for index, value in values.items():
        x[0, index] = value
    return x.to(dtype)
