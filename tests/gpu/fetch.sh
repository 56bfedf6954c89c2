#!/usr/bin/env bash
# Bring what the GPU machine lacks, as wheels, into ignored folders of this checkout (that machine has no
# network; each command there carries at most 64 MiB, so the sets below travel with separate commands).
#
#   bash tests/gpu/fetch.sh suite        .whl/        flashinfer 0.6.3 + what `import sglang` (0.5.9) and its
#                                                     compile path need on that image (about 24 MB): the GPU suite
#   bash tests/gpu/fetch.sh engine       .sgl/w/      SGLang 0.5.11's engine import closure (about 53 MB of wheels:
#                                                     sglang, flashinfer 0.6.8.post1, transformers 5.6.0, ...)
#                                        .sgl/k/      sgl_kernel_slim.tgz: sglang-kernel 0.4.2 without FlashAttention-3's
#                                                     1 GB library and the sm100 build (26 MB; SM90 loads sm90/common_ops)
#   bash tests/gpu/fetch.sh flashinfer V .fi<V>/      one FlashInfer release (e.g. 0.6.12 for P1 against FlashInfer's op)
#   bash tests/gpu/fetch.sh shim         .ourwheel/   this project's wheel (the hook and plugin routes need a real install)
#
# Why these versions: SGLang 0.5.11 pins torch 2.11.0 (the GPU machine's torch) and sglang-kernel 0.4.2 built for
# it, so its real engine runs there; 0.5.9 pins torch 2.9.1, so only its compile path runs (with a stand-in
# sgl_kernel). Add each folder to .git/info/exclude and name it in the device tool's `carry`.
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
  flashinfer)
    download ".fi${2:?version}" "flashinfer-python==$2" apache-tvm-ffi==0.1.15.post2 ;;
  shim)
    python3 -m pip wheel -q --no-deps -w .ourwheel . ;;  # build isolation: a fresh venv has only pip
  *)
    sed -n '2,17p' "$0"; exit 3 ;;
esac
du -sh .whl .sgl/* .fi* .ourwheel 2>/dev/null || true
