"""python -m fp4_dynamo_shim.verify: does the shim work on this machine, and in its SGLang workers?

Prints the environment, what was patched, then one line per check. Exit code 0 when every check passed
or was skipped, 1 when one failed, 2 when the shim could not apply (or is switched off), 3 for a usage
error. --json prints one JSON document instead.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import sys
import time
import traceback
from typing import Callable, List, Optional

import torch
import torch._dynamo.testing

import fp4_dynamo_shim
from fp4_dynamo_shim import ops, sglang, sglang_releases

EXIT_OK, EXIT_CHECK_FAILED, EXIT_NOT_APPLIED, EXIT_USAGE = 0, 1, 2, 3


class Parser(argparse.ArgumentParser):
    """argparse with the project's exit code for usage errors (3; argparse's own 2 means "not applied" here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class Skip(Exception):
    """A check that does not apply here; the message says why."""


@dataclasses.dataclass
class Result:
    name: str
    result: str  # "pass", "fail", "skip" or "info"
    detail: str
    seconds: float


def _inputs(rows: int, device: str, columns: int = 256):
    generator = torch.Generator(device=device).manual_seed(rows)
    x = torch.randn(rows, columns, device=device, dtype=torch.bfloat16, generator=generator)
    return x, (448.0 * 6.0 / x.float().abs().amax()).reshape(1)


def _quantize(x, global_scale):
    import flashinfer

    return flashinfer.fp4_quantize(x, global_scale)


def _mode(device: str) -> Optional[str]:
    """How fp4_quantize runs on ``device``: "reference" on CPU, else the current GPU's preload mode."""
    if device == "cpu":
        return "reference"
    loaded = {d["index"]: d for d in fp4_dynamo_shim.status()["devices"] or []}
    entry = loaded.get(torch.cuda.current_device())
    return entry["mode"] if entry else None


def _computes_values(device: str) -> bool:
    """Whether outputs on ``device`` hold real values (CPU reference, SM100+ kernel, or the reference fallback)."""
    return _mode(device) in ("kernel", "reference")


def _launches(device: str) -> bool:
    return _mode(device) not in (None, "refuse")


class _TraceOnly:
    """A torch.compile backend that records graphs and evaluates them on fake tensors, launching nothing.

    Used where the GPU has no FP4 kernel and the shim refuses to run it: tracing is still proven.
    """

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.graphs.append(graph_module)

        def run(*args):
            with FakeTensorMode(allow_non_fake_inputs=True):
                return graph_module(*args)

        return run


def _trace_note(device: str) -> str:
    return "" if _launches(device) else " (traced on fake tensors: no FP4 kernel runs on this GPU)"


def check_trace_static(device: str) -> str:
    x, scale = _inputs(37, device)
    backend = _TraceOnly()
    torch.compile(_quantize, fullgraph=True, backend=backend if not _launches(device) else "eager")(x, scale)
    if _launches(device):
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(_quantize)(x, scale)
        graphs, breaks = explanation.graph_count, explanation.graph_break_count
    else:
        graphs, breaks = len(backend.graphs), 0  # fullgraph=True: any break would have raised
    if breaks or graphs != 1:
        raise AssertionError(f"{graphs} graphs, {breaks} graph breaks")
    return "fullgraph trace of flashinfer.fp4_quantize: 1 graph, 0 graph breaks (M=37)" + _trace_note(device)


def check_trace_dynamic(device: str) -> str:
    counter = torch._dynamo.testing.CompileCounterWithBackend(_TraceOnly() if not _launches(device) else "eager")
    compiled = torch.compile(_quantize, fullgraph=True, backend=counter, dynamic=None)
    sizes = (2, 17, 300)  # M=1 would be specialised by Dynamo's 0/1 rule, as for any tensor
    for rows in sizes:
        x, scale = _inputs(rows, device)
        torch._dynamo.mark_dynamic(x, 0)
        compiled(x, scale)
    if counter.frame_count != 1:
        raise AssertionError(f"{counter.frame_count} compilations for M in {sizes}; expected 1")
    return f"dim 0 marked dynamic, M in {sizes}: 1 graph, 0 graph breaks, no recompilation" + _trace_note(device)


def check_opcheck(device: str) -> str:
    from torch.library import opcheck

    x, scale = _inputs(64, device)
    arguments = (x, scale, 16, False, True, False, False, None, 0)
    if _computes_values(device):
        opcheck(ops.fp4_quantize_op, arguments)
        return f"torch.library.opcheck on {ops.NAMESPACE}::{ops.OP_NAME} ({device}): all tests"
    if not _launches(device):
        raise Skip("this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error: nothing to run")
    opcheck(ops.fp4_quantize_op, arguments, test_utils=("test_schema", "test_faketensor"))
    return "opcheck schema + fake-tensor tests (the kernel computes no values on this GPU)"


def check_compiled_matches_eager(device: str) -> str:
    if not _computes_values(device):
        raise Skip("no FP4 values on this GPU (SM<100); FP4_DYNAMO_SHIM_FALLBACK=reference makes them")
    compiled = torch.compile(_quantize, fullgraph=True, backend="inductor")
    for rows in (1, 33, 256):
        x, scale = _inputs(rows, device)
        for got, want in zip(compiled(x, scale), _quantize(x, scale)):
            if got.shape != want.shape or got.stride() != want.stride() or not torch.equal(got, want):
                raise AssertionError(f"M={rows}: compiled output differs from eager")
    where = "reference quantizer" if _mode(device) == "reference" else "FlashInfer kernel"
    return f"inductor output equals eager bitwise for M in (1, 33, 256) ({where})"


def check_cuda_graph(device: str) -> str:
    if device != "cuda":
        raise Skip("CUDA graphs need a GPU")
    if not _launches(device):
        raise Skip("this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error")
    compiled = torch.compile(_quantize, fullgraph=True, backend="inductor")
    x, scale = _inputs(64, device)
    for _ in range(2):
        compiled(x, scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = compiled(x, scale)
    fresh, _ = _inputs(65, device)
    x.copy_(fresh[:64])
    graph.replay()
    torch.cuda.synchronize()
    if not _computes_values(device):
        return "captured and replayed (values not compared: the kernel writes nothing on this GPU)"
    for got, want in zip(static_outputs, _quantize(x, scale)):
        if not torch.equal(got, want):
            raise AssertionError("replayed outputs differ from eager on the same inputs")
    return "captured and replayed; replay outputs equal eager bitwise on fresh inputs"


def check_sglang_compile_path(device: str) -> str:
    described = sglang_releases.describe()
    if described.get("installed") is None:
        raise Skip("sglang is not installed")
    if not described.get("compile_path_check"):
        raise Skip(f"sglang {described['installed']}: {described.get('note', 'no install_torch_compiled path')}")
    if device != "cuda":
        raise Skip("SGLang's piecewise CUDA graph needs a GPU")
    if not _launches(device):
        raise Skip("this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error")
    outcome = sglang.compile_path_check(compare_values=_computes_values(device))
    if outcome["replays_equal_eager"] is False:
        raise AssertionError("replays through SGLang's piecewise CUDA graphs differ from eager")
    if outcome["cuda_graphs_captured"] < len(outcome["capture_sizes"]):
        raise AssertionError(f"SGLang captured {outcome['cuda_graphs_captured']} CUDA graphs for capture sizes "
                             f"{outcome['capture_sizes']}")
    compared = "equal eager" if outcome["replays_equal_eager"] else "not compared (no FP4 values on this GPU)"
    return (f"sglang {described['installed']} install_torch_compiled + SGLangBackend, capture sizes "
            f"{outcome['capture_sizes']}: traced, {outcome['cuda_graphs_captured']} CUDA graphs captured, replayed; "
            f"outputs {compared}")


def family_examples(device: str) -> dict:
    """name -> (args, kwargs): one valid call of each FP4 family function, inputs built on the CPU (the
    reference) and moved to ``device``, so that building them needs no FP4 kernel."""
    import flashinfer

    def on(*tensors):
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors)

    x, scale = _inputs(32, "cpu", columns=128)
    packed, sf = flashinfer.fp4_quantize(x, scale)
    _, sf_linear = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    w, w_scale = _inputs(64, "cpu", columns=128)
    w_packed, w_sf = flashinfer.fp4_quantize(w, w_scale)
    mx_packed, mx_sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    mx_swizzled = flashinfer.fp4_quantize(x, None, 32, True, True)
    experts = x[:, :64].reshape(2, 16, 64).contiguous()
    mask = torch.tensor([16, 9], dtype=torch.int32)
    return {
        "nvfp4_quantize": (on(x, scale), {}),
        "mxfp4_quantize": (on(x), {}),
        "block_scale_interleave": (on(sf_linear), {}),
        "e2m1_and_ufp8sf_scale_to_float": ((packed, sf.reshape(-1), 1.0 / scale), {}),  # host functions
        "mxfp4_dequantize": (on(*mx_swizzled), {}),
        "mxfp4_dequantize_host": ((mx_packed, mx_sf), {}),
        "nvfp4_batched_quantize": (on(x.view(2, 16, 128), scale), {}),
        "scaled_fp4_grouped_quantize": (on(experts, mask, torch.tensor([3.0, 5.0])), {}),
        "silu_and_mul_scaled_nvfp4_experts_quantize": (on(experts, mask, torch.tensor([3.0, 5.0])), {}),
        "mm_fp4": (on(packed, w_packed.t(), sf, w_sf.t(), 1.0 / (scale * w_scale)), {"out_dtype": torch.bfloat16}),
    }


def check_family(device: str) -> str:
    """Each FP4 family function the shim replaced, called once: a result, the shim's refusal on a GPU with no
    FP4 kernel, or exactly FlashInfer's own error (what its original function raises for the same call)."""
    import flashinfer

    from fp4_dynamo_shim import patching
    from fp4_dynamo_shim.errors import NoFp4KernelError

    replaced = [name for name, state in fp4_dynamo_shim.status()["family"].items() if state.startswith("op-backed")]
    examples = family_examples(device)
    outcomes = {"result": [], "refused (no FP4 kernel)": [], "FlashInfer's own error": []}
    for name in replaced:
        args, kwargs = examples[name]
        try:
            getattr(flashinfer, name)(*args, **kwargs)
            outcomes["result"].append(name)
            continue
        except NoFp4KernelError:
            outcomes["refused (no FP4 kernel)"].append(name)
            continue
        except Exception as error:  # compared with FlashInfer's own outcome below
            shim_error = error
        try:
            patching.original_function(name)(*args, **kwargs)
        except Exception as error:  # FlashInfer's own refusal, the one acceptable error
            if type(error) is type(shim_error) and str(error) == str(shim_error):
                outcomes["FlashInfer's own error"].append(f"{name}: {type(error).__name__}: {str(error)[:80]}")
                continue
        raise AssertionError(f"{name}: {type(shim_error).__name__}: {str(shim_error)[:200]} "
                             "(FlashInfer's own function does not raise this)")
    summary = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in outcomes.items() if names)
    return f"{len(replaced)} functions called once on {device}: {summary}"


@contextlib.contextmanager
def _main_module_hidden():
    """multiprocessing's spawn re-imports the parent's main module in the child (here verify itself, which
    imports the shim). SGLang's launcher does not import the shim, so the probe child must not either."""
    import types

    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def check_worker_activation(device: str) -> str:
    """A child started the way SGLang starts its schedulers (multiprocessing spawn, this process's environment,
    no import of the shim in the child) must end up with the shim active, through the import hook,
    sitecustomize, or (SGLang >= 0.5.11) the plugin, whenever activation was asked for."""
    import multiprocessing

    import fp4_dynamo_shim_hook

    state = fp4_dynamo_shim.status()
    if state["disabled"]:
        raise Skip("FP4_DYNAMO_SHIM_DISABLE=1: workers do not apply the shim, as asked")
    release = sglang_releases.release_for(sglang_releases.installed_version())
    run_plugins = bool(state["routes"]["plugin"]) and release is not None and release.loads_plugins
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=fp4_dynamo_shim_hook.probe_worker, args=(queue, run_plugins))
    with _main_module_hidden():
        process.start()
    try:
        report = queue.get(timeout=600)
    finally:
        process.join(timeout=60)
    routes = {name: path for name, path in state["routes"].items() if path}
    if report.get("active"):
        via = report["activated_by"] + (f" ({report['hook_route']} hook)" if report.get("hook_route") else "")
        return f"a spawned worker applied the shim by itself: {via}"
    asked = [reason for reason, present in (
        (f"{fp4_dynamo_shim_hook.HOOK_VARIABLE}={state['children'][fp4_dynamo_shim_hook.HOOK_VARIABLE]}",
         fp4_dynamo_shim_hook.switch(fp4_dynamo_shim_hook.HOOK_VARIABLE)[0]),
        ("an installed always-on hook", routes.get("hook_pth") or routes.get("sitecustomize")),
    ) if present]
    detail = (f"a spawned worker did NOT apply the shim (hook route in the child: {report.get('hook_route')}; "
              f"routes installed here: {', '.join(f'{k}={v}' for k, v in routes.items()) or 'none'}"
              + (f"; {report['error']}" if report.get("error") else "") + ")")
    if not asked:
        raise Skip(detail + "; activation was not asked for (FP4_DYNAMO_SHIM is off and no hook is installed)")
    raise AssertionError(f"{' and '.join(asked)}, but {detail}. Install the package with pip (wheel or -e) or "
                         "run `fp4-dynamo-shim install-hook`; see docs/usage.md, \"Is it active in my SGLang workers?\"")


def check_baseline(device: str) -> str:
    """Show FlashInfer's own function failing under fullgraph (what the shim fixes)."""
    if device != "cuda":
        raise Skip("the unpatched failure is shown on a GPU (on CPU FlashInfer stops earlier, at the device check)")
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    try:
        x, scale = _inputs(16, device)
        torch.compile(_quantize, fullgraph=True, backend="eager")(x, scale)
    except Exception as error:  # the point of this check is to show it
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"unpatched: {type(error).__name__}: {first_line[:160]} (expected; the shim fixes this)"
    finally:
        torch._dynamo.reset()
        fp4_dynamo_shim.apply()
    raise AssertionError("the unpatched function compiled under fullgraph; the shim is not needed here")


CHECKS: List[tuple] = [
    ("trace-static", check_trace_static),
    ("trace-dynamic", check_trace_dynamic),
    ("opcheck", check_opcheck),
    ("compiled-vs-eager", check_compiled_matches_eager),
    ("cuda-graph", check_cuda_graph),
    ("sglang-compile", check_sglang_compile_path),
    ("family", check_family),
    ("worker-activation", check_worker_activation),
]


def run_check(name: str, check: Callable, device: str) -> Result:
    started = time.perf_counter()
    try:
        detail, result = check(device), "pass"
    except Skip as skip:
        detail, result = str(skip), "skip"
    except Exception as error:
        lines = traceback.format_exception_only(type(error), error)
        detail, result = "".join(lines).strip().splitlines()[0][:400], "fail"
    finally:
        torch._dynamo.reset()
    if name == "baseline" and result == "pass":
        result = "info"
    return Result(name, result, detail, round(time.perf_counter() - started, 2))


def environment() -> dict:
    status = fp4_dynamo_shim.status()
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
        "fp4_dynamo_shim": fp4_dynamo_shim.__version__,
        "jit_cache": jit_cache,
    }


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
    print(f"  flashinfer   {env['flashinfer']} (supported: {env['supported_flashinfer']})")
    sglang_info = env["sglang"]
    print(f"  sglang       {sglang_info.get('installed') or 'not installed'}"
          + (f": {sglang_info['note']}" if sglang_info.get("note") else ""))
    print(f"  jit cache    {env['jit_cache']}")
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


def main(argv: Optional[List[str]] = None) -> int:
    parser = Parser(prog="fp4-dynamo-shim verify", description=__doc__.split("\n\n")[0],
                    epilog="Exit codes: 0 ok, 1 a check failed, 2 the shim is not applied, 3 usage error.")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when a GPU is visible, else cpu")
    parser.add_argument("--baseline", action="store_true", help="also show FlashInfer failing without the shim")
    parser.add_argument("--verbose", action="store_true", help="list every rebound name by module")
    parser.add_argument("--version", action="version", version=f"fp4-dynamo-shim {fp4_dynamo_shim.__version__}")
    options = parser.parse_args(argv)
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU visible")

    env = environment()
    results: List[Result] = []
    status = fp4_dynamo_shim.status()
    if not status["applied"]:
        exit_code = EXIT_NOT_APPLIED
    else:
        for name, check in CHECKS:
            if not options.json:
                print(f"  running {name} ...", file=sys.stderr, flush=True)
            results.append(run_check(name, check, device))
        if options.baseline:
            results.append(run_check("baseline", check_baseline, device))
        exit_code = EXIT_CHECK_FAILED if any(r.result == "fail" for r in results) else EXIT_OK
        status = fp4_dynamo_shim.status()

    if options.json:
        document = {
            "environment": env,
            "status": status,
            "device": device,
            "checks": [dataclasses.asdict(r) for r in results],
            "summary": {kind: sum(r.result == kind for r in results) for kind in ("pass", "fail", "skip", "info")},
            "exit_code": exit_code,
        }
        print(json.dumps(document, indent=2))
    else:
        _print_text(env, status, results, exit_code, options.verbose)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
