#!/usr/bin/env bash
# Install, on the GPU machine, what tools/gpu/fetch.sh brought (each set travels with its own command):
#   bash tools/gpu/stage.sh kernel      unpack .sgl/k (the slimmed sgl_kernel) into /tmp/stage/sk
#   bash tools/gpu/stage.sh engine      .sgl/w into /tmp/site, plus /tmp/stage/sk: SGLang 0.5.11's engine
#   bash tools/gpu/stage.sh kernel-0.5.14  unpack .sgl14/k (sglang-kernel 0.4.4, slimmed) into /tmp/site14
#   bash tools/gpu/stage.sh engine-0.5.14 w1|w2  .sgl14/<part> into /tmp/site14 (one part per command): SGLang 0.5.14
#   bash tools/gpu/stage.sh suite       .whl into /tmp/site059: FlashInfer 0.6.3 + SGLang 0.5.9's compile path
#   bash tools/gpu/stage.sh flashinfer V .fi<V> into /tmp/site<V>
#   bash tools/gpu/stage.sh shim        this project's wheel (.ourwheel) into python3's own site-packages
#   bash tools/gpu/stage.sh suite-extras  the pure-Python part of .sgl/w into /tmp/site059 (0.5.9's modelopt
#                                       module imports more of SGLang than its compile path: openai, ...)
# Then put the site folder first on PYTHONPATH (tests/gpu/run.sh does it with FP4_DYNAMO_SHIM_TEST_SITE).
set -euo pipefail
cd "$(dirname "$0")/../.."
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
case "${1:-}" in
  kernel) mkdir -p /tmp/stage/sk && tar xzf .sgl/k/sgl_kernel_slim.tgz -C /tmp/stage/sk ;;
  engine) install /tmp/site .sgl/w/*.whl && cp -r /tmp/stage/sk/. /tmp/site/ ;;
  kernel-0.5.14) mkdir -p /tmp/site14 && tar xzf .sgl14/k/sgl_kernel_slim.tgz -C /tmp/site14 ;;
  engine-0.5.14) install /tmp/site14 ".sgl14/${2:?w1 or w2}"/*.whl ;;
  suite) install /tmp/site059 .whl/*.whl ;;
  flashinfer) install "/tmp/site$2" ".fi$2"/*.whl ;;
  shim) python3 -m pip install -q --no-index --no-deps --force-reinstall .ourwheel/fp4_dynamo_shim-*.whl ;;
  suite-extras) install /tmp/site059 $(ls .sgl/w/*.whl | grep -v -E '/(sglang|flashinfer_python|transformers|tokenizers)-') ;;
  *) sed -n '2,11p' "$0"; exit 3 ;;
esac
