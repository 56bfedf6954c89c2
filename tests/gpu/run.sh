#!/usr/bin/env bash
# The GPU proof in one command, on the GPU machine (see ../shared/gpu/README.md for that machine):
#   bash tests/gpu/run.sh [pytest arguments]
# When present, installs the carried wheels (.whl/: FlashInfer, SGLang and the pure-Python packages they
# import) into /tmp/site, and points the activation test at a prebuilt wheel of this project
# (.ourwheel/); uses tests/gpu/stand_ins for sgl_kernel when the real one is not installed.
set -uo pipefail
cd "$(dirname "$0")/../.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
if compgen -G ".ourwheel/fp4_dynamo_shim-*.whl" > /dev/null; then
  FP4_DYNAMO_SHIM_TEST_WHEEL=$(ls "$PWD"/.ourwheel/fp4_dynamo_shim-*.whl | head -1)
  export FP4_DYNAMO_SHIM_TEST_WHEEL
fi
python3 -c "import sgl_kernel" 2> /dev/null || export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/tests/gpu/stand_ins
export FLASHINFER_NVCC_THREADS=${FLASHINFER_NVCC_THREADS:-4} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu "$@"
