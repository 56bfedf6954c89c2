"""Build the JIT modules the declared ops' GPU checks use, all in one ninja run (MAX_JOBS compile in parallel),
instead of one after the other on first use: on the H200 that is minutes of a 10-minute command.

    python3 tools/gpu/declared_warmup.py
"""

from __future__ import annotations

import importlib
import sys
import time

#: (module, generator, arguments): the JIT specs behind norm, rope, activation, sampling, top-k, cascade and
#: the DeepSeek-V3 routing; a generator this release lacks is skipped.
GENERATORS = (
    ("flashinfer.jit.norm", "gen_norm_module", ()),
    ("flashinfer.jit.rope", "gen_rope_module", ()),
    ("flashinfer.jit.activation", "gen_act_and_mul_module", ("silu",)),
    ("flashinfer.jit.activation", "gen_act_and_mul_module", ("gelu",)),
    ("flashinfer.jit.activation", "gen_act_and_mul_module", ("gelu_tanh",)),
    ("flashinfer.jit.sampling", "gen_sampling_module", ()),
    ("flashinfer.jit.topk", "gen_topk_module", ()),
    ("flashinfer.jit.cascade", "gen_cascade_module", ()),
    ("flashinfer.jit.dsv3_optimizations", "gen_dsv3_fused_routing_module", ()),
)


def main() -> int:
    import flashinfer.jit

    specs = []
    for module, name, arguments in GENERATORS:
        try:
            specs.append(getattr(importlib.import_module(module), name)(*arguments))
        except (ImportError, AttributeError, TypeError) as error:
            print(f"skipped {module}.{name}{arguments}: {error}", flush=True)
    started = time.perf_counter()
    flashinfer.jit.build_jit_specs(specs, verbose=False)
    print(f"built {len(specs)} JIT modules in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
