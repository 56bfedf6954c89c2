"""Hypothesis strategies for FP4 inputs: element values over the e2m1 grid, its ties and the edges; global scales
over the whole float32 range; matrices whose K/16 % 4 covers 0-3. Shared by the property tests of fp4_quantize and
of the FP4 family."""

from __future__ import annotations

import numpy
import torch
from hypothesis import strategies as st


def float32(value: float) -> float:
    """The nearest float32, as a Python float."""
    return float(numpy.float32(value))


#: Element values: ordinary ones, the e2m1 grid and its midpoints (ties), and the edges.
SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 2.0 ** -130, -(2.0 ** -133), 2.0 ** -24, 65504.0,
           0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, 448.0, 3.0e38]
elements = st.one_of(
    st.floats(-8.0, 8.0, width=32),
    st.sampled_from(SPECIAL),
    st.builds(lambda m, e: m * 2.0 ** e, st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -1.0, -4.0]),
              st.integers(-20, 20)),
)
global_scales = st.one_of(
    st.floats(width=32),  # the whole range: negative, subnormal, zero, inf, NaN
    st.floats(2.0 ** -10, 8192.0, width=32),
    st.sampled_from([1.0, 2688.0, 2.0 ** -12, 1.7, 14.517072677612305]),
)
dtypes = st.sampled_from([torch.bfloat16, torch.float16, torch.float8_e4m3fn])


@st.composite
def matrices(draw, sf_vec_size=16, rows=None, max_blocks=5, dtype=None):
    """(tensor, its exact element values as floats): K = sf_vec_size * blocks, blocks % 4 covering 0-3."""
    row_count = draw(rows if rows is not None else st.sampled_from([0, 1, 2, 3, 5, 127, 129]))
    blocks = draw(st.integers(1, max_blocks if row_count < 100 else 3))
    dtype = draw(dtypes) if dtype is None else dtype
    columns = blocks * sf_vec_size
    if row_count > 8:  # large M: a repeated random row keeps the oracle fast; rows differ by a sign flip
        base = draw(st.lists(elements, min_size=columns, max_size=columns))
        values = [[v if (r + i) % 3 else -v for i, v in enumerate(base)] for r in range(row_count)]
    else:
        values = draw(st.lists(st.lists(elements, min_size=columns, max_size=columns), min_size=row_count,
                               max_size=row_count))
    x = torch.tensor(values, dtype=torch.float32).reshape(row_count, columns)
    if dtype is torch.float8_e4m3fn:
        x = x.clamp(-448, 448)  # float8_e4m3fn has no inf; NaN stays NaN
    x = x.to(dtype)
    return x, x.float().tolist()
