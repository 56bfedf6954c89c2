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
    #: ``sglang.srt.compilation.compile.install_torch_compiled`` + ``set_compiled`` as verify drives them.
    compile_path_check: bool
    #: Each scheduler process loads the ``sglang.srt.plugins`` entry points (the shim's plugin route).
    loads_plugins: bool
    note: str


_NOT_AVAILABLE = "not available"
_ON_BY_DEFAULT = "on by default (--disable-piecewise-cuda-graph turns it off)"
_NEEDED_BY_DEFAULT = ("piecewise CUDA graph is on by default and traces fp4_quantize with fullgraph=True: the shim is "
                      "needed on NVFP4")
_SGLANG_WRAPS = ("SGLang wraps fp4_quantize as sglang::flashinfer_fp4_quantize for its NVFP4 linear layers; the shim "
                 "leaves that op alone (FlashInfer-level patching stays harmless) and still covers FlashInfer's other "
                 "call sites")

SGLANG_RELEASES = (
    SglangRelease(SpecifierSet("<0.5.3.post2"), _NOT_AVAILABLE, False, False, False,
                  "no torch.compile piecewise CUDA graph in this SGLang; the shim is harmless and not needed for SGLang"),
    SglangRelease(SpecifierSet(">=0.5.3.post2,<0.5.10"), "opt-in: --enable-piecewise-cuda-graph", False, True, False,
                  "piecewise CUDA graph traces fp4_quantize with fullgraph=True when enabled: the shim is needed on "
                  "NVFP4"),
    SglangRelease(SpecifierSet(">=0.5.10,<0.5.11"), _ON_BY_DEFAULT, False, True, False, _NEEDED_BY_DEFAULT),
    # 0.5.11 reorganised the compile path (no set_compiled; seen on the H200): verify's small check does not
    # drive it there; tests/gpu/test_gpu_engine.py runs 0.5.11's real engine instead.
    SglangRelease(SpecifierSet(">=0.5.11,<0.5.12"), _ON_BY_DEFAULT, False, False, True, _NEEDED_BY_DEFAULT),
    SglangRelease(SpecifierSet(">=0.5.12,<0.5.14"), _ON_BY_DEFAULT, True, False, True, _SGLANG_WRAPS),
    SglangRelease(SpecifierSet(">=0.5.14,<0.5.15"), "tc_piecewise prefill backend (the default)", True, False, True,
                  "the torch.compile piecewise graph became the tc_piecewise backend; SGLang wraps fp4_quantize itself"),
    SglangRelease(SpecifierSet(">=0.5.15"), "opt-in: --cuda-graph-backend-prefill tc_piecewise", True, False, True,
                  "tc_piecewise is no longer the default; SGLang wraps fp4_quantize itself"),
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


def needs_shim(release: Optional[SglangRelease]) -> bool:
    """Whether this SGLang's schedulers need the shim on NVFP4: its torch.compile piecewise CUDA graph traces
    ``flashinfer.fp4_quantize`` itself (from 0.5.12 SGLang wraps that call in its own op)."""
    return release is not None and release.piecewise_cuda_graph != _NOT_AVAILABLE and not release.wraps_fp4_quantize


PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "fp4_dynamo_shim"


def describe() -> dict:
    """SGLang as the shim sees it, for status() and verify (the same keys whether or not it is installed)."""
    version = installed_version()
    release = release_for(version)
    return {
        "installed": version,
        "piecewise_cuda_graph": release.piecewise_cuda_graph if release else None,
        "wraps_fp4_quantize": release.wraps_fp4_quantize if release else None,
        "compile_path_check": release.compile_path_check if release else None,
        "loads_plugins": release.loads_plugins if release else None,
        "note": release.note if release else None,
    }


def plugin_entry_point() -> Optional[str]:
    """The shim's ``sglang.srt.plugins`` entry point as installed (``module:function``), or None."""
    try:
        found = importlib.metadata.entry_points(group=PLUGIN_GROUP)
    except Exception:  # broken metadata elsewhere in the environment: report the plugin as not found
        return None
    return next((entry.value for entry in found if entry.name == PLUGIN_NAME), None)
