"""What each SGLang release needs from the shim, as data (read by ``status()`` and ``verify``)."""

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
