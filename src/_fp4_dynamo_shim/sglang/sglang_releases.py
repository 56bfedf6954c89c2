"""What each SGLang release needs from the shim, as data (read by ``status()`` and ``verify``).

Written down from the released wheels, release by release (``tests/data/sglang_facts.json`` holds what each
wheel's source says, file:line; ``tests/sglang/test_sglang_release_table_matches_wheels.py`` holds this table against it). The shim is
needed where Dynamo traces a FlashInfer FP4 function itself: a torch.compile prefill graph (SGLang's
piecewise CUDA graph, later its ``tc_piecewise`` backend) whose model code calls FlashInfer raw. From 0.5.12
SGLang wraps the NVFP4 linear's calls in its own ops (``sglang::flashinfer_fp4_quantize``, ``sglang::fp4_gemm``),
which Dynamo does not enter; the shim is then harmless on that path (``docs/how-it-works.md``).

Releases older than the first row have no torch.compile graph; releases newer than the last row have no
row, and ``verify`` fails there until the table is extended (whether they need the shim is unknown).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Dict, List, Optional, Tuple

from packaging.specifiers import SpecifierSet

from ..versions import public, row_for


@dataclasses.dataclass(frozen=True)
class RawCall:
    """A FlashInfer function SGLang's model code calls itself (not through one of its own ops)."""

    function: str
    #: Where, and on which hardware or checkpoint.
    where: str
    #: The shim puts it behind a custom op under the default settings: ``fp4_quantize``, a member of
    #: ``family.MEMBERS``, or a declaration the declared-ops layer's default gate registers (SGLang's raw calls).
    covered: bool


@dataclasses.dataclass(frozen=True)
class SglangRelease:
    versions: SpecifierSet
    #: The prefill graph a CUDA run gets by default: "none" (this SGLang has no torch.compile graph), "opt-in"
    #: (``--enable-piecewise-cuda-graph``), "piecewise" (on; ``--disable-piecewise-cuda-graph`` turns it off),
    #: "tc_piecewise" (the per-phase config's torch.compile backend) or "breakable" (captured, not compiled).
    prefill_graph: str
    #: ``--cuda-graph-backend-prefill tc_piecewise``: None (no such option), "default", "opt-in" or "removed".
    tc_piecewise: Optional[str]
    #: How the NVFP4 linear gets ``flashinfer.fp4_quantize``: "call-time" (imported inside functions only),
    #: "module-global" (bound at import on SM12x; SGLang's own quantizer elsewhere) or "sglang-op" (bound at
    #: import in ``fp4_utils`` and called inside ``torch.ops.sglang.flashinfer_fp4_quantize``).
    fp4_quantize_binding: str
    #: ``flashinfer.mm_fp4`` is bound at import and called only inside SGLang's ``sglang::fp4_gemm`` op.
    mm_fp4_in_sglang_op: bool
    #: ``sglang.srt.compilation.compile.install_torch_compiled`` + ``set_compiled`` as verify drives them.
    compile_path_check: bool
    #: Each scheduler process loads the ``sglang.srt.plugins`` entry points (the shim's plugin route). It does
    #: so in ``run_scheduler_process``, after ``scheduler.py`` imported its FP4 modules at module import, so
    #: the plugin rebinds what they bound.
    loads_plugins: bool
    #: FlashInfer functions the model code calls raw on a torch.compile prefill graph (the default one, or
    #: the opt-in one when ``prefill_graph`` is not compiled).
    raw_calls: Tuple[RawCall, ...] = ()
    #: Anything else a reader of verify's line should know about these releases.
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Pins:
    torch: str
    flashinfer: str
    sglang_kernel: str


#: How ``prefill_graph`` reads in one line.
_GRAPHS = {
    "none": "no torch.compile piecewise CUDA graph",
    "opt-in": "piecewise CUDA graph off unless --enable-piecewise-cuda-graph",
    "piecewise": "piecewise CUDA graph on by default",
    "tc_piecewise": "tc_piecewise prefill graphs on by default",
    "breakable": "breakable prefill graphs by default, no torch.compile",
}
_COMPILED_BY_DEFAULT = ("piecewise", "tc_piecewise")

_MM_FP4 = RawCall("mm_fp4", "NVFP4 linear layers using FlashInfer's FP4 GEMM", True)
_FP4_QUANTIZE_SM12X = RawCall("fp4_quantize", "NVFP4 linear layers on SM12x", True)
_QWEN3_5_MLP = RawCall("silu_and_mul_scaled_nvfp4_experts_quantize", "the Qwen3.5 NVFP4 dense MLP", True)
#: 0.5.10 reorganised the compile path (no set_compiled): verify's small check does not drive it there;
#: tests/gpu/test_gpu_engine.py runs 0.5.11's real engine instead.
_REORGANISED = "the compile path has no set_compiled: verify's sglang-compile check does not drive it"
_RMSNORM_QUANT = RawCall("rmsnorm_quant", "the RMSNorm + FP8 quant fusion of FP8 per-tensor checkpoints", True)

SGLANG_RELEASES = (
    SglangRelease(SpecifierSet("<0.5.3.post2"), "none", None, "call-time", False, False, False),
    SglangRelease(SpecifierSet(">=0.5.3.post2,<0.5.4.post2"), "opt-in", None, "call-time", False, True, False,
                  (_MM_FP4,)),
    SglangRelease(SpecifierSet(">=0.5.4.post2,<0.5.8"), "opt-in", None, "module-global", False, True, False,
                  (_MM_FP4, _FP4_QUANTIZE_SM12X)),
    SglangRelease(SpecifierSet(">=0.5.8,<0.5.10"), "opt-in", None, "module-global", True, True, False,
                  (_FP4_QUANTIZE_SM12X,)),
    SglangRelease(SpecifierSet(">=0.5.10,<0.5.11"), "piecewise", None, "module-global", True, False, False,
                  (_FP4_QUANTIZE_SM12X,), _REORGANISED),
    SglangRelease(SpecifierSet(">=0.5.11,<0.5.12"), "piecewise", None, "module-global", True, False, True,
                  (_FP4_QUANTIZE_SM12X,), _REORGANISED),
    SglangRelease(SpecifierSet(">=0.5.12,<0.5.14"), "piecewise", None, "sglang-op", True, False, True),
    SglangRelease(SpecifierSet(">=0.5.14,<0.5.15"), "tc_piecewise", "default", "sglang-op", True, False, True),
    SglangRelease(SpecifierSet(">=0.5.15,<0.5.18"), "breakable", "opt-in", "sglang-op", True, False, True),
    SglangRelease(SpecifierSet(">=0.5.18,<0.5.19"), "breakable", "opt-in", "sglang-op", True, False, True,
                  (_RMSNORM_QUANT,)),
    SglangRelease(SpecifierSet(">=0.5.19,<0.5.22"), "breakable", "opt-in", "sglang-op", True, False, True,
                  (_QWEN3_5_MLP, _RMSNORM_QUANT)),
    SglangRelease(SpecifierSet(">=0.5.22,<0.5.24"), "breakable", "removed", "sglang-op", True, False, True,
                  note="tc_piecewise is gone (cuda_graph_config.py's Backend.ALL); the raw calls of 0.5.19-0.5.21 "
                       "remain, untraced"),
)
LAST_KNOWN = "0.5.23"

#: ``torch``, ``flashinfer_python`` and ``sgl-kernel``/``sglang-kernel`` as each release's METADATA pins them.
PINS: Dict[str, Pins] = {
    "0.5.3.post2": Pins("2.8.0", "0.4.0", "0.3.15"), "0.5.3.post3": Pins("2.8.0", "0.4.0", "0.3.15"),
    "0.5.4": Pins("2.8.0", "0.4.1", "0.3.16.post3"), "0.5.4.post1": Pins("2.8.0", "0.4.1", "0.3.16.post4"),
    "0.5.4.post2": Pins("2.8.0", "0.4.1", "0.3.16.post4"), "0.5.4.post3": Pins("2.8.0", "0.5.0", "0.3.16.post4"),
    "0.5.5": Pins("2.8.0", "0.5.0", "0.3.16.post5"), "0.5.5.post1": Pins("2.8.0", "0.5.0", "0.3.17"),
    "0.5.5.post2": Pins("2.8.0", "0.5.0", "0.3.17"), "0.5.5.post3": Pins("2.8.0", "0.5.2", "0.3.17.post1"),
    "0.5.6": Pins("2.9.1", "0.5.3", "0.3.18.post2"), "0.5.6.post1": Pins("2.9.1", "0.5.3", "0.3.19"),
    "0.5.6.post2": Pins("2.9.1", "0.5.3", "0.3.19"), "0.5.7": Pins("2.9.1", "0.5.3", "0.3.20"),
    "0.5.8": Pins("2.9.1", "0.6.1", "0.3.21"), "0.5.8.post1": Pins("2.9.1", "0.6.1", "0.3.21"),
    "0.5.9": Pins("2.9.1", "0.6.3", "0.3.21"), "0.5.10": Pins("2.9.1", "0.6.7.post2", "0.4.1"),
    "0.5.10.post1": Pins("2.9.1", "0.6.7.post3", "0.4.1"), "0.5.11": Pins("2.11.0", "0.6.8.post1", "0.4.2"),
    "0.5.12": Pins("2.11.0", "0.6.11.post1", "0.4.2.post2"), "0.5.12.post1": Pins("2.11.0", "0.6.11.post1", "0.4.2.post2"),
    "0.5.13": Pins("2.11.0", "0.6.12", "0.4.3"), "0.5.13.post1": Pins("2.11.0", "0.6.12", "0.4.3"),
    "0.5.14": Pins("2.11.0", "0.6.12", "0.4.4"), "0.5.15": Pins("2.11.0", "0.6.12", "0.4.4"),
    "0.5.15.post1": Pins("2.11.0", "0.6.12", "0.4.4"), "0.5.16": Pins("2.11.0", "0.6.14", "0.4.5"),
    "0.5.17": Pins("2.11.0", "0.6.15.post1", "0.4.5"), "0.5.18": Pins("2.13.0", "0.6.17", "0.4.6.post1"),
    "0.5.19": Pins("2.13.0", "0.6.18", "0.4.6.post1"), "0.5.20": Pins("2.13.0", "0.6.18", "0.4.7"),
    "0.5.21": Pins("2.13.0", "0.6.18", "0.4.7"), "0.5.22": Pins("2.14.1", "0.7.1", "0.4.9"),
    "0.5.23": Pins("2.14.1", "0.7.2", "0.4.10"),
}


def installed_version() -> Optional[str]:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_for(version: Optional[str]) -> Optional[SglangRelease]:
    """The row for ``version``; None when it is not a version or is newer than the last row."""
    return row_for(version, SGLANG_RELEASES)


def needed_by_default(release: SglangRelease) -> bool:
    return release.prefill_graph in _COMPILED_BY_DEFAULT and bool(release.raw_calls)


def _calls(calls) -> str:
    return ", ".join(f"{call.function} in {call.where}" for call in calls)


def need(version: str, release: Optional[SglangRelease]) -> str:
    """One line: does SGLang ``version`` need the shim, on its default path and on the opt-in ones."""
    if release is None:
        return (f"SGLang {version} is newer than the shim's table (last: {LAST_KNOWN}): whether it needs the shim "
                "is unknown; verify fails until its row is written")
    graph = _GRAPHS[release.prefill_graph]
    covered = [call for call in release.raw_calls if call.covered]
    uncovered = [call for call in release.raw_calls if not call.covered]
    gaps = f"; NOT covered by the shim: {_calls(uncovered)}" if uncovered else ""
    if release.prefill_graph == "none":
        return f"SGLang {version} has {graph}: not needed; harmless"
    if needed_by_default(release):
        return (f"SGLang {version} calls FlashInfer raw inside its torch.compile prefill graph ({graph}): needed for "
                f"{_calls(covered)}{gaps}")
    if release.fp4_quantize_binding == "sglang-op":
        head = f"SGLang {version} wraps FlashInfer's FP4 calls in its own ops: not needed on its default path ({graph})"
    else:
        head = f"SGLang {version}: not needed on its default path ({graph})"
    if release.prefill_graph == "opt-in":
        opt_in = "with --enable-piecewise-cuda-graph"
    elif release.tc_piecewise == "opt-in":
        opt_in = "with --cuda-graph-backend-prefill tc_piecewise"
    else:
        opt_in = None
    if opt_in is None or not release.raw_calls:
        return head + "; harmless" + ("" if release.tc_piecewise != "removed" else " (tc_piecewise removed)")
    needed = f"; needed {opt_in} for {_calls(covered)}" if covered else ""
    gaps = f"; {opt_in}, NOT covered by the shim: {_calls(uncovered)}" if uncovered else ""
    return head + needed + gaps


def _compiled_prefill_available(release: SglangRelease) -> bool:
    return release.prefill_graph in _COMPILED_BY_DEFAULT + ("opt-in",) or release.tc_piecewise == "opt-in"


def disagreements(version: str, facts: dict, pins: Optional[dict] = None) -> List[str]:
    """Where SGLang ``version``'s source (``sglang_source.read_release``'s facts, and its METADATA ``pins``)
    does not look like its row says; empty when it does."""
    release = release_for(version)
    if release is None:
        return [f"no row for SGLang {version} (rows end at {LAST_KNOWN})"]
    found = []

    def compare(what, table, source, at=None):
        if table != source:
            found.append(f"{what}: the table says {table!r}, the source says {source!r}" + (f" ({at})" if at else ""))

    compare("prefill graph", release.prefill_graph, facts["prefill_graph_default"], facts["prefill_graph_default_at"])
    compare("tc_piecewise", release.tc_piecewise, facts["tc_piecewise"])
    compare("fp4_quantize binding", release.fp4_quantize_binding, facts["fp4_quantize_binding"],
            facts["fp4_quantize_bound_at"])
    compare("mm_fp4 inside sglang::fp4_gemm", release.mm_fp4_in_sglang_op, facts["mm_fp4_op"] == "sglang::fp4_gemm",
            facts["mm_fp4_bound_at"])
    compare("compile path (install_torch_compiled + set_compiled)", release.compile_path_check, facts["compile_path"])
    compare("schedulers load plugins", release.loads_plugins, facts["load_plugins_at"] is not None,
            facts["load_plugins_at"])
    if release.loads_plugins:
        compare("scheduler imports its FP4 modules before load_plugins()", True,
                facts["scheduler_imports_fp4_utils_at"] is not None, facts["scheduler_imports_fp4_utils_at"])
    if release.fp4_quantize_binding == "sglang-op":
        compare("SGLang's op passes backend= to FlashInfer", True, "backend" in (facts["fp4_quantize_keywords"] or ()),
                facts["fp4_quantize_op_at"])
    traced = _compiled_prefill_available(release)
    expected = {
        _MM_FP4: traced and facts["mm_fp4_bound_at"] is not None and facts["mm_fp4_op"] is None,
        _FP4_QUANTIZE_SM12X: traced and facts["fp4_quantize_binding"] == "module-global",
        _QWEN3_5_MLP: traced and None not in (facts["raw_silu_and_mul_scaled_nvfp4_experts_quantize_at"],
                                              facts["qwen3_5_enables_it_at"]),
        _RMSNORM_QUANT: traced and facts["raw_rmsnorm_quant_at"] is not None,
    }
    for call, present in expected.items():
        compare(f"raw {call.function} under a torch.compile prefill graph", call in release.raw_calls, present)
    written = PINS.get(str(public(version)))
    if pins is not None and release.prefill_graph != "none":
        compare("pins", dataclasses.asdict(written) if written else None,
                {"torch": pins.get("torch"), "flashinfer": pins.get("flashinfer-python"),
                 "sglang_kernel": pins.get("sglang-kernel")})
    return found


def describe_prefill_graph(release: SglangRelease) -> str:
    """The release's default prefill graph, in words."""
    return _GRAPHS[release.prefill_graph]


def needs_shim(release: Optional[SglangRelease]) -> bool:
    """Whether a plain launch of this SGLang needs the shim in its schedulers on NVFP4: its torch.compile prefill
    graph (on by default, or the --enable-piecewise-cuda-graph of 0.5.3.post2-0.5.9) traces FlashInfer's FP4
    functions raw, not through SGLang's own ops. The opt-in tc_piecewise paths of 0.5.15-0.5.21 are not a plain
    launch (``need`` names them)."""
    return (release is not None and release.fp4_quantize_binding != "sglang-op"
            and release.prefill_graph in _COMPILED_BY_DEFAULT + ("opt-in",)
            and any(call.covered for call in release.raw_calls))


PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "fp4_dynamo_shim"


def describe() -> dict:
    """SGLang as the shim sees it, for status() and verify (the same keys whether or not it is installed)."""
    return describe_version(installed_version())


def describe_version(version: Optional[str]) -> dict:
    """What ``status()["sglang"]`` says where SGLang ``version`` is installed (None: where none is)."""
    release = release_for(version)
    pins = PINS.get(str(public(version))) if version is not None and public(version) is not None else None
    return {
        "installed": version,
        "need": need(version, release) if version is not None else None,
        "needed_by_default": needed_by_default(release) if release else None,
        "piecewise_cuda_graph": _GRAPHS[release.prefill_graph] if release else None,
        "wraps_fp4_quantize": release.fp4_quantize_binding == "sglang-op" if release else None,
        "compile_path_check": release.compile_path_check if release else None,
        "loads_plugins": release.loads_plugins if release else None,
        "pins": dataclasses.asdict(pins) if pins else None,
        "note": (release.note or None) if release else None,
    }


def plugin_entry_point() -> Optional[str]:
    """The shim's ``sglang.srt.plugins`` entry point as installed (``module:function``), or None."""
    try:
        found = importlib.metadata.entry_points(group=PLUGIN_GROUP)
    except Exception:  # broken metadata elsewhere in the environment: report the plugin as not found
        return None
    return next((entry.value for entry in found if entry.name == PLUGIN_NAME), None)
