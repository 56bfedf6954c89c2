"""A real SGLang engine (0.5.11 or 0.5.14) serving tiny NVFP4 models with its torch.compile prefill graphs,
with and without the shim.

For each architecture of the installed release's row in ``ENGINES`` (checkpoints written by
``engine/checkpoints.py``), each case starts ``sglang.Engine(quantization="modelopt_fp4",
skip_tokenizer_init=True, attention_backend="triton", ...)`` in its own process (``engine/run_engine.py``)
and generates greedily from ``input_ids``:

* ``off``: ``FP4_DYNAMO_SHIM_DISABLE=1``. SGLang 0.5.11 calls FlashInfer raw inside its piecewise graph: the
  engine must fail in piecewise capture with Dynamo's ``Unsupported`` on FlashInfer's JIT path (the bug
  users see; proves the harness reaches it). SGLang 0.5.14 wraps those calls in its own ops: the engine must
  start, capture its ``tc_piecewise`` prefill graphs and serve without the shim (not needed there);
* ``plugin``: activated only by SGLang's plugin entry point (no import, no variable);
* ``hook``: only by ``FP4_DYNAMO_SHIM=1`` and the import hook (plugins filtered off with SGLANG_PLUGINS);
* ``import``: only by ``import fp4_dynamo_shim`` at the top of the launching script (plugins filtered off,
  no variable set by the test);
* ``pcg_off``: the prefill graphs off (0.5.11 ``disable_piecewise_cuda_graph``, 0.5.14
  ``disable_prefill_cuda_graph``), compared with every route (and, on 0.5.14, with off);
* ``bf16_on`` / ``bf16_off``: the same model unquantized, shim off, graphs on and off: the control that says
  whether SGLang's own graphs compute this architecture bit for bit as its eager forward. Where they do, the
  shimmed NVFP4 model must too (same ids, same two best logprobs at every generated position); where they do
  not, FP4's rounding of activations amplifies SGLang's own difference, and the test asserts and reports it
  (``engine-<architecture>-differences.json``) instead of demanding equal ids.

The H200 is SM90: ``engine/sm120_path/sitecustomize.py`` (on PYTHONPATH, so the spawned scheduler runs it
too) forces only the decisions that keep SGLang off its FlashInfer NVFP4 path there and stands in for the
kernels that cannot run on SM90, each listed there with why, per release. ``FP4_DYNAMO_SHIM_FALLBACK=reference``
makes the shim compute FP4 values with its reference (the FP4 kernels have no SM90 body). The engines run on
the reference branch only: on SM90 the kernel branch cannot serve a model, since FlashInfer's FP4 GEMM
(``mm_fp4``) has no backend there and raises its own error; that branch's compile path is covered by
``test_gpu_sglang.py`` and ``test_gpu_sglang_wrapper.py`` in both device modes. All cases run at
once on the one GPU. Nothing asserts a time; start-up, capture and first-token times per route go to
``engine_times.txt`` and ``engine_summary.json`` in ``$FP4_DYNAMO_SHIM_TEST_REPORT_DIR``.

Needs SGLang 0.5.11 or 0.5.14 with its real sgl_kernel, and the shim installed as a wheel in a site
directory (its .pth and entry point): ``bash tools/gpu/fetch.sh engine`` (or ``engine-0.5.14``) and
``bash tools/gpu/fetch.sh shim`` bring them to the GPU machine, ``bash tools/gpu/stage.sh`` installs them there.
``FP4_DYNAMO_SHIM_TEST_ENGINE_ARCHITECTURES=deepseek_v3,glm4_moe`` runs a subset.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from _fp4_dynamo_shim import startup_files
from _fp4_dynamo_shim.sglang import sglang_releases

ENGINE = Path(__file__).resolve().parent / "engine"
sys.path.insert(0, str(ENGINE))
import checkpoints  # noqa: E402


@dataclasses.dataclass(frozen=True)
class EngineRelease:
    architectures: tuple
    #: The scheduler's log line when prefill-graph capture begins, and a regex of its end (seconds in group 1).
    capture_begin: str
    capture_end: str
    #: Without the shim the engine fails in capture (SGLang calls FlashInfer raw in the traced graph).
    off_needs_shim: bool
    #: What a shimmed scheduler must have bound to the shim's replacements (sitecustomize's report keys).
    shim_bindings: tuple


ENGINES = {
    "0.5.11": EngineRelease(("llama", "qwen3", "qwen3_moe", "deepseek_v3", "glm4_moe"),
                            "Capture piecewise CUDA graph begin",
                            r"Capture piecewise CUDA graph end\. Time elapsed: ([\d.]+) s", True,
                            ("modelopt.fp4_quantize", "modelopt.flashinfer_fp4_gemm")),
    "0.5.14": EngineRelease(("qwen3", "qwen3_moe"), "Capture target prefill CUDA graph begin",
                            r"Capture target prefill CUDA graph end\. elapsed=([\d.]+) s", False,
                            ("fp4_utils._flashinfer_fp4_quantize", "modelopt.flashinfer_fp4_gemm")),
}
INSTALLED = sglang_releases.installed_version()
RELEASE = ENGINES.get(INSTALLED)
_chosen = os.environ.get("FP4_DYNAMO_SHIM_TEST_ENGINE_ARCHITECTURES")
ARCHITECTURES = ([a for a in _chosen.split(",") if a] if _chosen else list(RELEASE.architectures)) if RELEASE else []
NO_PLUGINS = "no-plugin-has-this-name"  # SGLANG_PLUGINS: an empty value would load them all
CASES = {
    "off": {"env": {"FP4_DYNAMO_SHIM_DISABLE": "1"}},
    "plugin": {"env": {"FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "hook": {"env": {"FP4_DYNAMO_SHIM": "1", "SGLANG_PLUGINS": NO_PLUGINS, "FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "import": {"script": "run_engine_import.py",
               "env": {"SGLANG_PLUGINS": NO_PLUGINS, "FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "pcg_off": {"args": ["--disable-pcg"], "env": {"FP4_DYNAMO_SHIM_FALLBACK": "reference"}},
    "bf16_on": {"args": ["--bf16"], "env": {"FP4_DYNAMO_SHIM_DISABLE": "1"}},
    "bf16_off": {"args": ["--bf16", "--disable-pcg"], "env": {"FP4_DYNAMO_SHIM_DISABLE": "1"}},
}
ROUTES = ("plugin", "hook", "import")
#: How the scheduler must say it was activated, per route.
ACTIVATED_BY = {"plugin": {"plugin"}, "hook": {"pth"}, "import": {"import", "pth"}, "pcg_off": {"plugin"}}
TIMEOUT_S = float(os.environ.get("FP4_DYNAMO_SHIM_TEST_ENGINE_TIMEOUT", "480"))
#: First NCCL port; two engine runs on one machine at once (two SGLang releases) need bases far apart.
PORT_BASE = int(os.environ.get("FP4_DYNAMO_SHIM_TEST_ENGINE_PORT_BASE", "29500"))

def _sglang_can_serve() -> str | None:
    if not torch.cuda.is_available():
        return "no GPU"
    if RELEASE is None:
        return f"the engine test is written for SGLang {', '.join(ENGINES)} (installed: {INSTALLED})"
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
               "--nccl-port", str(port), "--logprobs", *CASES[case].get("args", [])]
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
    capture = re.findall(RELEASE.capture_end, log_text)  # one per rank
    return {"architecture": architecture, "case": case, "exit": code, "wall_s": time.perf_counter() - started,
            **result, "schedulers": statuses, "log": str(directory / "log.txt"), "log_text": log_text,
            "pcg_capture_s": float(capture[0]) if capture else None, "pcg_capture_s_per_rank": [float(c) for c in capture],
            "prefills": [graph == "True" for graph in re.findall(r"Prefill batch.*cuda graph: (True|False)", log_text)],
            "prefill_replayed_pcg": bool(re.search(r"Prefill batch.*cuda graph: True", log_text))}


def _times_table(results) -> str:
    lines = ["architecture  case     started  startup_s  capture_s  first_token_s  activated_by"]
    for r in results:
        activated = next((s["shim"]["activated_by"] for s in r["schedulers"] if s.get("shim")), None)
        cells = [f"{r.get(k):.1f}" if isinstance(r.get(k), float) else "-" for k in
                 ("startup_s", "pcg_capture_s", "first_token_s")]
        lines.append(f"{r['architecture']:13} {r['case']:8} {str(bool(r.get('started'))):8} {cells[0]:>9}  "
                     f"{cells[1]:>9}  {cells[2]:>13}  {activated}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def engines(tmp_path_factory):
    """Every (architecture, case) engine, all started at once on the one GPU; their results by key."""
    routes = startup_files.installed_routes()
    assert routes["pth"] and sglang_releases.plugin_entry_point(), (
        "install the shim as a wheel in a site directory for the hook and plugin routes "
        f"(routes here: {routes}, plugin: {sglang_releases.plugin_entry_point()})")
    root = tmp_path_factory.mktemp("engines")
    models = {(arch, bf16): checkpoints.write_checkpoint(arch, root / "models" / f"{arch}-{bf16}", bf16=bf16)
              for arch in ARCHITECTURES for bf16 in (False, True)}
    runs = [(arch, case) for arch in ARCHITECTURES for case in CASES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {(arch, case): pool.submit(_run, arch, case, models[(arch, case.startswith("bf16"))], root,
                                             PORT_BASE + 10 * i, 2.0 * i)
                   for i, (arch, case) in enumerate(runs)}
        results = {key: future.result() for key, future in futures.items()}
    report_dir = os.environ.get("FP4_DYNAMO_SHIM_TEST_REPORT_DIR")
    if report_dir:
        summary = [{k: v for k, v in r.items() if k != "log_text"} | {"failure_excerpt": _failure_excerpt(r["log_text"])}
                   for r in results.values()]
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        (Path(report_dir) / "engine_summary.json").write_text(json.dumps(summary, indent=2, default=str))
        (Path(report_dir) / "engine_times.txt").write_text(f"SGLang {INSTALLED}\n" + _times_table(results.values()))
        for (arch, case), r in results.items():
            if not r.get("started") or case == "off":
                (Path(report_dir) / f"engine-{arch}-{case}.log").write_text(r["log_text"][-200000:])
    return results


def _failure_excerpt(log_text: str) -> str:
    lines = log_text.splitlines()
    marks = [i for i, line in enumerate(lines) if "Unsupported" in line or "Error" in line]
    return "\n".join(lines[max(0, marks[0] - 3): marks[0] + 12]) if marks else ""


def _served_with_prefill_graphs(run) -> None:
    assert run.get("started"), f"{run.get('error')}\n{_failure_excerpt(run['log_text'])}"
    assert RELEASE.capture_begin in run["log_text"] and run["pcg_capture_s"] is not None, _failure_excerpt(run["log_text"])
    # every prefill the scheduler ran replayed a graph: the compared ids are the graphs' (SGLang runs a prefill
    # eagerly, and says so in this line, when the batch does not fit them, e.g. if the prompt's logprobs are asked)
    assert run["prefills"] and all(run["prefills"]), run["prefills"]
    assert [len(ids) for ids in run["output_ids"]] == [8, 8]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_without_the_shim_the_engine_fails_in_capture_where_sglang_calls_flashinfer_raw(engines, architecture):
    if not RELEASE.off_needs_shim:
        pytest.skip(f"SGLang {INSTALLED} wraps FlashInfer's FP4 calls in its own ops (the next test)")
    run = engines[(architecture, "off")]
    text = run["log_text"]
    assert not run.get("started"), "the engine served without the shim: the harness does not reach the bug"
    assert RELEASE.capture_begin in text and not re.search(RELEASE.capture_end, text)
    assert "torch._dynamo.exc.Unsupported" in text and re.search(r"allocate_lock|get_cuda_version|subprocess", text), \
        _failure_excerpt(text)
    assert all(not s.get("shim_imported") or not s["shim"]["applied"] for s in run["schedulers"])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_without_the_shim_sglangs_own_ops_serve_with_prefill_graphs(engines, architecture):
    """SGLang >= 0.5.12: not needed on the default path (the need line says so; here it is served)."""
    if RELEASE.off_needs_shim:
        pytest.skip(f"SGLang {INSTALLED} calls FlashInfer raw (the previous test)")
    run = engines[(architecture, "off")]
    _served_with_prefill_graphs(run)
    assert all(not s.get("shim_imported") or not s["shim"]["applied"] for s in run["schedulers"])
    assert "not needed on its default path" in sglang_releases.describe()["need"]


@pytest.mark.parametrize("case", ROUTES)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_with_the_shim_the_engine_captures_prefill_graphs_and_generates(engines, architecture, case):
    run = engines[(architecture, case)]
    _served_with_prefill_graphs(run)
    (scheduler,) = run["schedulers"]
    assert scheduler["scheduler_error"] is None and scheduler["shim"]["applied"], scheduler
    assert scheduler["shim"]["activated_by"] in ACTIVATED_BY[case], scheduler["shim"]
    assert all(scheduler[binding] == "shim" for binding in RELEASE.shim_bindings), scheduler
    assert {d["mode"] for d in scheduler["shim"]["devices"]} == {"reference"}
    if case == "plugin":  # the plugin says so in the scheduler's log
        assert "fp4_dynamo_shim is active in this SGLang process (activated by plugin" in run["log_text"]


def differences(run, reference) -> dict:
    """Whether the greedy ids are equal, and per prompt and generated position the largest difference of the
    two best logprobs (position 0 is the prefill's own output; the rest read the KV cache it wrote)."""
    return {"ids_equal": run["output_ids"] == reference["output_ids"],
            "logprobs": [[max(abs(a[0] - b[0]) for a, b in zip(x, y)) for x, y in zip(prompt, reference_prompt)]
                         for prompt, reference_prompt in zip(run["top_logprobs"], reference["top_logprobs"])]}


def _bit_for_bit(compared: dict) -> bool:
    return compared["ids_equal"] and all(d == 0.0 for prompt in compared["logprobs"] for d in prompt)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_prefill_graphs_on_and_off_agree_wherever_sglangs_own_graphs_do(engines, architecture):
    off = engines[(architecture, "pcg_off")]
    assert off.get("started"), off.get("error")
    assert off["pcg_capture_s"] is None and not off["prefill_replayed_pcg"] and off["prefills"]
    bf16_on, bf16_off = engines[(architecture, "bf16_on")], engines[(architecture, "bf16_off")]
    _served_with_prefill_graphs(bf16_on)
    assert bf16_off.get("started") and bf16_off["prefills"] and not any(bf16_off["prefills"]), bf16_off.get("error")
    control = differences(bf16_on, bf16_off)
    compared = {case: differences(engines[(architecture, case)], off)
                for case in (ROUTES if RELEASE.off_needs_shim else ("off", *ROUTES))}
    report_dir = os.environ.get("FP4_DYNAMO_SHIM_TEST_REPORT_DIR")
    if report_dir:
        (Path(report_dir) / f"engine-{architecture}-differences.json").write_text(
            json.dumps({"bf16 control (shim off)": control, **compared}, indent=1))
    if _bit_for_bit(control):
        for case, result in compared.items():
            assert _bit_for_bit(result), (case, result)
    else:  # SGLang's own graphs differ from its eager forward here: FP4 can only amplify that, so it is reported
        worst = max(d for prompt in control["logprobs"] for d in prompt)
        warnings.warn(f"{architecture}: SGLang's prefill graphs differ from its eager forward on the bf16 model with "
                      f"the shim off (up to {worst:.4f} in a logprob); the NVFP4 runs' differences are in the report, "
                      f"not asserted: {json.dumps({c: r['ids_equal'] for c, r in compared.items()})}")


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
    assert len(re.findall(RELEASE.capture_end, run["log_text"])) == 2  # every rank captured
    assert run["output_ids"] == engines[(architecture, case)]["output_ids"] == engines[(architecture, "pcg_off")]["output_ids"]
