"""What an SGLang release's own source says about FlashInfer, read without importing SGLang.

Used two ways: ``tests/support/sglang_facts.py`` reads every released wheel into ``tests/data/sglang_facts.json``
(which the tests hold ``sglang_releases``' hand-written table against), and ``verify`` reads the installed
SGLang to check that it still looks the way its row says. Importing SGLang would cost seconds and needs a
GPU stack; parsing a handful of its files with ``ast`` costs milliseconds and works anywhere.

Every fact is a value and the place it was read (``"layers/quantization/fp4_utils.py:24"``, relative to
``sglang/srt/``), so a reader can check it against the release in one look.
"""

from __future__ import annotations

import ast
import re
from typing import Callable, Dict, Iterator, Optional, Tuple

#: A file of the release by its path under ``sglang/srt/`` -> its text, or None when the release lacks it.
Reader = Callable[[str], Optional[str]]

FP4_UTILS = "layers/quantization/fp4_utils.py"
MODELOPT = "layers/quantization/modelopt_quant.py"
SCHEDULER = "managers/scheduler.py"
PLUGINS = "plugins/__init__.py"
SERVER_ARGS = "server_args.py"
CUDA_GRAPH_CONFIG = "model_executor/cuda_graph_config.py"
COMPILE = "compilation/compile.py"
QWEN2_MOE = "models/qwen2_moe.py"
QWEN3_5 = "models/qwen3_5.py"
LAYERNORM = "layers/layernorm.py"

#: The requirements whose pins the table records (METADATA names, normalised).
PINNED = ("torch", "flashinfer-python", "sglang-kernel", "sgl-kernel", "transformers")

FACT_KEYS = (
    "fp4_quantize_binding", "fp4_quantize_bound_at", "fp4_quantize_op", "fp4_quantize_op_at",
    "fp4_quantize_keywords", "mm_fp4_bound_at", "mm_fp4_op", "mm_fp4_op_at", "scheduler_imports_fp4_utils_at",
    "load_plugins_at", "prefill_graph_default", "prefill_graph_default_at", "tc_piecewise", "compile_path",
    "raw_silu_and_mul_scaled_nvfp4_experts_quantize_at", "qwen3_5_enables_it_at", "raw_rmsnorm_quant_at",
)


def _parse(text: Optional[str]) -> Optional[ast.Module]:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:  # a release written for a newer Python than this one: nothing read from that file
        return None


def _walk_scoped(tree: ast.AST, scope: Optional[str] = None) -> Iterator[Tuple[ast.AST, Optional[str]]]:
    """Every node with the name of the function it is in (None at module level, try/if blocks included)."""
    for child in ast.iter_child_nodes(tree):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
        yield child, scope
        yield from _walk_scoped(child, inner)


def _imports(tree, module: str, name: str):
    """(bound name, line, enclosing function or None) for each ``from module import name [as bound]``."""
    found = []
    for node, scope in _walk_scoped(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module and node.level == 0:
            for alias in node.names:
                if alias.name == name:
                    found.append((alias.asname or alias.name, node.lineno, scope))
    return found


def _at(path: str, line: int) -> str:
    return f"{path}:{line}"


def _keyword(call: ast.Call, name: str):
    for keyword in call.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None


def _calls(tree, function_name: str):
    return [node for node, _ in _walk_scoped(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function_name]


def _fp4_utils(tree) -> dict:
    """0.5.12+: ``from flashinfer import fp4_quantize as _flashinfer_fp4_quantize`` at import, wrapped as an op."""
    facts = {}
    bound = [(name, line) for name, line, scope in _imports(tree, "flashinfer", "fp4_quantize") if scope is None]
    if not bound:
        return facts
    name, line = bound[0]
    facts["fp4_quantize_bound_at"] = _at(FP4_UTILS, line)
    for call in _calls(tree, "register_custom_op_from_extern"):
        op_name = _keyword(call, "op_name")
        if op_name:
            facts["fp4_quantize_op"], facts["fp4_quantize_op_at"] = f"sglang::{op_name}", _at(FP4_UTILS, call.lineno)
    keywords = sorted({k.arg for call in _calls(tree, name) for k in call.keywords if k.arg})
    facts["fp4_quantize_keywords"] = keywords
    return facts


def _modelopt(tree, facts: dict) -> None:
    """How the NVFP4 linear reaches ``fp4_quantize`` and ``mm_fp4``."""
    if tree is None:
        return
    if facts.get("fp4_quantize_op"):
        uses_op = any(scope is None for _, _, scope in _imports(tree, "sglang.srt.layers.quantization.fp4_utils",
                                                                  "fp4_quantize"))
        if uses_op:
            facts["fp4_quantize_binding"] = "sglang-op"
    if "fp4_quantize_binding" not in facts:
        raw = _imports(tree, "flashinfer", "fp4_quantize")
        module_level = [line for _, line, scope in raw if scope is None]
        if module_level:
            facts["fp4_quantize_binding"] = "module-global"
            facts["fp4_quantize_bound_at"] = _at(MODELOPT, module_level[0])
        elif raw:
            facts["fp4_quantize_binding"] = "call-time"
            facts["fp4_quantize_bound_at"] = _at(MODELOPT, raw[0][1])
    gemm = [(name, line) for name, line, scope in _imports(tree, "flashinfer", "mm_fp4") if scope is None]
    if not gemm:
        return
    name, line = gemm[0]
    facts["mm_fp4_bound_at"] = _at(MODELOPT, line)
    callers = {scope for node, scope in _walk_scoped(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "fp4_gemm" and callers == {"fp4_gemm"}:
            decorated = any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register_custom_op"
                            for d in node.decorator_list)
            if decorated:
                facts["mm_fp4_op"], facts["mm_fp4_op_at"] = "sglang::fp4_gemm", _at(MODELOPT, node.lineno)


def _scheduler(tree, plugins_tree) -> dict:
    facts = {}
    if tree is None:
        return facts
    for node, scope in _walk_scoped(tree):
        if (scope is None and isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("sglang.srt.layers.quantization.fp4_utils")):
            facts.setdefault("scheduler_imports_fp4_utils_at", _at(SCHEDULER, node.lineno))
        if (scope == "run_scheduler_process" and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name) and node.func.id == "load_plugins"):
            facts.setdefault("load_plugins_at", _at(SCHEDULER, node.lineno))
    defines = plugins_tree is not None and any(isinstance(n, ast.FunctionDef) and n.name == "load_plugins"
                                               for n in plugins_tree.body)
    if not defines:
        facts.pop("load_plugins_at", None)
    return facts


def _class_field(tree, class_name: str, field: str):
    """(default value, line) of ``field: ... = value`` in ``class class_name``, or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for statement in node.body:
                if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                        and statement.target.id == field and isinstance(statement.value, ast.Constant)):
                    return statement.value.value, statement.lineno
    return None


def _prefill_backends(tree) -> Optional[set]:
    """The names in ``ALLOWED_BACKENDS_PER_PHASE[Phase.PREFILL]`` (``{"TC_PIECEWISE", ...}``), or None."""
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(getattr(t, "id", None) == "ALLOWED_BACKENDS_PER_PHASE" for t in targets) and isinstance(
                node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Attribute) and key.attr == "PREFILL" and isinstance(value, ast.Tuple):
                    return {element.attr for element in value.elts if isinstance(element, ast.Attribute)}
    return None


def _prefill_graph(server_args, cuda_graph_config_text) -> dict:
    """The prefill graph a CUDA run gets by default, and whether tc_piecewise can be chosen.

    "none": no torch.compile piecewise graph; "opt-in": ``--enable-piecewise-cuda-graph``; "piecewise": on by
    default (``--disable-piecewise-cuda-graph``); from the per-phase config (0.5.14+): the prefill backend
    a CUDA run gets (``CudaGraphConfig.prefill``'s default, through ``default_prefill_backend()`` from 0.5.15).
    """
    config = _parse(cuda_graph_config_text)
    if config is not None:
        lines = cuda_graph_config_text.splitlines()
        fixed = next((i + 1 for i, line in enumerate(lines)
                      if "PhaseConfig(backend=Backend.TC_PIECEWISE)" in line), None)
        on_cuda = next(((i + 1, match.group(1).lower()) for i, line in enumerate(lines)
                        for match in [re.search(r"return Backend\.(\w+) if is_cuda\(\)", line)] if match), None)
        default, line = ("tc_piecewise", fixed) if fixed else (on_cuda[1], on_cuda[0]) if on_cuda else (None, None)
        selectable = "TC_PIECEWISE" in (_prefill_backends(config) or ())
        tc_piecewise = "default" if default == "tc_piecewise" else ("opt-in" if selectable else "removed")
        return {"prefill_graph_default": default, "prefill_graph_default_at": line and _at(CUDA_GRAPH_CONFIG, line),
                "tc_piecewise": tc_piecewise}
    if server_args is None:
        return {}
    disable = _class_field(server_args, "ServerArgs", "disable_piecewise_cuda_graph")
    enable = _class_field(server_args, "ServerArgs", "enable_piecewise_cuda_graph")
    if disable is not None and disable[0] is False:
        return {"prefill_graph_default": "piecewise", "prefill_graph_default_at": _at(SERVER_ARGS, disable[1])}
    if enable is not None and enable[0] is False:
        return {"prefill_graph_default": "opt-in", "prefill_graph_default_at": _at(SERVER_ARGS, enable[1])}
    return {"prefill_graph_default": "none"}


def _compile_path(tree) -> bool:
    names = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)} if tree is not None else set()
    return {"install_torch_compiled", "set_compiled"} <= names


def _raw_calls(read: Reader) -> dict:
    facts = {}
    qwen2_moe, qwen3_5, layernorm = (_parse(read(path)) for path in (QWEN2_MOE, QWEN3_5, LAYERNORM))
    name = "silu_and_mul_scaled_nvfp4_experts_quantize"
    if qwen2_moe is not None:
        at_call = [line for _, line, scope in _imports(qwen2_moe, "flashinfer", name) if scope is not None]
        if at_call:
            facts[f"raw_{name}_at"] = _at(QWEN2_MOE, at_call[0])
    if qwen3_5 is not None:
        enables = [node.lineno for node in ast.walk(qwen3_5) if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Attribute) and t.attr == "_enable_silu_fp4_quant_fusion"
                           for t in node.targets)
                   and isinstance(node.value, ast.Constant) and node.value.value is True]
        if enables:
            facts["qwen3_5_enables_it_at"] = _at(QWEN3_5, enables[0])
    if layernorm is not None:
        for bound, _, _ in _imports(layernorm, "flashinfer.norm", "rmsnorm_quant"):
            calls = _calls(layernorm, bound)
            if calls:
                facts["raw_rmsnorm_quant_at"] = _at(LAYERNORM, calls[0].lineno)
    return facts


def read_release(read: Reader) -> Dict[str, object]:
    """The facts of one release (``FACT_KEYS``, None where the release has no such thing)."""
    facts = dict.fromkeys(FACT_KEYS)
    fp4_utils = _parse(read(FP4_UTILS))
    found = _fp4_utils(fp4_utils) if fp4_utils is not None else {}
    _modelopt(_parse(read(MODELOPT)), found)
    found.update(_scheduler(_parse(read(SCHEDULER)), _parse(read(PLUGINS))))
    found.update(_prefill_graph(_parse(read(SERVER_ARGS)), read(CUDA_GRAPH_CONFIG)))
    found["compile_path"] = _compile_path(_parse(read(COMPILE)))
    found.update(_raw_calls(read))
    facts.update({k: v for k, v in found.items() if k in facts})
    return facts


def pins(requirements) -> Dict[str, Optional[str]]:
    """``{name: exact version}`` for the requirements in ``PINNED`` (``Requires-Dist`` lines, no extras)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = dict.fromkeys(("torch", "flashinfer-python", "sglang-kernel", "transformers"))
    for line in requirements or ():
        requirement = Requirement(line)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        name = canonicalize_name(requirement.name)
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if name in PINNED and exact:
            pinned["sglang-kernel" if name == "sgl-kernel" else name] = exact[0]
    return pinned


def installed_reader() -> Optional[Reader]:
    """A reader over the installed SGLang's files (from its distribution record, without importing it)."""
    import importlib.metadata

    try:
        distribution = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None

    def read(path: str) -> Optional[str]:
        try:
            return distribution.locate_file(f"sglang/srt/{path}").read_text(encoding="utf-8")
        except OSError:
            return None

    return read
