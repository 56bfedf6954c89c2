"""A real SGLang 0.5.11 engine serving tiny NVFP4 models with piecewise CUDA graphs, with and without the shim.

For Llama, Qwen3 and Qwen3-MoE checkpoints written by ``engine/checkpoints.py``, each case starts
``sglang.Engine(quantization="modelopt_fp4", skip_tokenizer_init=True, attention_backend="triton", ...)``
in its own process (``engine/run_engine.py``) and generates greedily from ``input_ids``:

* ``off``: ``FP4_DYNAMO_SHIM_DISABLE=1``: the engine must fail in piecewise capture, with Dynamo's
  ``Unsupported`` on FlashInfer's JIT path (the bug users see; proves the harness reaches it);
* ``plugin``: activated only by SGLang's plugin entry point (no import, no variable);
* ``hook``: only by ``FP4_DYNAMO_SHIM=1`` and the import hook (plugins filtered off with SGLANG_PLUGINS);
* ``import``: only by ``import fp4_dynamo_shim`` at the top of the launching script (plugins filtered off,
  no variable set by the test);
* ``pcg_off``: ``disable_piecewise_cuda_graph=True``: the same greedy ``output_ids`` as with the graphs.

The H200 is SM90: SGLang takes FlashInfer's ``fp4_quantize`` only on SM12x and refuses ModelOpt FP4 below
SM100, so ``engine/sm120_path/sitecustomize.py`` (on PYTHONPATH, so the spawned scheduler runs it too)
forces only those decisions and stands in for the one kernel outside FlashInfer that cannot run there
(SGLang's FP4 MoE), each listed there with why. ``FP4_DYNAMO_SHIM_FALLBACK=reference`` makes the shim
compute FP4 values with its reference (the FP4 kernels have no SM90 body). All cases run at once on the
one GPU. Nothing asserts a time; capture and first-token times go to the report.

Needs SGLang 0.5.11 with its real sgl_kernel, and the shim installed as a wheel in a site directory (its
.pth and entry point): ``bash tests/gpu/fetch.sh engine`` and ``bash tests/gpu/fetch.sh shim`` bring them to
the GPU machine, ``bash tests/gpu/stage.sh`` installs them there.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fp4_dynamo_shim import hook, sglang_releases

ENGINE = Path(__file__).resolve().parent / "engine"
sys.path.insert(0, str(ENGINE))
import checkpoints  # noqa: E402

ARCHITECTURES = sorted(checkpoints.ARCHITECTURES)
NO_PLUGINS = "no-plugin-has-this-name"  # SGLANG_PLUGINS: an empty value would load them all
CASES = {
    "off": {"env": {"FP4_DYNAMO_SHIM_DISABLE": "1"}},
    "plugin": {"env": {"FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "hook": {"env": {"FP4_DYNAMO_SHIM": "1", "SGLANG_PLUGINS": NO_PLUGINS, "FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "import": {"script": "run_engine_import.py",
               "env": {"SGLANG_PLUGINS": NO_PLUGINS, "FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "pcg_off": {"args": ["--disable-pcg"], "env": {"FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
}
#: How the scheduler must say it was activated, per route.
ACTIVATED_BY = {"plugin": {"plugin"}, "hook": {"pth"}, "import": {"import", "pth"}, "pcg_off": {"plugin"}}
TIMEOUT_S = float(os.environ.get("FP4_DYNAMO_SHIM_TEST_ENGINE_TIMEOUT", "480"))

release = sglang_releases.release_for(sglang_releases.installed_version())


def _sglang_can_serve() -> str | None:
    if not torch.cuda.is_available():
        return "no GPU"
    if sglang_releases.installed_version() != "0.5.11":
        return f"the engine test is written for SGLang 0.5.11 (installed: {sglang_releases.installed_version()})"
    try:
        import sgl_kernel  # noqa: F401
    except Exception as error:
        return f"the real sgl_kernel does not import: {error!r}"
    if not getattr(sys.modules["sgl_kernel"], "__file__", None) or "stand_ins" in sys.modules["sgl_kernel"].__file__:
        return "only the sgl_kernel stand-in is on the path"
    return None


pytestmark = pytest.mark.skipif(_sglang_can_serve() is not None, reason=str(_sglang_can_serve()))


def _environment(case: str, status_dir: Path) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("FP4_DYNAMO_SHIM") and k != "SGLANG_PLUGINS"}  # the test process exported some
    environment.update(CASES[case]["env"])
    environment.update(FP4_DYNAMO_SHIM_TEST_SM120_PATH="1", FP4_DYNAMO_SHIM_TEST_STATUS_DIR=str(status_dir),
                       PYTHONUNBUFFERED="1")
    path = [str(ENGINE / "sm120_path"), str(ENGINE)] + [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    environment["PYTHONPATH"] = os.pathsep.join(path)
    return environment


def _run(architecture: str, case: str, model: Path, root: Path, port: int, delay: float) -> dict:
    time.sleep(delay)  # staggered: each engine measures free GPU memory when it starts
    directory = root / f"{architecture}-{case}"
    (directory / "status").mkdir(parents=True)
    script = ENGINE / CASES[case].get("script", "run_engine.py")
    command = [sys.executable, str(script), "--model", str(model), "--out", str(directory / "result.json"),
               "--nccl-port", str(port), *CASES[case].get("args", [])]
    started = time.perf_counter()
    with open(directory / "log.txt", "w") as log:
        try:
            completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                                       env=_environment(case, directory / "status"), cwd=directory)
            code = completed.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    result = json.loads((directory / "result.json").read_text()) if (directory / "result.json").exists() else {}
    statuses = [json.loads(p.read_text()) for p in sorted((directory / "status").glob("*.json"))]
    log_text = (directory / "log.txt").read_text(errors="replace")
    capture = re.findall(r"Capture piecewise CUDA graph end\. Time elapsed: ([\d.]+) s", log_text)  # one per rank
    return {"architecture": architecture, "case": case, "exit": code, "wall_s": time.perf_counter() - started,
            **result, "schedulers": statuses, "log": str(directory / "log.txt"), "log_text": log_text,
            "pcg_capture_s": float(capture[0]) if capture else None, "pcg_capture_s_per_rank": [float(c) for c in capture],
            "prefill_replayed_pcg": "cuda graph: True" in log_text}


@pytest.fixture(scope="session")
def engines(tmp_path_factory):
    """Every (architecture, case) engine, all started at once on the one GPU; their results by key."""
    routes = hook.installed_routes()
    assert routes["pth"] and sglang_releases.plugin_entry_point(), (
        "install the shim as a wheel in a site directory for the hook and plugin routes "
        f"(routes here: {routes}, plugin: {sglang_releases.plugin_entry_point()})")
    root = tmp_path_factory.mktemp("engines")
    models = {arch: checkpoints.write_checkpoint(arch, root / "models" / arch) for arch in ARCHITECTURES}
    runs = [(arch, case) for arch in ARCHITECTURES for case in CASES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {(arch, case): pool.submit(_run, arch, case, models[arch], root, 29500 + 10 * i, 2.0 * i)
                   for i, (arch, case) in enumerate(runs)}
        results = {key: future.result() for key, future in futures.items()}
    report_dir = os.environ.get("FP4_DYNAMO_SHIM_TEST_REPORT_DIR")
    if report_dir:
        summary = [{k: v for k, v in r.items() if k != "log_text"} | {"failure_excerpt": _failure_excerpt(r["log_text"])}
                   for r in results.values()]
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        (Path(report_dir) / "engine_summary.json").write_text(json.dumps(summary, indent=2, default=str))
        for (arch, case), r in results.items():
            if not r.get("started"):
                (Path(report_dir) / f"engine-{arch}-{case}.log").write_text(r["log_text"][-200000:])
    return results


def _failure_excerpt(log_text: str) -> str:
    lines = log_text.splitlines()
    marks = [i for i, line in enumerate(lines) if "Unsupported" in line or "Error" in line]
    return "\n".join(lines[max(0, marks[0] - 3): marks[0] + 12]) if marks else ""


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_without_the_shim_the_engine_fails_in_piecewise_capture_on_flashinfers_jit_path(engines, architecture):
    run = engines[(architecture, "off")]
    text = run["log_text"]
    assert not run.get("started"), "the engine served without the shim: the harness does not reach the bug"
    assert "Capture piecewise CUDA graph begin" in text and "Capture piecewise CUDA graph end" not in text
    assert "torch._dynamo.exc.Unsupported" in text and re.search(r"allocate_lock|get_cuda_version|subprocess", text), \
        _failure_excerpt(text)
    assert all(not s.get("shim_imported") or not s["shim"]["applied"] for s in run["schedulers"])


@pytest.mark.parametrize("case", ["plugin", "hook", "import"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_with_the_shim_the_engine_captures_piecewise_graphs_and_generates(engines, architecture, case):
    run = engines[(architecture, case)]
    assert run.get("started"), f"{run.get('error')}\n{_failure_excerpt(run['log_text'])}"
    (scheduler,) = run["schedulers"]
    assert scheduler["scheduler_error"] is None and scheduler["shim"]["applied"], scheduler
    assert scheduler["shim"]["activated_by"] in ACTIVATED_BY[case], scheduler["shim"]
    assert scheduler["modelopt.fp4_quantize"] == "shim" and scheduler["modelopt.flashinfer_fp4_gemm"] == "shim"
    assert {d["mode"] for d in scheduler["shim"]["devices"]} == {"reference"}
    assert run["pcg_capture_s"] is not None and run["prefill_replayed_pcg"]
    assert [len(ids) for ids in run["output_ids"]] == [8, 8]
    if case == "plugin":  # the plugin says so in the scheduler's log
        assert "fp4_dynamo_shim is active in this SGLang process (activated by plugin" in run["log_text"]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_piecewise_graphs_on_and_off_give_identical_greedy_output_ids(engines, architecture):
    off = engines[(architecture, "pcg_off")]
    assert off.get("started"), off.get("error")
    assert off["pcg_capture_s"] is None and not off["prefill_replayed_pcg"]
    for case in ("plugin", "hook", "import"):
        assert engines[(architecture, case)].get("output_ids") == off["output_ids"], case


# --- tensor parallel (issue 13): needs two GPUs (nvidia-h200-x2 or larger) ---------------------------------

TP_CASES = ["plugin", "hook"]
TP_ARCHITECTURES = ["qwen3", "qwen3_moe"]


@pytest.fixture(scope="session")
def tp2_engines(tmp_path_factory, engines):
    """The dense and the MoE checkpoint at tp_size=2 (plugin and hook routes), after the TP=1 runs."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"tensor parallel needs 2 GPUs; {torch.cuda.device_count()} visible (run on nvidia-h200-x2)")
    root = tmp_path_factory.mktemp("tp2")
    models = {arch: checkpoints.write_checkpoint(arch, root / "models" / arch) for arch in TP_ARCHITECTURES}
    runs = [(arch, case) for arch in TP_ARCHITECTURES for case in TP_CASES]
    original_args = {case: CASES[case].get("args", []) for case in TP_CASES}
    try:
        for case in TP_CASES:
            CASES[case]["args"] = original_args[case] + ["--tp", "2"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:
            futures = {key: pool.submit(_run, key[0], key[1], models[key[0]], root, 31500 + 20 * i, 5.0 * i)
                       for i, key in enumerate(runs)}
            return {key: future.result() for key, future in futures.items()}
    finally:
        for case in TP_CASES:
            CASES[case]["args"] = original_args[case]


@pytest.mark.parametrize("case", TP_CASES)
@pytest.mark.parametrize("architecture", TP_ARCHITECTURES)
def test_at_tp2_every_rank_applies_the_shim_captures_and_matches_tp1(tp2_engines, engines, architecture, case):
    run = tp2_engines[(architecture, case)]
    assert run.get("started"), f"{run.get('error')}\n{_failure_excerpt(run['log_text'])}"
    assert len(run["schedulers"]) == 2, run["schedulers"]  # one scheduler per rank, each reporting
    for scheduler in run["schedulers"]:
        assert scheduler["scheduler_error"] is None and scheduler["shim"]["applied"], scheduler
        assert scheduler["shim"]["activated_by"] in ACTIVATED_BY[case], scheduler["shim"]
    assert len(re.findall(r"Capture piecewise CUDA graph end", run["log_text"])) == 2  # every rank captured
    assert run["output_ids"] == engines[(architecture, case)]["output_ids"] == engines[(architecture, "pcg_off")]["output_ids"]
