"""The gate's values on the installed release, and the GPU record the default gate reads: what each value
registers, what an unknown value does, and how the record is chosen, said by verify and held against the release
table (tests/data/declared_releases.json). The matrix runs this file against every release.
"""

from __future__ import annotations

import json
from pathlib import Path

import flashinfer
import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.declared import declared_layer
from _fp4_dynamo_shim.declared import polyfill
from _fp4_dynamo_shim.declared import scan
from fp4_dynamo_shim.errors import ApplyError

import verify_text
from helpers import apply_with

TABLE = Path(__file__).resolve().parents[1] / "data" / "declared_releases.json"
GATE = "FP4_DYNAMO_SHIM_FLASHINFER_OPS"


def _reapply(monkeypatch, gate):
    status = apply_with(monkeypatch, FLASHINFER_OPS=gate)
    assert status["applied"], status["problem"]
    return status["flashinfer_ops"]


def test_the_default_gate_registers_exactly_what_sglang_calls_raw(monkeypatch):
    from _fp4_dynamo_shim.declared import rules

    layer = _reapply(monkeypatch, "sglang")
    package = Path(flashinfer.__file__).parent
    files = [package.parent.joinpath(*module.split(".")) for module, _ in rules.SGLANG]
    files = [f / "__init__.py" if f.is_dir() else f.with_suffix(".py") for f in files]
    present = {(d.module, d.name) for d in scan.scan_files(package, [f for f in files if f.exists()]).declarations}
    expected = {f"{declared_layer.NAMESPACE}::{name}" for module, name in rules.SGLANG if (module, name) in present}
    assert set(layer["registered"].values()) == expected
    assert f"{declared_layer.NAMESPACE}::layernorm" in expected  # every release 0.5.3-0.7.4 declares it
    assert {entry["kind"] for entry in layer["not_registered"].values()} <= {"off under the gate"}


def test_the_gate_off_registers_nothing(monkeypatch):
    layer = _reapply(monkeypatch, "off")
    assert layer["registered"] == {} and layer["gate"] == "off"
    import flashinfer.norm

    assert not polyfill.is_polyfilled(flashinfer.norm.layernorm)


def test_an_unknown_gate_value_warns_and_strict_refuses(monkeypatch, caplog):
    layer = _reapply(monkeypatch, "everything")
    assert layer["gate"] == declared_layer.DEFAULT == "proven"
    assert any(GATE in warning for warning in fp4_dynamo_shim.status()["warnings"])
    with pytest.raises(ApplyError, match=GATE):
        apply_with(monkeypatch, STRICT="1")


def test_the_record_is_chosen_by_the_version_the_lifecycle_resolved_not_by_flashinfers_attribute(monkeypatch):
    """The installed distribution's version (what the release table and status() use) picks the record: a
    FlashInfer whose ``__version__`` says another release (a local build, a patched copy) gets the record of
    what is installed, not of what the attribute claims."""
    import flashinfer
    from _fp4_dynamo_shim.declared import proven

    version = lifecycle.flashinfer_version()
    other = next(v for v in sorted(proven.PROVEN) if v != version)
    monkeypatch.setattr(flashinfer, "__version__", other)
    layer = _reapply(monkeypatch, "proven")
    assert layer["proven"] is None if version not in proven.PROVEN else layer["proven"]["flashinfer"] == version


def test_verify_says_what_the_gpu_record_holds_and_how_many_ops_stand_on_none(monkeypatch):
    """Under ``all``, every op neither SGLang's nor in the release's GPU record is listed in ``unproven`` and
    counted on verify's line; under the narrower gates there are none."""
    from _fp4_dynamo_shim.declared import proven
    from _fp4_dynamo_shim.verify import report

    def verify_says(gate):
        layer = _reapply(monkeypatch, gate)
        return verify_text.flashinfer_ops_line(report.environment(), fp4_dynamo_shim.status()), layer

    def unproven_words(layer):
        return f"; {len(layer['unproven'])} registered without a GPU proof (status()['flashinfer_ops']['unproven'])"

    version = lifecycle.flashinfer_version()
    monkeypatch.delitem(proven.PROVEN, version, raising=False)
    line, layer = verify_says("proven")
    assert line.endswith("; no GPU record for the installed FlashInfer: SGLang's calls only") and not layer["unproven"]
    sglangs = set(layer["registered"])  # the default gate with no record: SGLang's calls only
    line, layer = verify_says("all")
    assert set(layer["unproven"]) == set(layer["registered"]) - sglangs and layer["unproven"]
    assert line.endswith(" declarations registered; no GPU record for the installed FlashInfer" + unproven_words(layer))
    line, layer = verify_says("sglang")
    assert line.endswith(" declarations registered") and not layer["unproven"]
    monkeypatch.setitem(proven.PROVEN, version, {
        "date": "2026-12-02", "machine": "NVIDIA H200", "torch": "2.11.0+cu130", "shim": "abc1234",
        "functions_passed": 1, "functions_run": 1,
        "declarations": {"flashinfer.norm.layernorm": {"module": "flashinfer.norm", "op": "layernorm",
                                                       "functions": ["norm.layernorm"]}}})
    record = (f" declarations registered; GPU record for FlashInfer {version}: 1 declarations through 1 functions "
              "(2026-12-02, NVIDIA H200, torch 2.11.0+cu130, shim abc1234)")
    line, layer = verify_says("proven")
    assert line.endswith(record) and not layer["unproven"] and "flashinfer.norm.layernorm" in layer["registered"]
    line, layer = verify_says("all")
    assert line.endswith(record + unproven_words(layer))
    assert set(layer["unproven"]) == set(layer["registered"]) - sglangs - {"flashinfer.norm.layernorm"}


def test_the_gpu_record_names_only_what_its_release_registers_under_the_ops_they_become():
    """Each release's record against that release's row of the CPU table (tests/data/declared_releases.json):
    a record written from a wrong release, or left behind by a renamed declaration, fails here."""
    from _fp4_dynamo_shim.declared import proven

    table = json.loads(TABLE.read_text())["releases"]
    assert proven.PROVEN, "no GPU record at all"
    for version, record in proven.PROVEN.items():
        registered = table[version]["registered"]
        assert set(record) == {*proven.MEASURED, "declarations"} and record["declarations"], version
        for key, entry in record["declarations"].items():
            assert registered.get(key) == f"{declared_layer.NAMESPACE}::{entry['op']}", (version, key)
            assert key.startswith(entry["module"] + ".") and entry["functions"], (version, key)
