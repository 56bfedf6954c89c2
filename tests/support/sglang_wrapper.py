"""SGLang's own FP4 wrapper op, loaded from the verbatim copies in ``tests/data/sglang_sources`` (see
``tests/support/sglang_facts.py``), for ``tests/sglang/test_sglang_wrapper.py`` and ``benchmarks/sglang_op.py``.

What runs is SGLang's code: ``fp4_utils.py`` (binds ``from flashinfer import fp4_quantize as
_flashinfer_fp4_quantize`` at import, picks ``backend=`` and registers ``torch.ops.sglang.flashinfer_fp4_quantize``),
``custom_op.py`` and ``kernel_api_logging.py`` (``register_custom_op_from_extern``, ``debug_torch_op``) and
``direct_register_custom_op`` with its ``sglang_lib``. Stand-ins, each because the real one cannot load here:

* ``sglang.srt.utils.common`` is a module holding that excerpt plus platform queries answering for a CUDA
  machine (``is_cuda`` True, ``is_npu/is_xpu/is_musa`` False, ``is_sm100_supported`` and
  ``get_device_capability`` as asked): the real module imports triton, torchvision and SGLang's platform
  layer, which do not import on a CPU-only torch;
* ``sglang.srt.runtime_context`` (0.5.21's ``fp4_utils``) answers ``get_platform().is_sm100`` the same way;
* with ``cpu_kernel=True`` the op's kernel, which SGLang registers for the CUDA dispatch key only, is also
  registered for CPU (the same function), so that CPU tensors run it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
import typing
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.library import Library

SOURCES = Path(__file__).resolve().parents[1] / "data" / "sglang_sources"
OP = "flashinfer_fp4_quantize"
_MODULES = ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.utils.common", "sglang.srt.utils.custom_op",
            "sglang.srt.layers", "sglang.srt.layers.quantization", "sglang.srt.layers.quantization.fp4_utils",
            "sglang.srt.runtime_context", "sglang.kernel_api_logging", "sglang.kernels",
            "sglang.kernels.kernel_api_logging")


@dataclasses.dataclass
class LoadedSglang:
    version: str
    fp4_utils: types.ModuleType
    library: Library
    saved: dict

    def unload(self) -> None:
        """Unregister SGLang's op (so the next load registers its own) and restore ``sys.modules``."""
        self.library._destroy()
        for name, module in self.saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    sys.modules[name] = module
    return module


def _real(root: Path, name: str, relative: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, root / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load(version: str, sm100: bool, cpu_kernel: bool = True) -> LoadedSglang:
    """Import SGLang ``version``'s ``fp4_utils`` as on a GPU that is SM100 (``backend="cute-dsl"``) or not
    (``"cuda"``). It binds whatever ``flashinfer.fp4_quantize`` is at this moment, as SGLang's does."""
    root = SOURCES / version
    if not root.is_dir():
        raise FileNotFoundError(f"no copy of SGLang {version}'s sources in {SOURCES}")
    if hasattr(torch.ops.sglang, OP):
        raise RuntimeError(f"torch.ops.sglang.{OP} is already registered: unload the previous SGLang first")
    saved = {name: sys.modules.get(name) for name in _MODULES}
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.layers", "sglang.srt.layers.quantization",
                 "sglang.kernels"):
        _package(name)
    common = types.ModuleType("sglang.srt.utils.common")
    common.__dict__.update(
        torch=torch, Library=Library, List=typing.List, Optional=typing.Optional, Callable=typing.Callable,
        is_cuda=lambda: True, is_npu=lambda: False, is_xpu=lambda: False, is_musa=lambda: False,
        is_sm100_supported=lambda device=None: sm100,
        get_device_capability=lambda device_id=0: (10, 0) if sm100 else (12, 0),
    )
    excerpt = root / "sglang/srt/utils/common_excerpt.py"
    exec(compile(excerpt.read_text(), str(excerpt), "exec"), common.__dict__)
    sys.modules[common.__name__] = common
    runtime_context = types.ModuleType("sglang.srt.runtime_context")
    runtime_context.get_platform = lambda: SimpleNamespace(is_sm100=sm100, is_sm120=not sm100)
    runtime_context.get_exec = lambda: None
    sys.modules[runtime_context.__name__] = runtime_context
    try:
        for name in ("sglang.kernel_api_logging", "sglang.kernels.kernel_api_logging"):
            relative = name.replace(".", "/") + ".py"
            if (root / relative).exists():
                _real(root, name, relative)
        _real(root, "sglang.srt.utils.custom_op", "sglang/srt/utils/custom_op.py")
        fp4_utils = _real(root, "sglang.srt.layers.quantization.fp4_utils", "sglang/srt/layers/quantization/fp4_utils.py")
        if cpu_kernel:
            common.sglang_lib.impl(OP, fp4_utils._flashinfer_fp4_quantize_impl, "CPU")
    except BaseException:
        LoadedSglang(version, None, common.sglang_lib, saved).unload()
        raise
    return LoadedSglang(version, fp4_utils, common.sglang_lib, saved)
