"""The import hook in a spawned child on the GPU (an installed wheel, as SGLang's workers would see it)."""

from __future__ import annotations

import json
import textwrap

import pytest

import venvs

CHILD = textwrap.dedent("""
    import json, multiprocessing, sys

    def child(queue):
        import flashinfer, torch
        patched = getattr(flashinfer.fp4_quantize, "__fp4_dynamo_shim__", False)
        x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
        scale = torch.tensor([1.0], device="cuda")
        torch._dynamo.mark_dynamic(x, 0)
        explanation = torch._dynamo.explain(lambda t, s: flashinfer.fp4_quantize(t, s))(x, scale)
        queue.put({"patched": patched, "graphs": explanation.graph_count, "breaks": explanation.graph_break_count,
                   "device": torch.cuda.get_device_name(0)})

    if __name__ == "__main__":
        assert "fp4_dynamo_shim" not in sys.modules
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        print(json.dumps(queue.get(timeout=500)))
        process.join()
""")


def test_spawned_child_on_the_gpu_applies_the_shim_through_the_hook(tmp_path):
    environment = venvs.create(tmp_path / "installed")
    script = tmp_path / "parent.py"
    script.write_text(CHILD)
    import subprocess

    result = subprocess.run([str(environment.python), str(script)], capture_output=True, text=True, timeout=600,
                            env={**venvs.passthrough_environment(), "FP4_DYNAMO_SHIM": "1",
                                 "FP4_DYNAMO_SHIM_FALLBACK": "launch"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    child = json.loads(result.stdout.strip().splitlines()[-1])
    assert child["patched"] and (child["graphs"], child["breaks"]) == (1, 0)
