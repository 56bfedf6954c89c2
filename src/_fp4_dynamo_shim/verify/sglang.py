"""verify's SGLang checks: the installed release against the shim's table, and SGLang's own compile path
(``install_torch_compiled`` + ``set_compiled``, 0.5.3.post2-0.5.9) driven over the shim's op."""

from __future__ import annotations

from ..sglang import sglang_releases
from ..sglang import source
from .checks import Skip, _computes_values, _launches


def check_sglang_release(device: str) -> str:
    """The installed SGLang has a row in the shim's table, and its source (read, not imported) still looks
    the way that row says: how it binds FlashInfer, its prefill-graph default, its plugin loading, its pins.
    Fails for a release the table does not know, since whether it needs the shim is then unknown."""
    import importlib.metadata

    version = sglang_releases.installed_version()
    if version is None:
        raise Skip("sglang is not installed")
    facts = source.read_release(source.installed_reader())
    pins = source.pins(importlib.metadata.requires("sglang"))
    problems = sglang_releases.disagreements(version, facts, pins)
    if problems:
        raise AssertionError(f"SGLang {version}: {'; '.join(problems)}; {sglang_releases.describe()['need']}")
    return sglang_releases.describe()["need"]


def check_sglang_compile_path(device: str) -> str:
    described = sglang_releases.describe()
    if described.get("installed") is None:
        raise Skip("sglang is not installed")
    if not described.get("compile_path_check"):
        raise Skip(f"sglang {described['installed']}: verify drives SGLang's install_torch_compiled + set_compiled "
                   "only on 0.5.3.post2-0.5.9" + (f" ({described['note']})" if described["note"] else ""))
    if device != "cuda":
        raise Skip("SGLang's piecewise CUDA graph needs a GPU")
    if not _launches(device):
        raise Skip("this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error")
    outcome = compile_path_check(compare_values=_computes_values(device))
    if outcome["replays_equal_eager"] is False:
        raise AssertionError("replays through SGLang's piecewise CUDA graphs differ from eager")
    if outcome["cuda_graphs_captured"] < len(outcome["capture_sizes"]):
        raise AssertionError(f"SGLang captured {outcome['cuda_graphs_captured']} CUDA graphs for capture sizes "
                             f"{outcome['capture_sizes']}")
    compared = "equal eager" if outcome["replays_equal_eager"] else "not compared (no FP4 values on this GPU)"
    return (f"sglang {described['installed']} install_torch_compiled + SGLangBackend, capture sizes "
            f"{outcome['capture_sizes']}: traced, {outcome['cuda_graphs_captured']} CUDA graphs captured, replayed; "
            f"outputs {compared}")



def _one_rank_process_group() -> None:
    """SGLang's compile path asks torch.distributed for its rank; give it a group of one."""
    import socket

    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)


def compile_path_check(capture_sizes=(2, 4, 8), hidden: int = 256, compare_values: bool = True, block=None) -> dict:
    """Run SGLang's own ``install_torch_compiled`` + ``SGLangBackend`` on a small NVFP4-style block.

    The block's forward calls ``flashinfer.fp4_quantize`` through the ``flashinfer`` module global, as
    SGLang's layers call their module-level binding. It is compiled with ``fullgraph=True`` by SGLang,
    piecewise CUDA graphs are captured for ``capture_sizes`` in a fresh graph pool, and each size is
    replayed on fresh inputs copied into the captured buffers (sizes above 1: Dynamo specialises size 1,
    and SGLang captures no graph for that static compilation). Needs a GPU and SGLang 0.5.3.post2-0.5.9.
    ``block`` replaces the built-in block (a CUDA module taking ``[tokens, hidden]`` bf16).
    Returns what happened (``cuda_graphs_captured`` counts ``torch.cuda.CUDAGraph`` captures that completed
    while SGLang ran; ``replays_equal_eager`` is None when values were not compared); raises whatever SGLang
    or Dynamo raise.
    """
    import inspect

    import flashinfer
    import torch
    from sglang.srt.compilation import piecewise_context_manager as context
    from sglang.srt.compilation.compilation_config import CompilationConfig
    from sglang.srt.compilation.compile import install_torch_compiled, set_compiled

    class Fp4Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            generator = torch.Generator(device="cuda").manual_seed(0)
            self.weight = torch.nn.Parameter(
                torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16, generator=generator) * 0.05,
                requires_grad=False,
            )
            self.register_buffer("global_scale", torch.tensor([448.0 * 6.0 / 8.0], device="cuda"))

        def forward(self, x: torch.Tensor):
            normed = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
            packed, scales = flashinfer.fp4_quantize(normed, self.global_scale)
            return packed, scales, normed @ self.weight

    _one_rank_process_group()
    block = Fp4Block() if block is None else block
    options = {"capture_sizes": list(capture_sizes), "compiler": "eager"}
    accepted = inspect.signature(CompilationConfig).parameters
    config = CompilationConfig(**{k: v for k, v in options.items() if k in accepted})
    install_torch_compiled(block, dynamic_arg_dims={"x": 0}, compile_config=config,
                           graph_pool=torch.cuda.graph_pool_handle())
    stream_context = getattr(context, "set_pcg_capture_stream", None)
    result = {"capture_sizes": list(capture_sizes), "replays_equal_eager": None, "cuda_graphs_captured": 0}
    captured = []
    capture_end = torch.cuda.CUDAGraph.capture_end

    def counting_capture_end(graph, *args, **kwargs):
        capture_end(graph, *args, **kwargs)
        captured.append(graph)

    torch.cuda.CUDAGraph.capture_end = counting_capture_end
    try:
        mismatches = _capture_and_replay(block, capture_sizes, hidden, compare_values, context, set_compiled,
                                         stream_context)
    finally:
        torch.cuda.CUDAGraph.capture_end = capture_end
    result["cuda_graphs_captured"] = len(captured)
    if compare_values:
        result["replays_equal_eager"] = mismatches == 0
    return result


def _capture_and_replay(block, capture_sizes, hidden, compare_values, context, set_compiled, stream_context) -> int:
    """Compile, warm up and capture each size, then replay on fresh inputs; returns the mismatches with eager."""
    import contextlib

    import torch

    capture_stream = torch.cuda.Stream()
    static_inputs = {size: torch.zeros(size, hidden, device="cuda", dtype=torch.bfloat16) for size in capture_sizes}
    mismatches = 0
    with context.enable_piecewise_cuda_graph(), set_compiled(True):
        with (stream_context(capture_stream) if stream_context else contextlib.nullcontext()):
            for size in capture_sizes:  # compile on the first call, warm up, capture
                for _ in range(3):
                    block(static_inputs[size].normal_())
            torch.cuda.synchronize()
            for size in capture_sizes:  # replay on fresh values in the captured buffers
                static_inputs[size].copy_(torch.randn(size, hidden, device="cuda", dtype=torch.bfloat16))
                replayed = [t.clone() for t in block(static_inputs[size])]
                if compare_values:
                    with set_compiled(False):
                        eager = block(static_inputs[size])
                    mismatches += sum(not torch.equal(r, e) for r, e in zip(replayed, eager))
            torch.cuda.synchronize()
    return mismatches

