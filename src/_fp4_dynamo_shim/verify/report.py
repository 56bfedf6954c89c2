"""python -m fp4_dynamo_shim.verify: does the shim work on this machine, and in its SGLang workers?

Applies the shim, prints the environment, what was patched, then one line per check. Exit code 0 when
every check passed or was skipped, 1 when one failed, 2 when the shim could not apply (or is switched
off; the failed apply is the one check then), 3 for a usage error. --json prints one JSON document instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import sys
import time
import traceback
from typing import Callable, List, Optional

from .. import __version__
from ..errors import EXIT_FAILED, EXIT_NOT_APPLIED, EXIT_OK

#: What ``status()["activated_by"]`` says when verify applied the shim itself.
ROUTE = "verify"


@dataclasses.dataclass
class Result:
    name: str
    result: str  # "pass", "fail", "skip" or "info"
    detail: str
    seconds: float


def ordered_checks() -> List[tuple]:
    """(name, check, the part of FlashInfer it exercises through the shim or None) in the order verify runs them.
    A check of a part left as FlashInfer's, on a release newer than the tested ones, is skipped and says why."""
    from . import checks, sglang, workers

    return [
        ("trace-static", checks.check_trace_static, "fp4_quantize"),
        ("trace-dynamic", checks.check_trace_dynamic, "fp4_quantize"),
        ("opcheck", checks.check_opcheck, "get_fp4_quantization_module"),
        ("compiled-vs-eager", checks.check_compiled_matches_eager, "fp4_quantize"),
        ("cuda-graph", checks.check_cuda_graph, "fp4_quantize"),
        ("flashinfer-op", checks.check_flashinfer_op, "fp4_quantize"),
        ("sglang-release", sglang.check_sglang_release, None),
        ("sglang-compile", sglang.check_sglang_compile_path, "fp4_quantize"),
        ("family", checks.check_family, "get_fp4_quantization_module"),
        ("flashinfer-ops", checks.check_flashinfer_ops, None),
        ("worker-activation", workers.check_worker_activation, None),
    ]


def left_as_flashinfers(name: str, needs: Optional[str], status: dict) -> Optional[Result]:
    """The skipped result of check ``name`` when the part it ``needs`` is left as FlashInfer's, else None."""
    part = (status["flashinfer"]["parts"] or {}).get(needs, {"applied": True})
    if part["applied"]:
        return None
    why = part["difference"] or part["left_because"]
    return Result(name, "skip", f"{needs} is left as FlashInfer's on this release ({why})", 0.0)


def run_check(name: str, check: Callable, device: str) -> Result:
    import torch

    from .checks import Skip

    started = time.perf_counter()
    try:
        detail, result = check(device), "pass"
    except Skip as skip:
        detail, result = str(skip), "skip"
    except Exception as error:
        lines = traceback.format_exception_only(type(error), error)
        detail, result = "".join(lines).strip().splitlines()[0][:1000], "fail"
    finally:
        torch._dynamo.reset()
    if name == "baseline" and result == "pass":
        result = "info"
    return Result(name, result, detail, round(time.perf_counter() - started, 2))


def environment() -> dict:
    import torch

    from .. import lifecycle

    status = lifecycle.status()
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            gpus.append({"index": index, "name": torch.cuda.get_device_name(index), "arch": f"SM{major}{minor}",
                         "fp4_kernel": major >= 10})
    jit_cache = None
    with contextlib.suppress(Exception):
        from flashinfer.jit import env as jit_env

        jit_cache = str(jit_env.FLASHINFER_JIT_DIR)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": gpus,
        "flashinfer": status["flashinfer"],
        "supported_flashinfer": status["supported_flashinfer"],
        "sglang": status["sglang"],
        "fp4_dynamo_shim": __version__,
        "jit_cache": jit_cache,
    }


def apply_shim() -> Result:
    """Apply the shim here (this process's import did not), as the check named "apply": it fails with the
    refusal, ``FP4_DYNAMO_SHIM_STRICT=1``'s :class:`ApplyError` included, and is skipped for the kill switch."""
    from .. import lifecycle
    from ..errors import ApplyError

    started = time.perf_counter()
    try:
        applied = lifecycle.apply(route=ROUTE)
        problem = lifecycle.status()["problem"]
    except ApplyError as error:
        applied, problem = False, f"ApplyError: {error}"
    result = "pass" if applied else "skip" if lifecycle.status()["disabled"] else "fail"
    return Result("apply", result, "applied" if applied else problem, round(time.perf_counter() - started, 2))


def _proven_line(layer: dict) -> str:
    """What the GPU record says for the installed release, once the layer has registered, and how many ops
    stand on no GPU run."""
    if layer["state"] != "registered" or layer["gate"] not in ("proven", "all"):
        return ""
    proven = layer["proven"]
    if proven is None:
        line = "; no GPU record for the installed FlashInfer" + (": SGLang's calls only" if layer["gate"] == "proven"
                                                                 else "")
    else:
        line = (f"; GPU record for FlashInfer {proven['flashinfer']}: {proven['declarations']} declarations "
                f"through {len(proven['functions'])} functions ({proven['date']}, {proven['machine']}, "
                f"torch {proven['torch']}, shim {proven['shim']})")
    unproven = len(layer["unproven"])
    return line + (f"; {unproven} registered without a GPU proof (status()['flashinfer_ops']['unproven'])"
                   if unproven else "")


def _rebound_lines(rebound: List[str], verbose: bool) -> List[str]:
    """Rebound names grouped by module; without ``verbose``, by top-level package and public names only."""
    by_module: dict = {}
    for binding in rebound:
        module, _, name = binding.rpartition(".")
        by_module.setdefault(module, []).append(name)
    if verbose:
        return [f"    {module}: {', '.join(sorted(names))}" for module, names in sorted(by_module.items())]
    by_package: dict = {}
    for module, names in by_module.items():
        modules, public = by_package.setdefault(module.split(".")[0], (set(), set()))
        modules.add(module)
        public.update(name for name in names if not name.startswith("_"))
    return [f"    {package}: {len(modules)} module(s): {', '.join(sorted(public)) or '(private names only)'}"
            for package, (modules, public) in sorted(by_package.items())]


def _print_text(env: dict, status: dict, results: List[Result], exit_code: int, verbose: bool = False) -> None:
    print(f"fp4-dynamo-shim {env['fp4_dynamo_shim']} verify")
    print("environment")
    print(f"  python       {env['python']}")
    print(f"  torch        {env['torch']} (CUDA {env['cuda']})")
    for gpu in env["gpus"] or [None]:
        if gpu is None:
            print("  gpu          none visible")
        else:
            kernel = "yes" if gpu["fp4_kernel"] else "no (Blackwell SM100+ only)"
            print(f"  gpu          cuda:{gpu['index']} {gpu['name']} {gpu['arch']}, FP4 quantize kernel: {kernel}")
    release = env["flashinfer"]
    where = "newer than the tested range" if release["tested"] is False else "tested range"
    print(f"  flashinfer   {release['version'] or 'not installed'} ({where}: {env['supported_flashinfer']})")
    sglang_info = env["sglang"]
    print(f"  sglang       {sglang_info['need'] or 'not installed'}"
          + (f" ({sglang_info['note']})" if sglang_info["note"] else ""))
    print(f"  jit cache    {env['jit_cache']}")
    from ..release_parts import summary

    newer = summary(status["flashinfer"])
    if newer:
        print(newer)
    if status["applied"]:
        cuda = status["cuda_version"]
        print(f"shim applied: CUDA version {cuda['value']} (from {cuda['source']}), "
              f"fallback={status['fallback']}, op {status['op']}")
        for device in status["devices"]:
            load = f", loaded in {device['load_seconds']:.1f} s" if device["load_seconds"] is not None else ""
            print(f"  cuda:{device['index']} SM{device['backend']}: {device['mode']}{load}")
        print(f"  activated by {status['activated_by']}; {len(status['rebound'])} names rebound"
              + ("" if verbose else " (--verbose lists each module)"))
        for line in _rebound_lines(status["rebound"], verbose):
            print(line)
        for name, state in status["family"].items():
            print(f"  family: {name}: {state}")
        layer = status["flashinfer_ops"]
        if layer is not None:
            print(f"  flashinfer ops (FP4_DYNAMO_SHIM_FLASHINFER_OPS={layer['gate']}): {layer['state']}; "
                  f"{layer['counts']['registered']} of {layer['counts']['declared']} declarations registered"
                  + _proven_line(layer))
        for skipped in status["skipped"]:
            print(f"  skipped: {skipped}")
    else:
        print(f"shim NOT applied: {status['problem']}")
    routes = {name: path for name, path in status["routes"].items() if path}
    print("routes installed: " + (", ".join(f"{name} ({path})" for name, path in routes.items()) or "none"))
    for warning in status["warnings"]:
        print(f"  warning: {warning}")
    if results:
        print("checks")
        for result in results:
            print(f"  {result.result.upper():4}  {result.name:18} {result.detail} [{result.seconds:.1f} s]")
    counts = {kind: sum(r.result == kind for r in results) for kind in ("pass", "fail", "skip")}
    print(f"summary: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped; exit {exit_code}")


def json_document(env: dict, status: dict, device: str, results: List[Result], exit_code: int) -> dict:
    """What ``--json`` prints (docs/usage.md describes each key)."""
    return {
        "environment": env,
        "status": status,
        "device": device,
        "checks": [dataclasses.asdict(r) for r in results],
        "summary": {kind: sum(r.result == kind for r in results) for kind in ("pass", "fail", "skip", "info")},
        "exit_code": exit_code,
    }


def run(options, usage_error: Callable[[str], None]) -> int:
    """``fp4-dynamo-shim verify`` with its parsed ``options`` (the command line's one parser, ``cli``, reads
    them; ``usage_error`` is its way of refusing a value). Returns the exit code."""
    import torch  # after parsing: --help and --version load nothing

    from .. import lifecycle

    from .checks import check_baseline

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        usage_error("--device cuda: no GPU visible")

    results: List[Result] = [apply_shim()]
    env = environment()
    status = lifecycle.status()
    if not status["applied"]:
        exit_code = EXIT_NOT_APPLIED
    else:
        results.clear()  # applied: the header says so; the checks follow
        for name, check, needs in ordered_checks():
            if not options.json:
                print(f"  running {name} ...", file=sys.stderr, flush=True)
            results.append(left_as_flashinfers(name, needs, status) or run_check(name, check, device))
        if options.baseline:
            results.append(run_check("baseline", check_baseline, device))
        exit_code = EXIT_FAILED if any(r.result == "fail" for r in results) else EXIT_OK
        status = lifecycle.status()

    if options.json:
        print(json.dumps(json_document(env, status, device, results, exit_code), indent=2))
    else:
        _print_text(env, status, results, exit_code, options.verbose)
    return exit_code

