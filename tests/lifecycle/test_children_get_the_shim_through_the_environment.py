"""What ``import fp4_dynamo_shim`` exports for child processes, in this process: ``FP4_DYNAMO_SHIM=1`` unless the
user's value is one the hook understands, the warning when a value is replaced or when no start-up route would
act on it in a child, and the user's own environment as ``user_environment()`` gives it back.

A child started with it is the spawn and venv tests' (tests/activation/); here the shim is applied in this process
as the import applies it (``lifecycle.apply`` with the export layer), so that its words and choices are seen by a
test that reaches it (and by mutmut's trampolines, which do not follow children). The start-up routes are real files in two temporary site directories, which stand in for
this interpreter's (``site.getsitepackages``); SGLang's plugin entry point is stood in at importlib.metadata.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import site
import sys
import types

import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle, switches
from _fp4_dynamo_shim.activation import export

BLOCK = "# >>> fp4-dynamo-shim import hook >>>\nimport fp4_dynamo_shim_hook\n"
NO_HOOK = ("import fp4_dynamo_shim exports FP4_DYNAMO_SHIM=1 for child processes, but no import hook is installed "
           "where they start (no fp4_dynamo_shim.pth or fp4_dynamo_shim_hook.pth in {sites}{shadow}), so "
           "spawned workers such as SGLang's schedulers will not apply the shim{plugin}. Install the package with pip "
           "(a wheel or -e), or run `fp4-dynamo-shim install-hook`; `python -m fp4_dynamo_shim.verify` checks a "
           "spawned worker.")


@pytest.fixture
def exporting(sites, without_the_export, monkeypatch, caplog):
    """Apply the shim as the import does (with the export to children) under the given variable value, in a
    process that exported nothing yet; returns (what it said, the variable's value)."""
    def apply_as_the_import(value, plugin=None):
        if value is None:
            monkeypatch.delenv(switches.HOOK, raising=False)
        else:
            monkeypatch.setenv(switches.HOOK, value)
        if plugin:
            entry = importlib.metadata.EntryPoint("fp4_dynamo_shim", plugin, "sglang.srt.plugins")
            monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [entry])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fp4_dynamo_shim"):
            lifecycle.apply(route="import", layers=(export,))
        return [record.getMessage() for record in caplog.records], os.environ.get(switches.HOOK)

    return apply_as_the_import


def install(directory, name, text="import fp4_dynamo_shim_hook\n"):
    (directory / name).write_text(text)
    return str(directory / name)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_blank_becomes_1_and_the_user_environment_has_none(exporting, sites, value):
    install(sites[0], "fp4_dynamo_shim.pth")
    said, exported = exporting(value)
    assert (said, exported) == ([], "1")
    assert switches.HOOK not in export.user_environment()
    assert fp4_dynamo_shim.status()["children"] == {switches.HOOK: "1", "exported_by_import": True}


@pytest.mark.parametrize("value", ["1", " TRUE ", "On"])
def test_a_value_the_hook_understands_is_left_as_the_user_wrote_it(exporting, sites, value):
    install(sites[1], "fp4_dynamo_shim_hook.pth")
    said, exported = exporting(value)
    assert (said, exported) == ([], value)
    assert export.user_environment()[switches.HOOK] == value
    assert fp4_dynamo_shim.status()["children"] == {switches.HOOK: value, "exported_by_import": False}


def test_a_value_the_hook_does_not_understand_is_replaced_and_named(exporting, sites, monkeypatch):
    custom = types.ModuleType("sitecustomize")
    custom.__file__ = install(sites[0], "sitecustomize.py", BLOCK)  # the sitecustomize route, run at start-up
    monkeypatch.setitem(sys.modules, "sitecustomize", custom)
    said, exported = exporting("bogus-for-the-export")
    assert exported == "1"
    assert "FP4_DYNAMO_SHIM='bogus-for-the-export' is not understood" in said[0]  # apply() reads the setting first
    assert said[1:] == ["import fp4_dynamo_shim set FP4_DYNAMO_SHIM=1 for child processes in place of "
                    "'bogus-for-the-export', which the import hook does not understand (children would run without "
                    "the shim); revert() puts it back"]
    assert export.user_environment()[switches.HOOK] == "bogus-for-the-export"  # for verify's worker check


def test_user_environment_gives_back_only_what_the_export_changed(exporting, sites, monkeypatch):
    install(sites[0], "fp4_dynamo_shim.pth")
    exporting(None)
    monkeypatch.setenv(switches.HOOK, "0")  # the user (or a test) set it after the import: theirs, not the export's
    assert export.user_environment()[switches.HOOK] == "0"


@pytest.mark.parametrize("shadowed, plugin", [(False, None), (True, None), (False, "pkg.module:plugin")])
def test_without_a_start_up_route_the_export_warns_that_children_will_not_apply(exporting, sites, shadowed, plugin,
                                                                                 monkeypatch, tmp_path):
    shadow = None
    if shadowed:  # the block is in a site directory, but another sitecustomize is the one this interpreter runs
        install(sites[1], "sitecustomize.py", BLOCK)
        (tmp_path / "first").mkdir()
        other = types.ModuleType("sitecustomize")
        other.__file__ = shadow = install(tmp_path / "first", "sitecustomize.py", "import os\n")
        monkeypatch.setitem(sys.modules, "sitecustomize", other)
    said, exported = exporting(None, plugin=plugin)
    assert exported == "1"
    assert said == [NO_HOOK.format(
        sites=", ".join(map(str, sites)), shadow=f"; {shadow} shadows the sitecustomize block" if shadow else "",
        plugin=" (the SGLang plugin still does, on SGLang >= 0.5.11)" if plugin else "")]


def test_with_no_site_directory_the_warning_says_so(exporting, monkeypatch):
    monkeypatch.setattr(site, "getsitepackages", lambda: [])
    said, _ = exporting(None)
    assert "(no fp4_dynamo_shim.pth or fp4_dynamo_shim_hook.pth in any site directory)" in said[0]


@pytest.mark.parametrize("value, after_revert", [(None, None), ("bogus", "bogus"), ("1", "1")])
def test_revert_withdraws_exactly_what_the_export_set(exporting, sites, value, after_revert):
    """revert() gives the user's value back (none, or the one replaced) and forgets the export; a value the
    export did not set (the user's own 1) stays."""
    install(sites[0], "fp4_dynamo_shim.pth")
    exporting(value)
    fp4_dynamo_shim.revert()
    assert os.environ.get(switches.HOOK) == after_revert
    assert fp4_dynamo_shim.status()["children"] == {switches.HOOK: after_revert, "exported_by_import": False}
    os.environ[switches.HOOK] = "1"  # set again after revert, by the user: not the export's to withdraw
    fp4_dynamo_shim.revert()
    assert os.environ[switches.HOOK] == "1"


def test_revert_leaves_a_value_the_user_changed_after_the_export(exporting, sites):
    install(sites[0], "fp4_dynamo_shim.pth")
    exporting("bogus")
    os.environ[switches.HOOK] = "0"
    fp4_dynamo_shim.revert()
    assert os.environ[switches.HOOK] == "0" and not fp4_dynamo_shim.status()["children"]["exported_by_import"]
