#!/usr/bin/env bash
# FlashInfer's own GPU tests (norm, rope, activation, sampling, top-k) of one release, with the shim applied:
#   bash tools/gpu/flashinfer_suite/run.sh VERSION
# Needs .fitests/VERSION (tools/gpu/flashinfer_suite/fetch.sh, here) and that release importable (PYTHONPATH).
# Results as JSON under $OUT (flashinfer_suite_<VERSION>_<run>.json):
#   eager            every declared op on, FlashInfer's tests as written (FI_SUITE_CASES_EAGER per test, default 2);
#   eager_no_shim    the eager failures again with FP4_DYNAMO_SHIM_DISABLE=1: a failure there too is FlashInfer's own
#                    (FI_SUITE_EAGER=0 skips these two: the compiled runs alone, when device time is short);
#   compile          FLASHINFER_TEST_TORCH_COMPILE=1: FlashInfer's conftest compiles its public functions with
#                    fullgraph=True, inductor (FI_SUITE_CASES_COMPILE per test, default 1);
#   compile_layer_off  the same with FP4_DYNAMO_SHIM_FLASHINFER_OPS=off on norm and activation: must fail
#                    (without the layer FlashInfer's functions do not trace).
set -uo pipefail
version=${1:?version}
repo=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$repo/.fitests/$version" || exit 3
export PYTHONPATH=$repo/tools/gpu/flashinfer_suite:$repo/src${PYTHONPATH:+:$PYTHONPATH}
export OUT=${OUT:-/tmp}
# FI_SUITE_FILES (space-separated) runs fewer, e.g. what a call stopped by its limit did not reach.
read -r -a files <<< "${FI_SUITE_FILES:-tests/utils/test_norm.py tests/attention/test_rope.py \
tests/utils/test_activation.py tests/utils/test_sampling.py tests/utils/test_topk.py}"
run() { python3 -m pytest -q --rootdir . -p shim_plugin -p no:cacheprovider --maxfail=30 "$@" 2>&1 | tail -12; }
if [ "${FI_SUITE_EAGER:-1}" != 0 ]; then
  FI_SUITE_LABEL=${version}_eager FI_SUITE_CASES=${FI_SUITE_CASES_EAGER:-2} run "${files[@]}"
  failed=$(python3 -c "import json,sys; print(' '.join(f['test'] for f in json.load(open(sys.argv[1]))['failures']))" \
           "$OUT/flashinfer_suite_${version}_eager.json" 2>/dev/null)
  if [ -n "$failed" ]; then
    FI_SUITE_LABEL=${version}_eager_no_shim FI_SUITE_CASES=0 FP4_DYNAMO_SHIM_DISABLE=1 run $failed
  fi
fi
FI_SUITE_LABEL=${version}_compile FI_SUITE_CASES=${FI_SUITE_CASES_COMPILE:-1} FLASHINFER_TEST_TORCH_COMPILE=1 run "${files[@]}"
FI_SUITE_LABEL=${version}_compile_layer_off FI_SUITE_CASES=1 FP4_DYNAMO_SHIM_FLASHINFER_OPS=off \
  FLASHINFER_TEST_TORCH_COMPILE=1 run tests/utils/test_norm.py tests/utils/test_activation.py
for f in "$OUT"/flashinfer_suite_"$version"_*.json; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], d['gate'], d['files'])" "$f"
done
