#!/usr/bin/env bash
# Bring what the GPU machine lacks, as wheels, into ignored folders of this checkout (that machine has no
# network; each command there carries at most 64 MiB, so the sets below travel with separate commands).
#
#   bash tools/gpu/fetch.sh suite        .whl/        flashinfer 0.6.3 + what `import sglang` (0.5.9) and its
#                                                     compile path need on that image (about 24 MB): the GPU suite
#   bash tools/gpu/fetch.sh engine       .sgl/w/      SGLang 0.5.11's engine import closure (about 53 MB of wheels:
#                                                     sglang, flashinfer 0.6.8.post1, transformers 5.6.0, ...)
#                                        .sgl/k/      sgl_kernel_slim.tgz: sglang-kernel 0.4.2 without FlashAttention-3's
#                                                     1 GB library and the sm100 build (26 MB; SM90 loads sm90/common_ops)
#   bash tools/gpu/fetch.sh engine-0.5.14 .sgl14/w1/, .sgl14/w2/  SGLang 0.5.14's engine import closure (about 105 MB
#                                                     of wheels in two folders under 60 MB each: sglang, flashinfer
#                                                     0.6.12, transformers 5.8.1, xgrammar 0.2.1, ...)
#                                        .sgl14/k/    sgl_kernel_slim.tgz: sglang-kernel 0.4.4 without FlashAttention-3
#                                                     (flash_ops.abi3.so, 1.76 GB) and sm100/ (SM90 loads sm90/common_ops)
#   bash tools/gpu/fetch.sh flashinfer V .fi<V>/      one FlashInfer release (e.g. 0.6.12 for P1 against FlashInfer's op)
#   bash tools/gpu/fetch.sh shim         .ourwheel/   this project's wheel (the hook and plugin routes need a real install)
#   bash tools/gpu/fetch.sh xdist        .gputools/   pytest-xdist and execnet: GPU tests in parallel processes, so
#                                                     their JIT builds run at once (the machine has 16 cores)
#
# Why these versions: SGLang 0.5.11 pins torch 2.11.0 (the GPU machine's torch) and sglang-kernel 0.4.2 built for
# it, so its real engine runs there; 0.5.14 pins torch 2.11.0 and sglang-kernel 0.4.4 too; 0.5.9 pins torch
# 2.9.1, so only its compile path runs (with a stand-in sgl_kernel). Add each folder to .git/info/exclude and
# name it in the device tool's `carry`.
#
# engine-0.5.14's list was found on CPU: the wheels installed with --no-deps into a scratch target over a base
# holding what the GPU machine has (numpy, requests, aiohttp, huggingface-hub 1.x, safetensors, pillow, pyyaml,
# regex, tqdm, triton, typer, torchvision, ...), then `import sglang.srt.entrypoints.engine`, model_runner, the
# Llama/Qwen3/Qwen3-MoE models and modelopt_quant until nothing was missing (CUDA-only pieces stood in there:
# sgl_kernel, flashinfer.comm's libcudart). Against 0.5.11's list: SGLang's pins (flashinfer 0.6.12,
# apache-tvm-ffi 0.1.9, transformers 5.8.1, xgrammar 0.2.1) and annotated-doc (fastapi's).
set -euo pipefail
cd "$(dirname "$0")/../.."
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64)
download() { python3 -m pip download -q --no-deps "${plat[@]}" -d "$@"; }
case "${1:-}" in
  suite)
    download .whl flashinfer-python==0.6.3 apache-tvm-ffi==0.1.15.post2 sglang==0.5.9 orjson pybase64 pyzmq \
      starlette pydantic pydantic-core annotated-types typing-inspection python-dotenv ipython decorator jedi \
      matplotlib-inline pexpect prompt_toolkit stack_data traitlets parso wcwidth executing asttokens pure_eval \
      ptyprocess ipython_pygments_lexers ;;
  engine)
    mkdir -p .sgl/w .sgl/k
    download .sgl/w sglang==0.5.11 flashinfer-python==0.6.8.post1 apache-tvm-ffi==0.1.15.post2 transformers==5.6.0 \
      tokenizers==0.22.2 orjson pybase64 starlette fastapi uvicorn pydantic pydantic-core typing-inspection \
      annotated-types pyzmq httpx2 httpcore2 truststore opentelemetry-api importlib-metadata zipp msgspec \
      setproctitle partial-json-parser openai==2.6.1 distro jiter sniffio xgrammar compressed-tensors gguf \
      interegular blobfile==3.0.0 pycryptodomex python-multipart torchao==0.17.0 dill loguru \
      ipython decorator jedi parso matplotlib-inline pexpect ptyprocess prompt_toolkit wcwidth stack_data \
      executing asttokens pure_eval ipython_pygments_lexers traitlets
    scratch=$(mktemp -d)
    download "$scratch" sglang-kernel==0.4.2
    mkdir "$scratch/slim"
    python3 -m zipfile -e "$scratch"/sglang_kernel-0.4.2-*.whl "$scratch/slim"
    rm -rf "$scratch/slim/sgl_kernel/flash_ops.abi3.so" "$scratch/slim/sgl_kernel/sm100"
    find "$scratch/slim" -name '*.a' -delete
    rm -f "$scratch"/slim/lib/mscclpp.so.0* "$scratch"/slim/lib/mscclpp_nccl.so.0*
    tar czf .sgl/k/sgl_kernel_slim.tgz -C "$scratch/slim" .
    rm -rf "$scratch" ;;
  engine-0.5.14)
    scratch=$(mktemp -d)
    download "$scratch" sglang==0.5.14 flashinfer-python==0.6.12 apache-tvm-ffi==0.1.9 transformers==5.8.1 \
      tokenizers==0.22.2 orjson pybase64 starlette fastapi uvicorn pydantic pydantic-core typing-inspection \
      annotated-types annotated-doc pyzmq httpx2 httpcore2 truststore opentelemetry-api importlib-metadata zipp \
      msgspec setproctitle partial-json-parser openai==2.6.1 distro jiter sniffio xgrammar==0.2.1 \
      compressed-tensors gguf interegular blobfile==3.0.0 pycryptodomex python-multipart torchao==0.17.0 dill \
      loguru ipython decorator jedi parso matplotlib-inline pexpect ptyprocess prompt_toolkit wcwidth stack_data \
      executing asttokens pure_eval ipython_pygments_lexers traitlets
    # Two folders, each under what one command carries: the largest wheels first, each into the fuller one that
    # still has room.
    mkdir -p .sgl14/w1 .sgl14/w2 .sgl14/k
    python3 - "$scratch" <<'PY'
import pathlib, shutil, sys
limit, sizes = 60 * 2**20, {"w1": 0, "w2": 0}
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl"), key=lambda p: -p.stat().st_size):
    room = [f for f in sorted(sizes, key=sizes.get, reverse=True) if sizes[f] + wheel.stat().st_size <= limit]
    if not room:
        sys.exit(f"{wheel.name} does not fit in two folders of {limit >> 20} MiB")
    shutil.move(str(wheel), f".sgl14/{room[0]}/{wheel.name}")
    sizes[room[0]] += pathlib.Path(f".sgl14/{room[0]}/{wheel.name}").stat().st_size
PY
    download "$scratch" sglang-kernel==0.4.4
    mkdir "$scratch/slim"
    python3 -m zipfile -e "$scratch"/sglang_kernel-0.4.4-*.whl "$scratch/slim"
    # SM90: load_utils.py loads sm90/common_ops.abi3.so; flash_ops (FA3) is imported in a try by flash_attn.py
    # ("Can not import FA3" in the log); flashmla_ops and spatial_ops only when used (kept, 3 MB).
    rm -rf "$scratch/slim/sgl_kernel/flash_ops.abi3.so" "$scratch/slim/sgl_kernel/sm100"
    find "$scratch/slim" -name '*.a' -delete
    tar czf .sgl14/k/sgl_kernel_slim.tgz -C "$scratch/slim" .
    rm -rf "$scratch" ;;
  flashinfer)
    download ".fi${2:?version}" "flashinfer-python==$2" apache-tvm-ffi==0.1.15.post2 ;;
  xdist)
    download .gputools pytest-xdist execnet ;;
  shim)
    python3 -m pip wheel -q --no-deps -w .ourwheel . ;;  # build isolation: a fresh venv has only pip
  *)
    sed -n '2,22p' "$0"; exit 3 ;;
esac
du -sh .whl .sgl/* .sgl14/* .fi* .ourwheel 2>/dev/null || true
