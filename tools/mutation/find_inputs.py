"""Search for quantizer inputs that tell a surviving mutant of ``fp4_arithmetic`` from the original.

Run inside a tree that mutmut has mutated (``run_mutmut.py --keep DIR`` leaves one per group); for each
named mutant it draws random calls of ``reference.quantize`` (every release row's arithmetic, every mode the
row has, both scale formats, 16-bit and FP8 input, global scales over the float32 range, values with
NaN, infinities and subnormals) and prints, as JSON lines, the first call whose bytes differ from the
unmutated function's (or that raises only under the mutant). Nothing is found for an equivalent mutant.
The calls found become fixed cases of ``tests/fp4/test_properties.py``'s mode battery, whose expected bytes come
from the independent oracle, not from the reference the search ran.

    cd DIR/arithmetic/mutants && python ../../../tools/mutation/find_inputs.py NAME... [--tries 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.abspath("src"))
os.environ["MUTANT_UNDER_TEST"] = ""

import torch  # noqa: E402
from mutmut.mutation.trampoline import set_mutant_under_test  # noqa: E402

from _fp4_dynamo_shim.fp4 import reference  # noqa: E402
from _fp4_dynamo_shim.fp4 import releases as targets
from _fp4_dynamo_shim.fp4.arithmetic import FourOverSix, Recipe  # noqa: E402

VERSIONS = ("0.6.11", "0.6.12", "0.6.13", "0.7.1", "0.7.4")
SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 2.0 ** -130, -(2.0 ** -133), 2.0 ** -24, 65504.0,
           0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, 448.0, 3.0e38]
SCALES = [1.0, 2688.0, 14.517072677612305, 1.7, 2.0 ** -12, 0.5, 3.0, 1e-30, 1e30, -2.0, float("inf"), 0.0]


def draw_call(rng: random.Random, four_over_six_only: bool = False) -> dict:
    version = rng.choice(VERSIONS[1:] if four_over_six_only else VERSIONS)
    arithmetic = targets.target_for(version).arithmetic
    dtype = rng.choice(["bfloat16", "float16"] if four_over_six_only else ["bfloat16", "float16", "float8_e4m3fn"])
    ue8m0 = rng.random() < 0.3 and not four_over_six_only
    fast_math = rng.random() < 0.5 or not arithmetic.fast_math_switches
    four_over_six = None
    if not ue8m0 and dtype != "float8_e4m3fn" and arithmetic.four_over_six != "none" and (
            four_over_six_only or rng.random() < 0.6):
        four_over_six = [rng.random() < 0.5, rng.random() < 0.5]  # mse, fast_error
    rows, blocks = rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2])
    size = 32 if ue8m0 else 16
    magnitude = 2.0 ** rng.randint(-20, 20)
    values = []
    for _ in range(rows * blocks * size):
        roll = rng.random()
        values.append(rng.choice(SPECIAL) if roll < 0.08 else 0.0 if roll < 0.12 else rng.gauss(0, 1) * magnitude)
    g = rng.choice(SCALES) if rng.random() < 0.5 else 2.0 ** rng.uniform(-30, 30)
    return dict(version=version, dtype=dtype, ue8m0=ue8m0, fast_math=fast_math, four_over_six=four_over_six,
                rows=rows, columns=blocks * size, values=values, global_scale=None if ue8m0 and rng.random() < 0.5 else g,
                inversed=rng.random() < 0.3)


def run(call: dict):
    x = torch.tensor(call["values"], dtype=torch.float32).reshape(call["rows"], call["columns"])
    dtype = getattr(torch, call["dtype"])
    if dtype is torch.float8_e4m3fn:
        x = x.clamp(-448, 448)
    x = x.to(dtype)
    arithmetic = targets.target_for(call["version"]).arithmetic
    setting = call["four_over_six"]
    recipe = Recipe(arithmetic, call["fast_math"], FourOverSix(*setting) if setting else None)
    scale = None if call["global_scale"] is None else torch.tensor([call["global_scale"]], dtype=torch.float32)
    try:
        packed, sf = reference.quantize(x, scale, 32 if call["ue8m0"] else 16, call["ue8m0"], call["inversed"],
                                        recipe=recipe)
        return packed.tolist(), sf.tolist(), str(sf.dtype)
    except Exception as error:  # a mutant that raises is told apart too
        return f"{type(error).__name__}: {error}"


def _f32_bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _f32_of(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def boundary_calls(rng: random.Random, call: dict):
    """Calls of ``call``'s block at the global scales where the unmutated output changes (to the float32 ulp):
    a mutant that only rounds the 4over6 candidates' errors differently is told apart only at such a tie."""
    def output(bits):
        set_mutant_under_test("")
        return run({**call, "global_scale": _f32_of(bits)})

    grid = [_f32_bits(2.0 ** (k / 8.0)) for k in range(-64, 65)]
    outputs = [output(bits) for bits in grid]
    for (low, low_out), (high, high_out) in zip(zip(grid, outputs), zip(grid[1:], outputs[1:])):
        if low_out == high_out:
            continue
        while high - low > 1:
            middle = (low + high) // 2
            if output(middle) == low_out:
                low = middle
            else:
                high, high_out = middle, output(middle)
        for bits in range(low - 2, high + 3):
            yield {**call, "global_scale": _f32_of(bits)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--tries", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--four-over-six", action="store_true", help="draw 4over6 calls only")
    parser.add_argument("--ties", action="store_true",
                        help="try each drawn block at the global scales where its output changes")
    options = parser.parse_args()
    for name in options.names:
        rng = random.Random(options.seed)
        found = None
        for _ in range(options.tries):
            drawn = draw_call(rng, options.four_over_six)
            for call in boundary_calls(rng, drawn) if options.ties else [drawn]:
                set_mutant_under_test("")
                want = run(call)
                set_mutant_under_test(name)
                got = run(call)
                set_mutant_under_test("")
                if got != want:
                    found = call
                    break
            if found:
                break
        print(json.dumps({"mutant": name, "call": found}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
