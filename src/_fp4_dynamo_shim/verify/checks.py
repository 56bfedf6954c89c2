"""The checks ``python -m fp4_dynamo_shim.verify`` runs on the shim's ops, one function each (SGLang's in
:mod:`.sglang`, the spawned worker's in :mod:`.workers`; :func:`.report.checks` lists them in order).

Each check takes the device ("cpu" or "cuda"), returns one line saying what it showed, raises
:class:`Skip` when it does not apply here and anything else when it failed.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch._dynamo.testing

from .. import lifecycle
from ..fp4 import quantize_op


class Skip(Exception):
    """A check that does not apply here; the message says why."""


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
    loaded = {d["index"]: d for d in lifecycle.status()["devices"] or []}
    entry = loaded.get(torch.cuda.current_device())
    return entry["mode"] if entry else None


def _computes_values(device: str) -> bool:
    """Whether outputs on ``device`` hold real values (CPU reference, SM100+ kernel, or the reference fallback)."""
    return _mode(device) in ("kernel", "reference")


def _launches(device: str) -> bool:
    return _mode(device) not in (None, "error")


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
        opcheck(quantize_op.fp4_quantize_op, arguments)
        return f"torch.library.opcheck on {quantize_op.NAMESPACE}::{quantize_op.OP_NAME} ({device}): all tests"
    if not _launches(device):
        raise Skip("this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error: nothing to run")
    opcheck(quantize_op.fp4_quantize_op, arguments, test_utils=("test_schema", "test_faketensor"))
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


def check_flashinfer_op(device: str) -> str:
    """FlashInfer's own ``torch.ops.flashinfer.fp4_quantize`` (0.6.12+), repaired by the shim: compiled with
    fullgraph on row-major, column-major and 3-D input, its outputs' shapes and strides equal the function's
    (and their values, where this device computes them); on a GPU also captured and replayed."""
    from _fp4_dynamo_shim.fp4 import flashinfer_op

    if not flashinfer_op.flashinfer_has_op():
        raise Skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
    if not _launches(device):
        raise Skip("this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error")
    op = torch.ops.flashinfer.fp4_quantize

    def call(t, s):
        return op(t, s, 16, False, True, False, None)

    compiled = torch.compile(call, fullgraph=True, backend="inductor")
    x, scale = _inputs(64, device)
    compiled(x, scale)  # compiled and warmed up on row-major input before the other layouts and the capture
    values = _computes_values(device)
    for name, t in (("row-major", x), ("column-major", x.t().contiguous().t()), ("3-D", x.view(2, 32, -1))):
        got, want = compiled(t, scale), _quantize(t, scale)
        for g, w in zip(got, want):
            if g.shape != w.shape or g.stride() != w.stride() or g.dtype != w.dtype:
                raise AssertionError(f"{name}: compiled op gives {tuple(g.shape)}/{g.stride()}, the function "
                                     f"{tuple(w.shape)}/{w.stride()}")
            if values and not torch.equal(g, w):
                raise AssertionError(f"{name}: the compiled op's values differ from flashinfer.fp4_quantize's")
    detail = "compiled with fullgraph (row-major, column-major, 3-D): outputs equal the function's"
    detail += " bitwise" if values else " in shape, stride and dtype (no FP4 values on this GPU)"
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = compiled(x, scale)
        x.copy_(_inputs(65, device)[0][:64])
        graph.replay()
        torch.cuda.synchronize()
        if values and not all(torch.equal(g, w) for g, w in zip(static, _quantize(x, scale))):
            raise AssertionError("the op's replayed CUDA graph differs from eager on the same inputs")
        detail += "; captured and replayed" + (" (replay equals eager)" if values else "")
    return detail


def family_examples(device: str) -> dict:
    """name -> (args, kwargs): one valid call of each FP4 family function, inputs built on the CPU (the
    reference) and moved to ``device``, so that building them needs no FP4 kernel."""

    def on(*tensors):
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors)

    def quantize(input, global_scale, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True):
        # the shim's op, not flashinfer.fp4_quantize: on a release newer than tested that may be FlashInfer's own
        return quantize_op.fp4_quantize_op(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, False,
                                   False, None, 0)

    x, scale = _inputs(32, "cpu", columns=128)
    packed, sf = quantize(x, scale)
    _, sf_linear = quantize(x, scale, is_sf_swizzled_layout=False)
    w, w_scale = _inputs(64, "cpu", columns=128)
    w_packed, w_sf = quantize(w, w_scale)
    mx_packed, mx_sf = quantize(x, None, 32, True, False)
    mx_swizzled = quantize(x, None, 32, True, True)
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

    from _fp4_dynamo_shim.errors import NoFp4KernelError

    replaced = [name for name, state in lifecycle.status()["family"].items() if state.startswith("op-backed")]
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
            lifecycle.original_function(name)(*args, **kwargs)
        except Exception as error:  # FlashInfer's own refusal, the one acceptable error
            if type(error) is type(shim_error) and str(error) == str(shim_error):
                outcomes["FlashInfer's own error"].append(f"{name}: {type(error).__name__}: {str(error)[:80]}")
                continue
        raise AssertionError(f"{name}: {type(shim_error).__name__}: {str(shim_error)[:200]} "
                             "(FlashInfer's own function does not raise this)")
    summary = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in outcomes.items() if names)
    return f"{len(replaced)} functions called once on {device}: {summary}"


def check_flashinfer_ops(device: str) -> str:
    """FlashInfer's declared ops: the gate's counts, and ``flashinfer.norm.layernorm`` (on under every
    gate but off) traced under fullgraph to the shim's op: on fake CUDA tensors without a GPU, run and compared
    with eager bitwise on one."""
    import flashinfer.norm
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = lifecycle.status()["flashinfer_ops"]
    if layer is None or layer["gate"] == "off":
        raise Skip("FP4_DYNAMO_SHIM_FLASHINFER_OPS=off: FlashInfer's declared ops are not registered")
    counts = layer["counts"]
    summary = f"{counts['registered']} of {counts['declared']} declared ops registered (gate {layer['gate']})"
    if counts["failed"]:
        raise AssertionError(f"{summary}; failed: {', '.join(layer['failed'])}")
    if "flashinfer.norm.layernorm" not in layer["registered"]:
        raise Skip(f"{summary}; flashinfer.norm.layernorm is not among them here")

    def call(x, weight, bias):
        return flashinfer.norm.layernorm(x, weight, bias, 1e-6)

    if device == "cuda":
        x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
        weight, bias = torch.randn(128, device="cuda"), torch.randn(128, device="cuda")
        explanation = torch._dynamo.explain(call)(x, weight, bias)
        torch._dynamo.reset()
        same = torch.equal(torch.compile(call, fullgraph=True, backend="inductor")(x, weight, bias),
                           call(x, weight, bias))
        if (explanation.graph_count, explanation.graph_break_count) != (1, 0) or not same:
            raise AssertionError(f"layernorm: {explanation.graph_count} graphs, {explanation.graph_break_count} "
                                 f"breaks, compiled {'equals' if same else 'differs from'} eager")
        return f"{summary}; layernorm: 1 graph, 0 breaks, inductor equals eager bitwise"
    with FakeTensorMode():
        x = torch.empty(64, 128, device="cuda", dtype=torch.bfloat16)
        weight, bias = torch.empty(128, device="cuda"), torch.empty(128, device="cuda")
    backend = _TraceOnly()
    torch.compile(call, fullgraph=True, backend=backend)(x, weight, bias)
    quantize_op = {str(n.target) for g in backend.graphs for n in g.graph.nodes if "fp4_dynamo_shim_flashinfer" in str(n.target)}
    if len(backend.graphs) != 1 or not quantize_op:
        raise AssertionError(f"layernorm: {len(backend.graphs)} graphs, shim ops {sorted(quantize_op)}")
    return f"{summary}; layernorm traced to {', '.join(sorted(quantize_op))} on fake CUDA tensors (no GPU here)"


def check_baseline(device: str) -> str:
    """Show FlashInfer's own function failing under fullgraph (what the shim fixes)."""
    if device != "cuda":
        raise Skip("the unpatched failure is shown on a GPU (on CPU FlashInfer stops earlier, at the device check)")
    lifecycle.revert()
    torch._dynamo.reset()
    try:
        x, scale = _inputs(16, device)
        torch.compile(_quantize, fullgraph=True, backend="eager")(x, scale)
    except Exception as error:  # the point of this check is to show it
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"unpatched: {type(error).__name__}: {first_line[:160]} (expected; the shim fixes this)"
    finally:
        torch._dynamo.reset()
        lifecycle.apply()
    raise AssertionError("the unpatched function compiled under fullgraph; the shim is not needed here")
