#!/usr/bin/env bash
# FlashInfer's declared ops on the GPU machine, one command per FlashInfer release, each < 10 min:
#   bash tools/gpu/declared_ops.sh 0.6.12   carry .fi0.6.12 .fitests   (+ P1 for four functions)
#   bash tools/gpu/declared_ops.sh 0.6.3    carry .whl .fitests        (FlashInfer 0.6.3 + SGLang 0.5.9's compile path)
#   bash tools/gpu/declared_ops.sh bench    carry .fi0.6.12            (P1 alone, if the 0.6.12 command ran out of time)
#   bash tools/gpu/declared_ops.sh 0.6.12 attention   carry .fi0.6.12 .fitests .gputools
#        the attention ops instead: tests/gpu/test_gpu_attention.py (6 pytest-xdist workers when .gputools holds
#        pytest-xdist and execnet: each builds the modules its tests need, in parallel) and FlashInfer's own batch
#        decode and batch prefill tests with their calls compiled, at once (about 9 minutes from a cold JIT cache)
# Here first: bash tools/gpu/fetch.sh suite; bash tools/gpu/fetch.sh flashinfer 0.6.12;
#             bash tools/gpu/flashinfer_suite/fetch.sh
# Steps share one deadline (DEADLINE seconds, default 570): the JIT modules are built in parallel first, then at
# once tests/gpu/test_gpu_declared.py (writes $OUT/declared_report_<version>.json), FlashInfer's own tests
# (tools/gpu/flashinfer_suite/run.sh) and, on 0.6.3, SGLang's NSA LayerNorm; P1 (0.6.12) last. Logs, JSON in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:?0.6.3, 0.6.12 or bench}
part=${2:-}
out=${OUT:-/tmp/declared_ops}; mkdir -p "$out"; export OUT=$out
version=$what; [ "$what" = bench ] && version=0.6.12
wheels=.fi$version; [ "$version" = 0.6.3 ] && wheels=.whl
site=/tmp/site-declared-$version
if [ ! -d "$site" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
    $(compgen -G ".gputools/*.whl") || exit 3
fi
export PYTHONPATH=$site:$PWD/src:$PWD/tests/gpu:$PWD/tests
python3 -c "import sgl_kernel" 2> /dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/tests/gpu/stand_ins
export FLASHINFER_NVCC_THREADS=${FLASHINFER_NVCC_THREADS:-4} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
deadline=${DEADLINE:-570}
step() {  # step NAME CAP command...: at most CAP seconds, and never past the deadline
  local name=$1 cap=$2; shift 2
  local left=$((deadline - SECONDS - 5)); [ "$left" -lt "$cap" ] && cap=$left
  [ "$cap" -le 10 ] && { echo "== $name: no time left"; return; }
  echo "== $name (up to ${cap}s, at ${SECONDS}s)"
  timeout "$cap" "$@" > "$out/$name.log" 2>&1; local status=$?
  tail -30 "$out/$name.log"; echo "== $name: exit $status at ${SECONDS}s"
}
if [ "$part" = attention ]; then
  workers=(); python3 -c "import xdist" 2> /dev/null && workers=(-n 6)
  step "gpu-attention-$version" 560 python3 -m pytest -q -rs -p no:cacheprovider "${workers[@]}" \
    tests/gpu/test_gpu_attention.py --junitxml="$out/gpu_attention_$version.xml" &
  FI_SUITE_FILES="tests/attention/test_batch_decode_kernels.py tests/attention/test_batch_prefill_kernels.py" \
    step "flashinfer-suite-attention-$version" 560 bash tools/gpu/flashinfer_suite/run.sh "$version" &
  wait
  exit 0
fi
step "warmup-$version" 240 python3 tools/gpu/declared_warmup.py
if [ "$what" = bench ]; then
  step "p1-declared" 400 python3 benchmarks/p1_declared.py --save "$out"
  exit 0
fi
# After the JIT build the three test steps share the GPU at once (each writes its JSON after every test, so
# one cut short by the deadline still reports what it measured); P1 runs last and alone, timing needs the GPU.
step "gpu-declared-$version" 330 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_declared.py \
  --junitxml="$out/gpu_declared_$version.xml" &
step "flashinfer-suite-$version" 330 bash tools/gpu/flashinfer_suite/run.sh "$version" &
if [ "$version" = 0.6.3 ]; then
  step "gpu-declared-sglang-$version" 120 python3 -m pytest -q -rs -p no:cacheprovider \
    tests/gpu/test_gpu_declared_sglang.py --junitxml="$out/gpu_declared_sglang_$version.xml" &
fi
wait
[ "$version" = 0.6.12 ] && step "p1-declared" 150 python3 benchmarks/p1_declared.py --save "$out"
ls -la "$out"
