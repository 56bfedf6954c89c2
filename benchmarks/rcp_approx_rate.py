"""How often the reference differs from the kernel's arithmetic because of the approximate reciprocal.

FlashInfer's FP4 quantize kernel has no SM90 body, so this builds, for the GPU at hand, a CUDA kernel
that performs the default NVFP4 recipe the way FlashInfer's ``cvt_warp_fp16_to_fp4`` does (built with
``-use_fast_math`` as FlashInfer builds it: FTZ multiplies, ``rcp.approx.ftz.f32``, the hardware e4m3
conversion, NVIDIA's e2m1 conversion from cuda_fp4.h), and once more with correctly rounded reciprocals
(``__frcp_rn``). Both are compared byte for byte with the shim's reference on the same GPU. The second
comparison must find nothing: everything but the reciprocal is the same arithmetic.

    python benchmarks/rcp_approx_rate.py [--blocks N] [--save]      # on a GPU machine (nvcc, ninja)
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import add_save_option, environment, now, table, write  # noqa: E402

SOURCE = r"""
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp4.h>
#include <torch/extension.h>

__device__ __forceinline__ float rcp_approx_ftz(float a) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

template <bool EXACT>
__device__ __forceinline__ float reciprocal(float a) { return EXACT ? __frcp_rn(a) : rcp_approx_ftz(a); }

template <bool EXACT>
__global__ void emulate(const __nv_bfloat16* x, const float* global_scale, uint8_t* packed, uint8_t* sf, long blocks) {
  long b = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  float v[16];
  float amax = 0.f;
  for (int i = 0; i < 16; ++i) {
    v[i] = __bfloat162float(x[b * 16 + i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  float g = *global_scale;
  float scale = g * (amax * reciprocal<EXACT>(6.0f));
  __nv_fp8_e4m3 narrow = __nv_fp8_e4m3(scale);
  sf[b] = narrow.__x;
  float output_scale = amax != 0.f ? reciprocal<EXACT>(static_cast<float>(narrow) * reciprocal<EXACT>(g)) : 0.f;
  for (int i = 0; i < 16; i += 2) {
    uint8_t low = __nv_cvt_float_to_fp4(v[i] * output_scale, __NV_E2M1, cudaRoundNearest) & 0xF;
    uint8_t high = __nv_cvt_float_to_fp4(v[i + 1] * output_scale, __NV_E2M1, cudaRoundNearest) & 0xF;
    packed[b * 8 + i / 2] = low | (high << 4);
  }
}

std::vector<torch::Tensor> run(torch::Tensor x, torch::Tensor global_scale, bool exact) {
  long blocks = x.numel() / 16;
  auto packed = torch::empty({x.numel() / 2}, x.options().dtype(torch::kUInt8));
  auto sf = torch::empty({blocks}, x.options().dtype(torch::kUInt8));
  int threads = 256;
  long grid = (blocks + threads - 1) / threads;
  auto xs = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>());
  if (exact) emulate<true><<<grid, threads>>>(xs, global_scale.data_ptr<float>(), packed.data_ptr<uint8_t>(), sf.data_ptr<uint8_t>(), blocks);
  else emulate<false><<<grid, threads>>>(xs, global_scale.data_ptr<float>(), packed.data_ptr<uint8_t>(), sf.data_ptr<uint8_t>(), blocks);
  return {packed, sf};
}
"""


def build():
    from torch.utils.cpp_extension import load_inline

    major, minor = torch.cuda.get_device_capability()
    return load_inline("fp4_dynamo_shim_rcp_emulation", cpp_sources="std::vector<torch::Tensor> run(torch::Tensor x, "
                       "torch::Tensor global_scale, bool exact);", cuda_sources=SOURCE, functions=["run"],
                       extra_cuda_cflags=["-use_fast_math", "-O3", f"-gencode=arch=compute_{major}{minor},"
                                          f"code=sm_{major}{minor}"], verbose=False)


def inputs(kind: str, blocks: int, seed: int):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "uniform":
        x = torch.rand(blocks, 16, device="cuda", generator=generator) * 2 - 1
    else:
        x = torch.randn(blocks, 16, device="cuda", generator=generator)
    x = x.to(torch.bfloat16)
    return x, (448.0 * 6.0 / x.float().abs().amax()).reshape(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1 << 22, help="16-element blocks per input (default 4 Mi)")
    parser.add_argument("--seeds", type=int, default=2)
    add_save_option(parser)
    options = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU (it builds an emulation kernel for it)", file=sys.stderr)
        return 2
    from _fp4_dynamo_shim.fp4 import arithmetic

    module = build()
    rows, results = [], []
    for kind in ("uniform", "normal"):
        for seed in range(options.seeds):
            x, scale = inputs(kind, options.blocks, seed)
            want_packed, want_sf = arithmetic.quantize(x, scale, 16, False)
            for exact in (False, True):
                packed, sf = module.run(x, scale, exact)
                torch.cuda.synchronize()
                packed_differ = int((packed != want_packed.reshape(-1)).sum())
                sf_differ = int((sf != want_sf.reshape(-1)).sum())
                result = {"inputs": kind, "seed": seed, "reciprocal": "exact" if exact else "rcp.approx.ftz",
                          "packed_bytes": packed.numel(), "packed_bytes_differing": packed_differ,
                          "scale_bytes": sf.numel(), "scale_bytes_differing": sf_differ,
                          "packed_rate": packed_differ / packed.numel()}
                results.append(result)
                rows.append([kind, seed, result["reciprocal"], f"{packed_differ:,} / {packed.numel():,}",
                             f"{result['packed_rate']:.2e}", f"{sf_differ:,} / {sf.numel():,}"])
    print(table(["inputs", "seed", "emulated reciprocal", "packed bytes differing", "rate", "scale bytes differing"],
                rows))
    approximate = [r for r in results if r["reciprocal"] != "exact"]
    total = sum(r["packed_bytes"] for r in approximate)
    differing = sum(r["packed_bytes_differing"] for r in approximate)
    exact_differing = sum(r["packed_bytes_differing"] + r["scale_bytes_differing"] for r in results
                          if r["reciprocal"] == "exact")
    print(f"rcp.approx: {differing:,} of {total:,} packed bytes differ ({differing / total:.2e}); "
          f"with exact reciprocals: {exact_differing} bytes differ")
    print(write("rcp_approx_rate", {"benchmark": "reference vs the kernel's arithmetic (emulated on this GPU)",
                                    "when": now(), "environment": environment(),
                                    "command": " ".join(["python"] + sys.argv), "results": results}, options.save))
    return 0 if exact_differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
