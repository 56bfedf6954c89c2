"""FlashInfer's CUDA version, decided once at apply time instead of by ``nvcc --version`` per call.

``flashinfer.jit.cpp_ext.get_cuda_version`` runs a subprocess (behind a
``functools.cache`` that Dynamo does not honour), which is the first thing
``torch.compile(fullgraph=True)`` dies on. The replacements below return a
constant and compare plain tuples, both of which Dynamo traces.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import shutil
import subprocess
from typing import Optional, Tuple

import torch
from packaging.version import Version

from . import rebind, switches
from .errors import ApplyError
from .layers import Context
from .sources import Part

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree

#: FlashInfer's module that defines both lookups.
CPP_EXT = "flashinfer.jit.cpp_ext"
#: What an untested release is compared on: both lookups, defined where the shim rebinds them (a lookup that
#: moved or was renamed is one the shim would miss). Their bodies are replaced whole, so only presence,
#: place and signature count.
PART = Part("get_cuda_version", CPP_EXT, "get_cuda_version", names=("is_cuda_version_at_least",),
            source=False)


@dataclasses.dataclass(frozen=True)
class CudaVersion:
    version: Optional[Version]
    #: Where it came from: "torch", "nvcc", "environment", or "none".
    source: str
    nvcc: Optional[Version]
    nvcc_path: Optional[str]
    #: Why the version asked for (``nvcc``) is not the one FlashInfer is told, or None.
    problem: Optional[str] = None


def describe(resolved: CudaVersion) -> dict:
    return {"value": str(resolved.version) if resolved.version else None, "source": resolved.source,
            "nvcc": str(resolved.nvcc) if resolved.nvcc else None, "nvcc_path": resolved.nvcc_path,
            "problem": resolved.problem}


def find_nvcc() -> Optional[str]:
    """nvcc where FlashInfer's get_cuda_path looks: $CUDA_HOME (or $CUDA_PATH) alone when set, else PATH,
    else /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        candidate = os.path.join(home, "bin", "nvcc")
        return candidate if os.path.exists(candidate) else None
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.path.exists(default) else None


#: Seconds ``nvcc --version`` may take before the shim gives up on it (apply() waits for it).
NVCC_TIMEOUT_S = 30


def nvcc_release(nvcc: Optional[str]) -> Tuple[Optional[Version], Optional[str]]:
    """(the CUDA release ``nvcc --version`` prints, None) or (None, why there is none)."""
    if nvcc is None:
        return None, "no nvcc was found ($CUDA_HOME/bin, PATH, /usr/local/cuda/bin)"
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S,
                              check=True).stdout
    except subprocess.TimeoutExpired:
        return None, f"{nvcc} --version did not finish in {NVCC_TIMEOUT_S} s"
    except subprocess.CalledProcessError as error:
        return None, f"{nvcc} --version exited with status {error.returncode}"
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"{nvcc} --version could not run ({type(error).__name__}: {error})"
    match = re.search(r"release (\d+\.\d+),", text)
    if match is None:
        return None, f"{nvcc} --version printed no 'release X.Y,' ({text.strip()[:80]!r})"
    return Version(match.group(1)), None


def resolve(setting: str) -> CudaVersion:
    """Decide the version per ``FP4_DYNAMO_SHIM_CUDA_VERSION`` (``torch``, ``nvcc`` or ``X.Y``)."""
    nvcc_path = find_nvcc()
    nvcc, nvcc_problem = nvcc_release(nvcc_path)
    torch_cuda = Version(torch.version.cuda) if torch.version.cuda else None
    problem = None
    if setting == "torch":
        version, source = (torch_cuda, "torch") if torch_cuda else (nvcc, "nvcc")
    elif setting == "nvcc":
        version, source = (nvcc, "nvcc") if nvcc else (torch_cuda, "torch")
        if nvcc is None:
            problem = (f"FP4_DYNAMO_SHIM_CUDA_VERSION=nvcc, but {nvcc_problem}; FlashInfer's JIT is told "
                       + (f"torch's CUDA {torch_cuda}" if torch_cuda else "nothing new (its own lookup is kept)"))
    else:
        try:
            version, source = Version(setting), "environment"
        except ValueError:
            raise ValueError(f"FP4_DYNAMO_SHIM_CUDA_VERSION={setting!r}: expected torch, nvcc or a version like 12.8") from None
    if version is None:
        source = "none"
    if nvcc and torch_cuda and nvcc.release[:2] != torch_cuda.release[:2]:
        switches.warn(
            f"nvcc at {nvcc_path} is CUDA {nvcc} but torch was built for CUDA {torch_cuda}; FlashInfer's JIT will be "
            f"told {version} ({source}). Set FP4_DYNAMO_SHIM_CUDA_VERSION=nvcc|torch|X.Y to choose."
        )
    return CudaVersion(version, source, nvcc, nvcc_path, problem)


def _padded(parts) -> tuple:
    """(major, minor, micro) so that 12.8 == 12.8.0, as packaging compares them."""
    return (tuple(parts) + (0, 0, 0))[:3]


def make_replacements(resolved: CudaVersion, original_get_cuda_version):
    """Return (get_cuda_version, is_cuda_version_at_least) that answer from ``resolved``."""
    version = resolved.version

    if version is None:
        # Neither torch nor nvcc knows a CUDA version: keep FlashInfer's behaviour (it raises), lazily.
        def get_cuda_version() -> Version:
            return original_get_cuda_version()

        def is_cuda_version_at_least(version_str: str) -> bool:
            return original_get_cuda_version() >= Version(version_str)

    else:
        release = _padded(version.release)

        def get_cuda_version() -> Version:
            return version

        def is_cuda_version_at_least(version_str: str) -> bool:
            return release >= _padded(int(part) for part in version_str.split("."))

    get_cuda_version.__doc__ = f"CUDA version fixed by fp4_dynamo_shim at apply time ({version}, from {resolved.source})."
    return get_cuda_version, is_cuda_version_at_least


@dataclasses.dataclass
class CudaLayer:
    """FlashInfer's ``get_cuda_version`` and ``is_cuda_version_at_least`` answering from the resolved version
    (the first layer: building the FP4 kernels asks them), with undo and describe as every layer."""

    resolved: CudaVersion
    swaps: rebind.Swaps = dataclasses.field(default_factory=rebind.Swaps)
    #: Why the lookups were left as FlashInfer's (an untested release whose sources differ), or None.
    left: Optional[str] = None

    def undo(self) -> None:
        self.swaps.undo()

    def describe(self) -> dict:
        if self.left is not None:
            skipped = [f"CUDA version: {PART.name} differs ({self.left}); FlashInfer's own lookup is kept"]
        elif self.resolved.version is None:
            skipped = ["CUDA version: neither torch nor nvcc reports one; FlashInfer's own lookup is kept"]
        else:
            skipped = []
        return {"cuda_version": describe(self.resolved),
                "warnings": [self.resolved.problem] if self.resolved.problem else [], "skipped": skipped}


def apply(context: Context) -> CudaLayer:
    """The first layer: FlashInfer's lookups answer from the resolved version (``FP4_DYNAMO_SHIM_CUDA_VERSION``),
    or stay FlashInfer's where an untested release's differ. A setting that cannot be honoured warns, and
    raises under strict mode with nothing rebound."""
    if PART.name in context.left:
        return CudaLayer(CudaVersion(None, "none", None, None), left=context.left[PART.name])
    cpp_ext = importlib.import_module(CPP_EXT)
    layer = CudaLayer(resolve(context.settings.cuda_version))
    original_get = cpp_ext.get_cuda_version
    new_get, new_at_least = make_replacements(layer.resolved, original_get)
    layer.swaps.swap((cpp_ext.is_cuda_version_at_least, new_at_least), (original_get, new_get))
    if hasattr(original_get, "cache_clear"):
        original_get.cache_clear()
    if layer.resolved.problem:
        if context.settings.strict:
            layer.undo()
            raise ApplyError(layer.resolved.problem)
        switches.warn(layer.resolved.problem)
    return layer
