"""The per-release table of the attention JIT modules' run parameters (``declared/attention_table.json``) is what
``tools/attention_table.py`` reads from FlashInfer's own sources: the installed release's row is read again here
and compared (the FlashInfer matrix runs this file against each release), and the file is the tool's own output,
not edited by hand."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import flashinfer
import pytest

from _fp4_dynamo_shim import lifecycle

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture(scope="module")
def tool():
    sys.path.insert(0, str(TOOLS))
    try:
        yield importlib.import_module("attention_table")
    finally:
        sys.path.remove(str(TOOLS))


@pytest.fixture(scope="module")
def installed(tool):
    return tool.read(Path(flashinfer.__file__).parent)


def test_the_committed_rows_of_the_installed_release_are_what_the_tool_reads_from_its_sources(tool, installed):
    version, rows = installed
    assert version == lifecycle.flashinfer_version()
    committed = tool.committed()
    assert version in committed, f"no rows for flashinfer {version}: run python tools/attention_table.py"
    assert committed[version] == rows


@pytest.mark.release_independent
def test_the_committed_file_is_the_tools_rendering_of_its_own_rows(tool):
    assert tool.render(tool.committed()) == tool.OUT.read_text()


def _row(rows, entry_point, getter):
    return next(row for row in rows if entry_point in row["entry_points"] and row["getter"] == getter)


def test_single_decode_writes_its_lse_although_flashinfers_declaration_leaves_it_out(installed):
    """Read from the C++ run function (its ``params.lse`` is the kernel's output): FlashInfer declares
    ``mutates_args=("tmp", "o")`` for single decode, and an op declared so would let compiled code drop the write."""
    row = _row(installed[1], "single_decode", "get_single_decode_module")
    parameters = dict(p.split(":") for p in row["parameters"].split())
    assert "maybe_lse" not in row["mutates"].split()
    assert (parameters["maybe_lse"], parameters["o"], parameters["tmp"], parameters["q"]) == ("w", "w", "w", "r")


def test_a_getter_taking_args_gets_the_parameters_of_the_generator_it_forwards_them_to(installed):
    row = _row(installed[1], "single_prefill", "get_single_prefill_module")
    names = [p.split(":")[0].strip() for p in row["getter_parameters"].split(",")]
    assert names[:2] == ["backend", "dtype_q"] and "use_fp16_qk_reduction" in names
    assert "backend: str" in row["getter_parameters"]  # FlashInfer's getter leaves backend unannotated
    assert set(row["backends"]) == {"fa2", "fa3"}


def test_a_wrapper_reaches_every_getter_its_plan_may_cache(installed):
    getters = {row["getter"] for row in installed[1] if "batch_decode_paged" in row["entry_points"]}
    assert {"get_batch_decode_module", "get_batch_prefill_module"} <= getters  # the tensor-core path is prefill's
    plan_info = [p for row in installed[1] if row["getter"] == "get_batch_decode_module"
                 for p in row["parameters"].split() if p.startswith("plan_info_vec")]
    assert plan_info == ["plan_info_vec:l"]


def test_a_run_read_from_cpp_types_its_scalars_and_marks_its_optional_tensors(installed):
    """Where the getter returns the built module (the MLA paged wrapper's, 0.5.3 to 0.6.x), no Python def declares
    the run: its C++ function's types are all an op's schema can be built from."""
    rows = [row for row in installed[1] if row["run"] is None]
    if not rows:
        pytest.skip(f"flashinfer {installed[0]} has no attention getter returning its built module")
    parameters = dict(p.split(":") for p in rows[0]["parameters"].split())
    assert (parameters["maybe_lse"], parameters["o"], parameters["q_nope"]) == ("w?", "w", "r")
    assert (parameters["num_heads"], parameters["sm_scale"], parameters["return_lse_base_on_e"]) == ("i", "f", "b")
    assert parameters["plan_info_vec"] == "l"


def test_what_only_the_trtllm_gen_backend_reads_is_marked_for_the_others_to_drop(installed):
    """FlashInfer 0.5.3-0.6.8.post1's tensor-core decode hands ``paged_run`` its KV cache where the def has
    ``num_qo_heads``, and the values after it one place late; only the trtllm-gen branch reads those, so under fa2
    and fa3 the op takes None there. What the run writes, and what every backend reads, is never listed."""
    row = _row(installed[1], "batch_prefill_paged", "get_batch_prefill_module")
    listed = {name for name, kind in (p.split(":") for p in row["parameters"].split()) if kind.endswith("t")}
    assert {"num_qo_heads", "num_kv_heads", "block_tables", "max_kv_len"} <= listed
    assert not listed & set(row["mutates"].split())
    assert not listed & {"maybe_lse", "workspace_size", "window_left", "sm_scale", "o", "q"}
