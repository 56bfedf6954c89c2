#!/usr/bin/env bash
# Copy FlashInfer's own GPU tests for norm, rope, activation, sampling, top-k, batch decode and batch prefill, at the tags of the releases
# the GPU machine runs, into the ignored folder .fitests/<version>/ (it travels with a command: about 0.4 MB).
#   bash tools/gpu/flashinfer_suite/fetch.sh [MIRROR]
# MIRROR: a git clone of flashinfer-ai/flashinfer (default: the fetch tool's snapshot under /work/.mirror).
set -euo pipefail
cd "$(dirname "$0")/../../.."
mirror=${1:-/work/.mirror/flashinfer-ai+flashinfer/repo}
files=(tests/__init__.py tests/conftest.py tests/test_helpers tests/utils/__init__.py tests/utils/test_norm.py
       tests/utils/test_activation.py tests/utils/test_sampling.py tests/utils/test_topk.py tests/attention/test_rope.py
       tests/attention/test_batch_decode_kernels.py tests/attention/test_batch_prefill_kernels.py)
for version in 0.6.3 0.6.12; do
  rm -rf ".fitests/$version" && mkdir -p ".fitests/$version"
  present=()
  for f in "${files[@]}"; do
    git -C "$mirror" cat-file -e "v$version:$f" 2>/dev/null && present+=("$f")
  done
  git -C "$mirror" archive "v$version" "${present[@]}" | tar -x -C ".fitests/$version"
  touch ".fitests/$version/tests/attention/__init__.py"
  # FlashInfer's conftest finds a compiled function's module by walking attributes from the package, which
  # fails where a package re-exports a function under its submodule's name (0.6.12:
  # flashinfer.quantization.packbits is the function, not the module): "Failed to monkeypatch:
  # flashinfer.quantization.packbits.packbits" before any test runs. Look the module up by name, then walk
  # the qualified name (a method's class).
  python3 - ".fitests/$version/tests/conftest.py" <<'PY'
import pathlib, sys
conftest = pathlib.Path(sys.argv[1])
walk = ("    module = flashinfer\n    for component in components[1:-1]:\n"
        "        module = getattr(module, component)\n")
by_name = ("    module = sys.modules[fn.__module__]\n    for component in fn.__qualname__.split('.')[:-1]:\n"
           "        module = getattr(module, component)\n")
# Its warm-up calls the function eagerly on the test's own tensors before the compiled call: a function that
# writes into its arguments then writes twice (chain_speculative_sampling adds into its accepted and emitted
# counts, sampling.cuh `+=`, and its test's check of them fails). Warm up on copies.
warm_up = "            func(*args, **kwargs)\n"
on_copies = ("            _copy = lambda v: v.clone() if isinstance(v, torch.Tensor) else v\n"
             "            func(*map(_copy, args), **{k: _copy(v) for k, v in kwargs.items()})\n")
text = conftest.read_text()
if walk in text:
    text = text.replace(walk, by_name).replace("\nimport os\n", "\nimport os\nimport sys\n", 1)
conftest.write_text(text.replace(warm_up, on_copies))
PY
  # The attention files' module fixture builds every (dtype, head dim, encoding) module at once, dozens of
  # minutes on the H200, most of them for cases FI_SUITE_CASES leaves out: build on first use instead.
  sed -i 's/autouse=not has_flashinfer_jit_cache(),/autouse=False,/' ".fitests/$version"/tests/attention/test_batch_*_kernels.py
  echo "$version: $(find ".fitests/$version" -name '*.py' | wc -l) files"
done
du -sh .fitests
