"""The SGLang release table against what each released wheel says, and the verify line built from it.

``tests/data/sglang_facts.json`` is what ``tests/support/sglang_facts.py`` read off the 36 wheels from 0.5.3.post1 to
0.5.23 (file:line for each fact); regenerating it needs the wheels (``python tests/support/sglang_facts.py --check``,
about 360 MB of downloads the first time), so CI reads the committed file. The facts quoted by hand below
come from reading the wheels (and issue 18), independently of both the table and the parser.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from _fp4_dynamo_shim.verify import sglang
from _fp4_dynamo_shim.fp4 import family
from _fp4_dynamo_shim.sglang import sglang_releases
from _fp4_dynamo_shim.sglang import source

import sglang_facts

FACTS = json.loads(sglang_facts.FACTS_FILE.read_text())


def test_facts_cover_every_release_from_0_5_3_post1_to_the_tables_last():
    assert list(FACTS) == list(sglang_facts.RELEASES)
    assert sglang_facts.RELEASES[-1] == sglang_releases.LAST_KNOWN


@pytest.mark.parametrize("version", sglang_facts.RELEASES)
def test_the_row_for_each_release_agrees_with_its_wheel(version):
    assert sglang_releases.disagreements(version, FACTS[version], FACTS[version]["pins"]) == []


@pytest.mark.parametrize("version", [v for v in sglang_facts.RELEASES if v != "0.5.3.post1"])
def test_every_release_with_a_compiled_graph_has_its_pins_written_down(version):
    assert version in sglang_releases.PINS


def _with_row(monkeypatch, version, **changes):
    rows = list(sglang_releases.SGLANG_RELEASES)
    index = next(i for i, row in enumerate(rows) if row is sglang_releases.release_for(version))
    rows[index] = dataclasses.replace(rows[index], **changes)
    monkeypatch.setattr(sglang_releases, "SGLANG_RELEASES", tuple(rows))


_RAW_QWEN3_5 = ("raw silu_and_mul_scaled_nvfp4_experts_quantize under a torch.compile prefill graph: the table says "
                "False, the source says True")
_RAW_RMSNORM_QUANT = "raw rmsnorm_quant under a torch.compile prefill graph: the table says False, the source says True"


@pytest.mark.parametrize("version, field, wrong, said", [
    ("0.5.11", "loads_plugins", False,  # plugins load from 0.5.11 (scheduler.py:3893)
     ["schedulers load plugins: the table says False, the source says True (managers/scheduler.py:3893)"]),
    ("0.5.10", "loads_plugins", True, ["schedulers load plugins: the table says True, the source says False"]),
    ("0.5.10", "compile_path_check", True,  # set_compiled is gone from 0.5.10
     ["compile path (install_torch_compiled + set_compiled): the table says True, the source says False"]),
    ("0.5.14", "prefill_graph", "piecewise",
     ["prefill graph: the table says 'piecewise', the source says 'tc_piecewise' "
      "(model_executor/cuda_graph_config.py:91)"]),
    ("0.5.15", "tc_piecewise", "default", ["tc_piecewise: the table says 'default', the source says 'opt-in'"]),
    # a prefill graph the table now thinks 0.5.22 has would trace the raw calls its source makes
    ("0.5.22", "tc_piecewise", "opt-in",
     ["tc_piecewise: the table says 'opt-in', the source says 'removed'", _RAW_QWEN3_5, _RAW_RMSNORM_QUANT]),
    ("0.5.12", "fp4_quantize_binding", "module-global",
     ["fp4_quantize binding: the table says 'module-global', the source says 'sglang-op' "
      "(layers/quantization/fp4_utils.py:20)"]),
    ("0.5.7", "mm_fp4_in_sglang_op", True,
     ["mm_fp4 inside sglang::fp4_gemm: the table says True, the source says False "
      "(layers/quantization/modelopt_quant.py:76)"]),
    ("0.5.21", "raw_calls", (), [_RAW_QWEN3_5, _RAW_RMSNORM_QUANT]),
])
def test_a_wrong_row_is_caught_by_the_wheels_facts_in_words_that_say_where(monkeypatch, version, field, wrong, said):
    _with_row(monkeypatch, version, **{field: wrong})
    assert sglang_releases.disagreements(version, FACTS[version], FACTS[version]["pins"]) == said


def test_wrong_pins_are_caught(monkeypatch):
    monkeypatch.setitem(sglang_releases.PINS, "0.5.14", sglang_releases.Pins("2.11.0", "0.6.11.post1", "0.4.4"))
    assert sglang_releases.disagreements("0.5.14", FACTS["0.5.14"], FACTS["0.5.14"]["pins"]) == [
        "pins: the table says {'torch': '2.11.0', 'flashinfer': '0.6.11.post1', 'sglang_kernel': '0.4.4'}, "
        "the source says {'torch': '2.11.0', 'flashinfer': '0.6.12', 'sglang_kernel': '0.4.4'}"]


@pytest.mark.parametrize("version, fact, value, said", [
    ("0.5.14", "fp4_quantize_keywords", [],  # SGLang's own op stops passing backend= to FlashInfer
     "SGLang's op passes backend= to FlashInfer: the table says True, the source says False "
     "(layers/quantization/fp4_utils.py:84)"),
    ("0.5.11", "scheduler_imports_fp4_utils_at", None,  # the plugin would then run after the FP4 import
     "scheduler imports its FP4 modules before load_plugins(): the table says True, the source says False"),
])
def test_a_source_that_changed_under_a_row_is_caught(version, fact, value, said):
    assert sglang_releases.disagreements(version, {**FACTS[version], fact: value}, None) == [said]


def test_a_release_past_the_last_row_has_no_row():
    assert sglang_releases.disagreements("0.5.99", {}, None) == [
        f"no row for SGLang 0.5.99 (rows end at {sglang_releases.LAST_KNOWN})"]


# Facts read by hand from the wheels (issue 18 quotes the same lines), not by sglang_source.
@pytest.mark.parametrize("version, fact, value", [
    ("0.5.12", "fp4_quantize_bound_at", "layers/quantization/fp4_utils.py:20"),
    ("0.5.13", "fp4_quantize_bound_at", "layers/quantization/fp4_utils.py:24"),
    ("0.5.21", "fp4_quantize_bound_at", "layers/quantization/fp4_utils.py:24"),
    ("0.5.14", "fp4_quantize_op", "sglang::flashinfer_fp4_quantize"),
    ("0.5.12", "scheduler_imports_fp4_utils_at", "managers/scheduler.py:79"),
    ("0.5.12", "load_plugins_at", "managers/scheduler.py:3999"),
    ("0.5.11", "load_plugins_at", "managers/scheduler.py:3893"),
    ("0.5.10", "load_plugins_at", None),
    ("0.5.14", "mm_fp4_bound_at", "layers/quantization/modelopt_quant.py:89"),
    ("0.5.11", "fp4_quantize_bound_at", "layers/quantization/modelopt_quant.py:77"),
    ("0.5.21", "raw_silu_and_mul_scaled_nvfp4_experts_quantize_at", "models/qwen2_moe.py:220"),
    ("0.5.18", "raw_silu_and_mul_scaled_nvfp4_experts_quantize_at", None),
    ("0.5.19", "raw_rmsnorm_quant_at", "layers/layernorm.py:976"),
    ("0.5.18", "raw_rmsnorm_quant_at", "layers/layernorm.py:912"),
    ("0.5.14", "prefill_graph_default_at", "model_executor/cuda_graph_config.py:91"),
])
def test_facts_match_the_lines_read_by_hand(version, fact, value):
    assert FACTS[version][fact] == value


@pytest.mark.parametrize("version, graph, tc_piecewise", [
    ("0.5.3.post1", "none", None), ("0.5.3.post2", "opt-in", None), ("0.5.9", "opt-in", None),
    ("0.5.10", "piecewise", None), ("0.5.13.post1", "piecewise", None), ("0.5.14", "tc_piecewise", "default"),
    ("0.5.15", "breakable", "opt-in"), ("0.5.21", "breakable", "opt-in"), ("0.5.22", "breakable", "removed"),
    ("0.5.23", "breakable", "removed"),
])
def test_the_prefill_graph_window(version, graph, tc_piecewise):
    """On by default 0.5.10-0.5.14 (tc_piecewise in 0.5.14), opt-in tc_piecewise 0.5.15-0.5.21, gone from 0.5.22."""
    row = sglang_releases.release_for(version)
    assert (row.prefill_graph, row.tc_piecewise) == (graph, tc_piecewise)
    assert (FACTS[version]["prefill_graph_default"], FACTS[version]["tc_piecewise"]) == (graph, tc_piecewise)


@pytest.mark.parametrize("version, torch_pin, flashinfer_pin, kernel_pin", [
    ("0.5.11", "2.11.0", "0.6.8.post1", "0.4.2"), ("0.5.12", "2.11.0", "0.6.11.post1", "0.4.2.post2"),
    ("0.5.13", "2.11.0", "0.6.12", "0.4.3"), ("0.5.14", "2.11.0", "0.6.12", "0.4.4"),
    ("0.5.18", "2.13.0", "0.6.17", "0.4.6.post1"), ("0.5.22", "2.14.1", "0.7.1", "0.4.9"),
    ("0.5.23", "2.14.1", "0.7.2", "0.4.10"),
])
def test_pins_as_issue_18_read_them(version, torch_pin, flashinfer_pin, kernel_pin):
    assert sglang_releases.PINS[version] == sglang_releases.Pins(torch_pin, flashinfer_pin, kernel_pin)


def test_covered_raw_calls_are_exactly_the_ones_the_shim_puts_behind_an_op():
    """The FP4 layer's functions, and the declarations the declared-ops layer registers under its default gate
    for SGLang's raw calls."""
    from _fp4_dynamo_shim.declared import rules

    members = {member.name for member in family.MEMBERS} | {"fp4_quantize"} | {name for _, name in rules.SGLANG}
    for row in sglang_releases.SGLANG_RELEASES:
        for call in row.raw_calls:
            assert call.covered == (call.function in members), call


@pytest.mark.parametrize("version, says", [
    ("0.5.14", "SGLang 0.5.14 wraps FlashInfer's FP4 calls in its own ops: not needed on its default path "
               "(tc_piecewise prefill graphs on by default); harmless"),
    ("0.5.11", "SGLang 0.5.11 calls FlashInfer raw inside its torch.compile prefill graph (piecewise CUDA graph on by "
               "default): needed for fp4_quantize in NVFP4 linear layers on SM12x"),
    ("0.5.3.post1", "SGLang 0.5.3.post1 has no torch.compile piecewise CUDA graph: not needed; harmless"),
])
def test_the_need_line(version, says):
    assert sglang_releases.need(version, sglang_releases.release_for(version)) == says


def test_the_need_line_names_the_opt_in_path_and_every_raw_call_it_covers():
    line = sglang_releases.need("0.5.21", sglang_releases.release_for("0.5.21"))
    assert "not needed on its default path" in line
    assert "needed with --cuda-graph-backend-prefill tc_piecewise for silu_and_mul_scaled_nvfp4_experts_quantize" in line
    assert "rmsnorm_quant in the RMSNorm + FP8 quant fusion" in line and "NOT covered" not in line


def test_a_release_newer_than_the_table_is_unknown_not_harmless():
    assert sglang_releases.release_for("0.5.24") is None
    assert "unknown" in sglang_releases.need("0.5.24", None)


@pytest.mark.parametrize("version", [None, "0.5.14", "0.5.24"])
def test_status_sglang_has_the_same_keys_whatever_is_installed(monkeypatch, version):
    monkeypatch.setattr(sglang_releases, "installed_version", lambda: version)
    described = sglang_releases.describe()
    assert set(described) == {"installed", "need", "needed_by_default", "piecewise_cuda_graph", "wraps_fp4_quantize",
                              "compile_path_check", "loads_plugins", "pins", "note"}
    assert (described["need"] is None) == (version is None)
    if version == "0.5.14":
        assert described["pins"] == {"torch": "2.11.0", "flashinfer": "0.6.12", "sglang_kernel": "0.4.4"}
        assert described["needed_by_default"] is False and described["wraps_fp4_quantize"] is True


# --- verify's sglang-release check, on an installed SGLang --------------------------------------------------
# CI has no SGLang, so the check runs on a miniature 0.5.14 install: a dist-info and the few source lines
# the check reads, in the shape of the 0.5.14 wheel's (fp4_utils.py:24/84, modelopt_quant.py:89/140,
# scheduler.py:81/4181, cuda_graph_config.py:91).

MINIATURE = {
    "layers/quantization/fp4_utils.py": """
        try:
            from flashinfer import fp4_quantize as _flashinfer_fp4_quantize

            def _flashinfer_fp4_quantize_impl(input, global_scale, enable_pdl=None):
                return _flashinfer_fp4_quantize(input=input, global_scale=global_scale, enable_pdl=enable_pdl,
                                                backend="cuda")

            fp4_quantize = register_custom_op_from_extern(_flashinfer_fp4_quantize_impl,
                                                          op_name="flashinfer_fp4_quantize")
        except ImportError:
            fp4_quantize = None
        """,
    "layers/quantization/modelopt_quant.py": """
        from sglang.srt.layers.quantization.fp4_utils import fp4_quantize
        try:
            from flashinfer import mm_fp4 as flashinfer_fp4_gemm
        except ImportError:
            pass

        @register_custom_op(fake_impl=None)
        def fp4_gemm(input, weight):
            return flashinfer_fp4_gemm(input, weight)
        """,
    "managers/scheduler.py": """
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.plugins import load_plugins

        def run_scheduler_process(server_args):
            load_plugins()
        """,
    "plugins/__init__.py": """
        def load_plugins():
            pass
        """,
    "model_executor/cuda_graph_config.py": """
        ALLOWED_BACKENDS_PER_PHASE = {
            Phase.DECODE: (Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE, Backend.DISABLED),
            Phase.PREFILL: (Backend.BREAKABLE, Backend.TC_PIECEWISE, Backend.DISABLED),
        }

        class CudaGraphConfig:
            prefill: PhaseConfig = field(
                default_factory=lambda: PhaseConfig(backend=Backend.TC_PIECEWISE)
            )
        """,
    "compilation/compile.py": """
        def install_torch_compiled(module):
            pass
        """,
}
METADATA = "Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n" + "".join(
    f"Requires-Dist: {pin}\n" for pin in ("torch==2.11.0", "flashinfer_python[cu13]==0.6.12", "sglang-kernel==0.4.4",
                                          "transformers==5.8.1"))


@pytest.fixture
def installed_sglang(tmp_path, monkeypatch):
    """Install the miniature SGLang on sys.path; returns a function rewriting one of its files."""
    def write(version="0.5.14", metadata=None, **replacements):
        for relative, text in MINIATURE.items():
            path = tmp_path / "sglang" / "srt" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(replacements.get(relative, text)))
        for old in tmp_path.glob("sglang-*.dist-info"):
            for child in old.iterdir():
                child.unlink()
            old.rmdir()
        info = tmp_path / f"sglang-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(metadata or METADATA.format(version=version))

    monkeypatch.syspath_prepend(str(tmp_path))
    return write


def test_verify_prints_the_need_line_for_the_installed_sglang(installed_sglang):
    installed_sglang()
    assert source.read_release(source.installed_reader())["fp4_quantize_binding"] == "sglang-op"
    assert sglang.check_sglang_release("cpu") == sglang_releases.need("0.5.14", sglang_releases.release_for("0.5.14"))


def test_verify_fails_when_the_installed_source_binds_flashinfer_otherwise(installed_sglang):
    installed_sglang(**{"layers/quantization/modelopt_quant.py": "from flashinfer import fp4_quantize\n"})
    with pytest.raises(AssertionError, match="fp4_quantize binding: the table says 'sglang-op'"):
        sglang.check_sglang_release("cpu")


def test_verify_fails_when_schedulers_stop_loading_plugins(installed_sglang):
    installed_sglang(**{"plugins/__init__.py": "def something_else():\n    pass\n"})
    with pytest.raises(AssertionError, match="schedulers load plugins"):
        sglang.check_sglang_release("cpu")


def test_verify_fails_for_an_sglang_newer_than_the_table(installed_sglang):
    installed_sglang(version="0.5.24")
    with pytest.raises(AssertionError, match="no row for SGLang 0.5.24.*unknown"):
        sglang.check_sglang_release("cpu")


def test_verify_fails_when_the_installed_pins_are_not_the_rows(installed_sglang):
    installed_sglang(metadata=METADATA.format(version="0.5.14").replace("torch==2.11.0", "torch==2.12.0"))
    with pytest.raises(AssertionError, match=r"pins: the table says \{'torch': '2.11.0'.*the source says \{'torch': '2.12.0'"):
        sglang.check_sglang_release("cpu")


def test_verify_names_every_disagreement_and_the_need_line(installed_sglang):
    installed_sglang(**{"layers/quantization/modelopt_quant.py": "from flashinfer import fp4_quantize\n",
                        "plugins/__init__.py": "def something_else():\n    pass\n"})
    facts = source.read_release(source.installed_reader())
    found = sglang_releases.disagreements("0.5.14", facts, None)
    assert len(found) > 1
    with pytest.raises(AssertionError) as failed:
        sglang.check_sglang_release("cpu")
    assert str(failed.value) == f"SGLang 0.5.14: {'; '.join(found)}; {sglang_releases.describe()['need']}"


def test_verify_skips_the_release_check_without_sglang():
    with pytest.raises(sglang.Skip, match="^sglang is not installed$"):
        sglang.check_sglang_release("cpu")


def test_the_plugin_entry_point_is_found_as_installed(monkeypatch):
    """The shim's own entry in SGLang's plugin group (this environment installs the package), and None when
    the group has no entry of that name."""
    import importlib.metadata

    assert sglang_releases.plugin_entry_point() == "_fp4_dynamo_shim.activation.sglang_plugin:plugin"
    other = importlib.metadata.EntryPoint("someone_else", "x:y", sglang_releases.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [other] if group == sglang_releases.PLUGIN_GROUP else [])
    assert sglang_releases.plugin_entry_point() is None
