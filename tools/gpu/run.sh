#!/usr/bin/env bash
# The GPU proof in one command, on the GPU machine (see tools/gpu/fetch.sh for what it needs there):
#   bash tests/gpu/run.sh [pytest arguments]
#   bash tests/gpu/run.sh --mutations [run_mutations.py arguments]   # the GPU mutations, same environment
# When present: installs the carried wheels of .whl/ (FlashInfer, SGLang and what they import) into
# $FP4_DYNAMO_SHIM_TEST_SITE (default /tmp/site) and puts that first on PYTHONPATH; installs this project's
# wheel (.ourwheel/) into the interpreter's own site-packages, because the .pth hook and the plugin entry
# point only work from a real install (and points the venv tests at it); falls back to the sgl_kernel
# stand-in (tests/gpu/stand_ins) when the real sgl_kernel does not import.
set -uo pipefail
cd "$(dirname "$0")/../.."
site=${FP4_DYNAMO_SHIM_TEST_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d "$site" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit
fi
[ -d "$site" ] && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".ourwheel/fp4_dynamo_shim-*.whl" > /dev/null; then
  FP4_DYNAMO_SHIM_TEST_WHEEL=$(ls "$PWD"/.ourwheel/fp4_dynamo_shim-*.whl | head -1)
  export FP4_DYNAMO_SHIM_TEST_WHEEL
  python3 -m pip install -q --no-index --no-deps --force-reinstall "$FP4_DYNAMO_SHIM_TEST_WHEEL" || exit
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src
python3 -c "import sgl_kernel" 2> /dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/tests/gpu/stand_ins
export FLASHINFER_NVCC_THREADS=${FLASHINFER_NVCC_THREADS:-4} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
if [ "${1:-}" = "--mutations" ]; then
  shift
  exec python3 tools/mutation/run_mutations.py --gpu "$@"
fi
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu "$@"
