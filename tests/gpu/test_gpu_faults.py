"""Faults that need a GPU: a failing JIT build, and eight processes racing one cold build.

Both use a fresh FlashInfer workspace (FLASHINFER_WORKSPACE_BASE) so a build really happens, and a CUDA
home whose bin/nvcc is a small script in front of the real nvcc (everything else is symlinked): it
counts invocations, or fails on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path



REAL_NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def cuda_home_with_nvcc(root: Path, script: str) -> Path:
    real_home = Path(REAL_NVCC).resolve().parent.parent
    home = root / "cuda"
    (home / "bin").mkdir(parents=True)
    for entry in real_home.iterdir():
        if entry.name != "bin":
            (home / entry.name).symlink_to(entry)
    for tool in (real_home / "bin").iterdir():
        if tool.name != "nvcc":
            (home / "bin" / tool.name).symlink_to(tool)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n" + script.replace("REAL_NVCC", str(Path(REAL_NVCC).resolve())))
    nvcc.chmod(0o755)
    return home


STATUS = ("import json, fp4_dynamo_shim, flashinfer, flashinfer.jit.cpp_ext as c; s = fp4_dynamo_shim.status(); "
          "print(json.dumps({'applied': s['applied'], 'problem': s['problem'], "
          "'shimmed': getattr(flashinfer.fp4_quantize, '__fp4_dynamo_shim__', False), "
          "'cuda_version_patched': c.get_cuda_version.__module__ != 'flashinfer.jit.cpp_ext', "
          "'load_seconds': [d['load_seconds'] for d in s['devices'] or []]}))")


def run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_a_failing_jit_build_leaves_flashinfer_untouched_and_says_why(tmp_path):
    home = cuda_home_with_nvcc(tmp_path, 'case "$*" in *--version*) exec REAL_NVCC "$@";; esac\n'
                                         'echo "nvcc: simulated failure" >&2; exit 1\n')
    result = run(STATUS, {"FP4_DYNAMO_SHIM_FALLBACK": "launch", "CUDA_HOME": str(home),
                          "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "workspace")})
    assert result.returncode == 0, result.stderr[-3000:]
    status = json.loads(result.stdout.strip().splitlines()[-1])
    assert not status["applied"] and not status["shimmed"] and not status["cuda_version_patched"]
    assert "FlashInfer was left untouched" in status["problem"]
    assert "fp4_dynamo_shim not applied" in result.stderr  # the one warning


def test_eight_processes_on_a_cold_cache_all_apply_and_build_once(tmp_path):
    log = tmp_path / "nvcc.log"
    home = cuda_home_with_nvcc(tmp_path, f'echo "$*" >> {log}\nexec REAL_NVCC "$@"\n')
    env = {"FP4_DYNAMO_SHIM_FALLBACK": "launch", "CUDA_HOME": str(home)}

    single = run(STATUS, {**env, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "single")})
    assert json.loads(single.stdout.strip().splitlines()[-1])["applied"], single.stderr[-2000:]
    compiles_for_one_build = sum("--version" not in line for line in log.read_text().splitlines())
    assert compiles_for_one_build > 0
    log.write_text("")

    workspace = {**env, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "racing")}
    processes = [subprocess.Popen([sys.executable, "-c", STATUS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, **workspace}) for _ in range(8)]
    outputs = [process.communicate(timeout=600) for process in processes]
    statuses = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(s["applied"] and s["shimmed"] for s in statuses), [err[-500:] for _, err in outputs]
    compiles = sum("--version" not in line for line in log.read_text().splitlines())
    assert compiles == compiles_for_one_build  # FlashInfer's file lock: one build, seven loads
