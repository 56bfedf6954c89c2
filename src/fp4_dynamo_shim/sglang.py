"""SGLang integration: the ``sglang.srt.plugins`` entry point, and what each SGLang release needs.

SGLang runs the model in ``multiprocessing`` children started with *spawn*;
from 0.5.11 each scheduler process loads the ``sglang.srt.plugins`` entry points
first thing, after its modules are imported. :func:`plugin` applies the shim
there and rebinds the ``fp4_quantize`` globals those modules already bound.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


@dataclasses.dataclass(frozen=True)
class SglangRelease:
    versions: SpecifierSet
    #: How the torch.compile-based piecewise CUDA graph is switched on in these releases.
    piecewise_cuda_graph: str
    #: SGLang itself wraps flashinfer.fp4_quantize as ``sglang::flashinfer_fp4_quantize``.
    wraps_fp4_quantize: bool
    #: ``sglang.srt.compilation.compile.install_torch_compiled`` + ``SGLangBackend`` as verify drives them.
    compile_path_check: bool
    note: str


SGLANG_RELEASES = (
    SglangRelease(
        SpecifierSet("<0.5.3.post2"), "not available", False, False,
        "no torch.compile piecewise CUDA graph in this SGLang; the shim is harmless and not needed for SGLang",
    ),
    SglangRelease(
        SpecifierSet(">=0.5.3.post2,<0.5.10"), "opt-in: --enable-piecewise-cuda-graph", False, True,
        "piecewise CUDA graph traces fp4_quantize with fullgraph=True when enabled: the shim is needed on NVFP4",
    ),
    SglangRelease(
        SpecifierSet(">=0.5.10,<0.5.12"), "on by default (--disable-piecewise-cuda-graph turns it off)", False, True,
        "piecewise CUDA graph is on by default and traces fp4_quantize with fullgraph=True: the shim is needed on NVFP4",
    ),
    SglangRelease(
        SpecifierSet(">=0.5.12,<0.5.14"), "on by default (--disable-piecewise-cuda-graph turns it off)", True, True,
        "SGLang wraps fp4_quantize as sglang::flashinfer_fp4_quantize for its NVFP4 linear layers; the shim leaves "
        "that op alone (FlashInfer-level patching stays harmless) and still covers FlashInfer's other call sites",
    ),
    SglangRelease(
        SpecifierSet(">=0.5.14,<0.5.15"), "tc_piecewise prefill backend (the default)", True, False,
        "the torch.compile piecewise graph became the tc_piecewise backend; SGLang wraps fp4_quantize itself",
    ),
    SglangRelease(
        SpecifierSet(">=0.5.15"), "opt-in: --cuda-graph-backend-prefill tc_piecewise", True, False,
        "tc_piecewise is no longer the default; SGLang wraps fp4_quantize itself",
    ),
)


def installed_version() -> Optional[str]:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_for(version: Optional[str]) -> Optional[SglangRelease]:
    if version is None:
        return None
    try:
        parsed = Version(Version(version).public)
    except InvalidVersion:
        return None
    for release in SGLANG_RELEASES:
        if release.versions.contains(parsed, prereleases=True):
            return release
    return None


def describe() -> dict:
    """SGLang as the shim sees it, for status() and verify."""
    version = installed_version()
    release = release_for(version)
    if release is None:
        return {"installed": version}
    return {
        "installed": version,
        "piecewise_cuda_graph": release.piecewise_cuda_graph,
        "wraps_fp4_quantize": release.wraps_fp4_quantize,
        "compile_path_check": release.compile_path_check,
        "note": release.note,
    }


def plugin() -> None:
    """SGLang general plugin (entry point group ``sglang.srt.plugins``), run in every scheduler process."""
    from . import patching

    if patching.apply():
        patching.rebind_modules()


def _one_rank_process_group() -> None:
    """SGLang's compile path asks torch.distributed for its rank; give it a group of one."""
    import socket

    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)


def compile_path_check(capture_sizes=(1, 2, 4), hidden: int = 256, compare_values: bool = True, block=None) -> dict:
    """Run SGLang's own ``install_torch_compiled`` + ``SGLangBackend`` on a small NVFP4-style block.

    The block's forward calls ``flashinfer.fp4_quantize`` through the ``flashinfer`` module global, as
    SGLang's layers call their module-level binding. It is compiled with ``fullgraph=True`` by SGLang,
    piecewise CUDA graphs are captured for ``capture_sizes`` in a fresh graph pool, and each size is
    replayed on fresh inputs copied into the captured buffers. Needs a GPU and SGLang 0.5.3.post2-0.5.13.
    ``block`` replaces the built-in block (a CUDA module taking ``[tokens, hidden]`` bf16).
    Returns what happened; raises whatever SGLang or Dynamo raise.
    """
    import contextlib
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
    capture_stream = torch.cuda.Stream()
    stream_context = getattr(context, "set_pcg_capture_stream", None)
    static_inputs = {size: torch.zeros(size, hidden, device="cuda", dtype=torch.bfloat16) for size in capture_sizes}
    result = {"capture_sizes": list(capture_sizes), "replays_equal_eager": None}
    with context.enable_piecewise_cuda_graph(), set_compiled(True):
        with (stream_context(capture_stream) if stream_context else contextlib.nullcontext()):
            for size in capture_sizes:  # compile on the first call, warm up, capture
                for _ in range(3):
                    block(static_inputs[size].normal_())
            torch.cuda.synchronize()
            mismatches = 0
            for size in capture_sizes:  # replay on fresh values in the captured buffers
                static_inputs[size].copy_(torch.randn(size, hidden, device="cuda", dtype=torch.bfloat16))
                replayed = [t.clone() for t in block(static_inputs[size])]
                if compare_values:
                    with set_compiled(False):
                        eager = block(static_inputs[size])
                    mismatches += sum(not torch.equal(r, e) for r, e in zip(replayed, eager))
            torch.cuda.synchronize()
    if compare_values:
        result["replays_equal_eager"] = mismatches == 0
    return result

