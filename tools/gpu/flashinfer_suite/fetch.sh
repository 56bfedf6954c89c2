#!/usr/bin/env bash
# Copy FlashInfer's own GPU tests for norm, rope, activation, sampling and top-k, at the tags of the releases
# the GPU machine runs, into the ignored folder .fitests/<version>/ (it travels with a command: about 0.4 MB).
#   bash tools/gpu/flashinfer_suite/fetch.sh [MIRROR]
# MIRROR: a git clone of flashinfer-ai/flashinfer (default: the fetch tool's snapshot under /work/.mirror).
set -euo pipefail
cd "$(dirname "$0")/../../.."
mirror=${1:-/work/.mirror/flashinfer-ai+flashinfer/repo}
files=(tests/__init__.py tests/conftest.py tests/test_helpers tests/utils/__init__.py tests/utils/test_norm.py
       tests/utils/test_activation.py tests/utils/test_sampling.py tests/utils/test_topk.py tests/attention/test_rope.py)
for version in 0.6.3 0.6.12; do
  rm -rf ".fitests/$version" && mkdir -p ".fitests/$version"
  present=()
  for f in "${files[@]}"; do
    git -C "$mirror" cat-file -e "v$version:$f" 2>/dev/null && present+=("$f")
  done
  git -C "$mirror" archive "v$version" "${present[@]}" | tar -x -C ".fitests/$version"
  touch ".fitests/$version/tests/attention/__init__.py"
  echo "$version: $(find ".fitests/$version" -name '*.py' | wc -l) files"
done
du -sh .fitests
