"""The import hook in a spawned child on the GPU (an installed wheel, as SGLang's workers would see it)."""

from __future__ import annotations

import json
import subprocess

import pytest

import venvs


@pytest.mark.slow  # builds a venv (the CPU quick tier refuses that; on the GPU machine run.sh runs every tier)
def test_spawned_child_on_the_gpu_applies_the_shim_through_the_hook(tmp_path):
    environment = venvs.create(tmp_path / "installed")
    script = tmp_path / "parent.py"
    script.write_text(venvs.SPAWN_PARENT)
    result = subprocess.run([str(environment.python), str(script)], capture_output=True, text=True, timeout=600,
                            env={**venvs.passthrough_environment(), "FP4_DYNAMO_SHIM": "1",
                                 "FP4_DYNAMO_SHIM_FALLBACK": "launch", "FP4_DYNAMO_SHIM_TEST_DEVICE": "cuda"},
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    child = json.loads(result.stdout.strip().splitlines()[-1])
    assert child == {"patched": True, "shim_imported": True, "graphs": 1, "breaks": 0}
