#!/usr/bin/env bash
# FlashInfer's own GPU tests (norm, rope, activation, sampling, top-k) of one release, with the shim applied:
#   bash tests/gpu/flashinfer_suite/run.sh VERSION
# Needs .fitests/VERSION (tests/gpu/flashinfer_suite/fetch.sh, here) and that release importable (PYTHONPATH).
# Three runs, results as JSON under $OUT: eager with every declared op on; FLASHINFER_TEST_TORCH_COMPILE=1
# (FlashInfer compiles its functions with fullgraph=True) with every op on; and the same compiled run with the
# layer off on the first case of each norm/activation test, which must fail (without the layer FlashInfer's
# functions do not trace). FI_SUITE_CASES (default 3) parametrizations per test function.
set -uo pipefail
version=${1:?version}
repo=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$repo/.fitests/$version" || exit 3
export PYTHONPATH=$repo/tests/gpu/flashinfer_suite:$repo/src${PYTHONPATH:+:$PYTHONPATH}
export OUT=${OUT:-/tmp}
files=(tests/utils/test_norm.py tests/attention/test_rope.py tests/utils/test_activation.py
       tests/utils/test_sampling.py tests/utils/test_topk.py)
run() { python3 -m pytest -q -p shim_plugin -p no:cacheprovider --maxfail=20 "$@" 2>&1 | tail -15; }
FI_SUITE_LABEL=${version}_eager run "${files[@]}"
FI_SUITE_LABEL=${version}_compile FLASHINFER_TEST_TORCH_COMPILE=1 run "${files[@]}"
FI_SUITE_LABEL=${version}_compile_layer_off FI_SUITE_CASES=1 FP4_DYNAMO_SHIM_FLASHINFER_OPS=off \
  FLASHINFER_TEST_TORCH_COMPILE=1 run tests/utils/test_norm.py tests/utils/test_activation.py
for f in "$OUT"/flashinfer_suite_"$version"_*.json; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], d['gate'], d['files'])" "$f"
done
