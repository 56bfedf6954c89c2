"""Where FP4 scale factors live in memory.

One place for the arithmetic that the fake, the CUDA launch and the reference
quantizer must agree on byte for byte. It mirrors
``csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh``
(``get_sf_out_offset_128x4`` / ``get_sf_out_offset_8x4`` and the linear case).

Everything here works on plain ints and on SymInts, so the fake can call it
with a symbolic M.
"""

from __future__ import annotations

import torch

#: Rows per scale-factor tile for the two swizzled layouts.
ROWS_128X4 = 128
ROWS_8X4 = 8
#: Scale-factor columns are padded to a multiple of this in swizzled layouts.
SF_COLUMN_TILE = 4


def round_up(value, multiple: int):
    """Smallest multiple of ``multiple`` that is >= ``value`` (SymInt-safe)."""
    return (value + multiple - 1) // multiple * multiple


def swizzle_row_tile(is_sf_8x4_layout: bool) -> int:
    return ROWS_8X4 if is_sf_8x4_layout else ROWS_128X4


def swizzled_sf_shape(rows, sf_columns: int, is_sf_8x4_layout: bool):
    """(padded rows, padded columns) of the swizzled buffer for ``rows`` x ``sf_columns`` factors."""
    return round_up(rows, swizzle_row_tile(is_sf_8x4_layout)), round_up(sf_columns, SF_COLUMN_TILE)


def swizzle(sf: torch.Tensor, is_sf_8x4_layout: bool) -> torch.Tensor:
    """Lay a row-major ``[rows, sf_columns]`` uint8 grid out as the kernel does, padding with zeros.

    128x4: ``[m_tile, k_tile, 32 (outer m), 4 (inner m), 4 (inner k)]`` where a row index is
    ``m_tile * 128 + inner_m * 32 + outer_m``. 8x4: ``[m_tile, k_tile, 8, 4]``.
    Returns the flat buffer.
    """
    rows, columns = sf.shape
    padded_rows, padded_columns = swizzled_sf_shape(rows, columns, is_sf_8x4_layout)
    padded = sf.new_zeros((padded_rows, padded_columns))
    padded[:rows, :columns] = sf
    k_tiles = padded_columns // SF_COLUMN_TILE
    if is_sf_8x4_layout:
        tiles = padded.view(padded_rows // ROWS_8X4, ROWS_8X4, k_tiles, SF_COLUMN_TILE)
        return tiles.permute(0, 2, 1, 3).reshape(-1)
    tiles = padded.view(padded_rows // ROWS_128X4, 4, 32, k_tiles, SF_COLUMN_TILE)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle(buffer: torch.Tensor, rows: int, sf_columns: int, is_sf_8x4_layout: bool) -> torch.Tensor:
    """Inverse of :func:`swizzle`: the ``[rows, sf_columns]`` grid out of a flat swizzled buffer."""
    padded_rows, padded_columns = swizzled_sf_shape(rows, sf_columns, is_sf_8x4_layout)
    k_tiles = padded_columns // SF_COLUMN_TILE
    flat = buffer.reshape(-1)[: padded_rows * padded_columns]
    if is_sf_8x4_layout:
        tiles = flat.view(padded_rows // ROWS_8X4, k_tiles, ROWS_8X4, SF_COLUMN_TILE)
        grid = tiles.permute(0, 2, 1, 3)
    else:
        tiles = flat.view(padded_rows // ROWS_128X4, k_tiles, 32, 4, SF_COLUMN_TILE)
        grid = tiles.permute(0, 3, 2, 1, 4)
    return grid.reshape(padded_rows, padded_columns)[:rows, :sf_columns]
