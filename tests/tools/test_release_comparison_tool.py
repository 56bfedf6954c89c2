"""``tools/release_parts.py``: for a FlashInfer release (installed, a folder or a wheel), which parts match the newest
tested release's record and what differs, in words a reviewer adding the next row can act on.

Run in this process (its ``main`` with arguments), over copies of the installed release with one thing edited
(tests/support/simulated_release.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import pytest

import simulated_release
from simulated_release import replace

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.release_independent
FP4 = "quantization/fp4_quantization.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("release_parts_tool", ROOT / "tools" / "release_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def written_against_the_newest_tested_release():
    if simulated_release.TESTED != "0.7.4":
        pytest.skip(f"the edits are written against 0.7.4's sources; {simulated_release.TESTED} is installed")


def run(tool, monkeypatch, capsys, *arguments) -> str:
    monkeypatch.setattr(sys, "argv", ["release_parts.py", *map(str, arguments)])
    assert tool.main() == 0
    return capsys.readouterr().out


def judged(tool, monkeypatch, capsys, tmp_path, edits) -> dict:
    folder = simulated_release.make(tmp_path, "0.7.9", edits)
    return json.loads(run(tool, monkeypatch, capsys, "--json", folder))


def test_the_installed_newest_tested_release_matches_its_own_record_in_every_part(tool, monkeypatch, capsys):
    out = run(tool, monkeypatch, capsys)
    assert out.startswith("flashinfer-python 0.7.4: tested\n")
    assert "  kernel call as in rows: <0.7.4,>=0.7.1, <0.7.5,>=0.7.4\n" in out
    assert "  13 of 13 parts match 0.7.4's:\n" in out and "differs" not in out


def test_a_wheel_is_read_without_installing_it_and_its_metadata_names_the_release(tool, monkeypatch, capsys, tmp_path):
    wheel = tmp_path / "flashinfer_python-0.7.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in simulated_release.INSTALLED.rglob("*.py"):
            archive.write(path, "flashinfer/" + str(path.relative_to(simulated_release.INSTALLED)))
        archive.writestr("flashinfer_python-0.7.9.dist-info/METADATA", "Name: flashinfer-python\nVersion: 0.7.9\n")
    out = run(tool, monkeypatch, capsys, wheel)
    assert out.startswith("flashinfer-python 0.7.9: newer than tested (flashinfer-python >=0.5.3, <=0.7.4)\n")
    assert "13 of 13 parts match 0.7.4's" in out


@pytest.mark.parametrize("edit, part, difference", [
    (replace("    backend: str = \"auto\",\n    # Appended last", "    backend: str = \"cuda\",\n    # Appended last"),
     "fp4_quantize", "default of `backend` 'auto' -> 'cuda'"),
    (replace("    *,\n    batch_invariant: bool = False,\n) -> Tuple[torch.Tensor, torch.Tensor]:\n    r\"\"\"Quantize input tensor to MXFP4",
             "    batch_invariant: bool = False,\n) -> Tuple[torch.Tensor, torch.Tensor]:\n    r\"\"\"Quantize input tensor to MXFP4"),
     "mxfp4_quantize", "parameter `batch_invariant` is now positional-or-keyword"),
    (replace("    unswizzled_sf: torch.Tensor, *, out: Optional", "    unswizzled_sf: torch.Tensor, *, output: Optional"),
     "block_scale_interleave", "new parameter `output`; parameter `out` removed"),
    (replace("        return out_val, out_sf\n", "        return out_val, out_sf.clone()\n"),
     "get_fp4_quantization_module", "its source differs from 0.7.4's (same signature)"),
], ids=["default", "kind", "renamed-parameter", "body"])
def test_each_kind_of_difference_is_said_in_words(tool, monkeypatch, capsys, tmp_path, edit, part, difference):
    result = judged(tool, monkeypatch, capsys, tmp_path, {FP4: edit})
    differing = {name: entry["difference"] for name, entry in result["parts"].items() if not entry["matches"]}
    assert differing[part] == difference, differing


def test_a_changed_helper_counts_for_every_function_that_reaches_it(tool, monkeypatch, capsys, tmp_path):
    """A body is its function with the module-level helpers it calls: a changed helper is a changed function."""
    result = judged(tool, monkeypatch, capsys, tmp_path, {FP4: replace(
        "def _compute_swizzled_layout_sf_size(total_row, total_column, row_size=128):\n",
        "def _compute_swizzled_layout_sf_size(total_row, total_column, row_size=128):\n    total_row = total_row + 0\n")})
    differing = {name for name, entry in result["parts"].items() if not entry["matches"]}
    assert differing == {"get_fp4_quantization_module", "block_scale_interleave"}  # the two that call it


def test_a_differing_kernel_call_order_is_named_against_the_row(tool, monkeypatch, capsys, tmp_path):
    result = judged(tool, monkeypatch, capsys, tmp_path, {FP4: replace(
        "            is_global_scale_inversed,\n            enable_pdl,\n",
        "            enable_pdl,\n            is_global_scale_inversed,\n")})
    assert result["parts"]["get_fp4_quantization_module"]["difference"] == (
        "the JIT entry fp4_quantize is called with (sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout, "
        "enable_pdl, is_global_scale_inversed, nvfp4_4over6_code) after the four tensors, the row has (sf_vec_size, "
        "sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout, is_global_scale_inversed, enable_pdl, nvfp4_4over6_code)")
    assert result["rows_with_the_same_kernel_call"] == []


def test_the_parts_that_run_through_a_differing_one_are_listed_as_left(tool, monkeypatch, capsys, tmp_path):
    folder = simulated_release.make(tmp_path, "0.7.9", {FP4: replace(
        "    *,\n    batch_invariant: bool = False,\n", "    x: int = 0,\n    *,\n    batch_invariant: bool = False,\n")})
    out = run(tool, monkeypatch, capsys, folder)
    assert "  12 of 13 parts match 0.7.4's:\n" in out
    assert "    differs  fp4_quantize: new parameter `x`\n" in out
    assert "    left     nvfp4_quantize: it runs through fp4_quantize, which differs\n" in out
    assert "    match    block_scale_interleave\n" in out


def test_record_takes_only_the_newest_tested_release(tool, monkeypatch, capsys, tmp_path):
    folder = simulated_release.make(tmp_path, "0.7.9")
    monkeypatch.setattr(sys, "argv", ["release_parts.py", "--record", str(folder)])
    with pytest.raises(SystemExit, match="--record takes the newest tested release"):
        tool.main()


READ_WITH_ANOTHER_PYTHON = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sources", sys.argv[1])
sources = importlib.util.module_from_spec(spec)
sys.modules["sources"] = sources
spec.loader.exec_module(sources)
request = json.loads(sys.stdin.read())
found, others = sources.Sources(request["package"]), frozenset(request["others"])
print(json.dumps({part["name"]: sources.facts(found, sources.Part(**{**part, "names": tuple(part["names"]),
                  "returns": tuple(part["returns"])}), others) for part in request["parts"]}))
"""


@pytest.mark.parametrize("python", ["3.10", "3.12", "3.13"])
def test_every_python_the_shim_supports_reads_the_same_record(python, tmp_path):
    """The record is written on one Python and read on users' others: syntax trees gain fields between
    Pythons (3.12's type parameters), and a digest that followed them would call every part different."""
    import dataclasses
    import os
    import shutil
    import subprocess

    from _fp4_dynamo_shim import release_parts, tested_sources
    from _fp4_dynamo_shim.fp4 import fp4_releases

    pyenv = sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob(f"versions/{python}.*/bin/python"))
    found = shutil.which(f"python{python}")
    interpreter = str(pyenv[-1]) if pyenv else found if found and "shims" not in found else None
    if interpreter is None:
        pytest.skip(f"no python{python} on this machine")
    parts = release_parts.all_parts(fp4_releases.target_for(tested_sources.RECORD["flashinfer"]))
    request = {"package": str(simulated_release.INSTALLED), "others": [p.function for p in parts if p.function],
               "parts": [dataclasses.asdict(part) for part in parts]}
    script = tmp_path / "read.py"
    script.write_text(READ_WITH_ANOTHER_PYTHON)
    completed = subprocess.run([interpreter, str(script), str(ROOT / "src" / "_fp4_dynamo_shim" / "sources.py")],
                               input=json.dumps(request), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert json.loads(completed.stdout) == json.loads(json.dumps(tested_sources.RECORD["parts"]))
