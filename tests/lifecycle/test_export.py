"""What ``import fp4_dynamo_shim`` exports for child processes, in this process: ``FP4_DYNAMO_SHIM=1`` unless the
user's value is one the hook understands, the warning when a value is replaced or when no start-up route would
act on it in a child, and the user's own environment as ``user_environment()`` gives it back.

A child started with it is the spawn and venv tests' (tests/activation/); here ``export_for_children`` is called
directly so that its words and choices are seen by a test that reaches it (and by mutmut's trampolines, which do
not follow children). Stand-ins: the start-up routes this interpreter has (``site_files.installed_routes``), the
site directories named in the warning and SGLang's plugin entry point, so that each combination is reached; the
warnings' record of what was said (``switches.warned``), emptied per test so each warning is said again.
"""

from __future__ import annotations

import os

import pytest

from _fp4_dynamo_shim import lifecycle, switches
from _fp4_dynamo_shim.routes import site_files

NO_ROUTES = {"pth": None, "hook_pth": None, "sitecustomize": None, "sitecustomize_shadowed_by": None}
NO_HOOK = ("import fp4_dynamo_shim exports FP4_DYNAMO_SHIM=1 for child processes, but no import hook is installed "
           "where they start (no fp4_dynamo_shim.pth or fp4_dynamo_shim_hook.pth in /site-a, /site-b{shadow}), so "
           "spawned workers such as SGLang's schedulers will not apply the shim{plugin}. Install the package with pip "
           "(a wheel or -e), or run `fp4-dynamo-shim install-hook`; `python -m fp4_dynamo_shim.verify` checks a "
           "spawned worker.")


@pytest.fixture
def exporting(monkeypatch):
    """Call export_for_children() with the given variable value and routes; returns (said, environ value)."""
    said = []
    monkeypatch.setitem(os.environ, switches.HOOK, "")  # restored (or removed) after the test
    monkeypatch.setattr(switches, "warned", set())
    monkeypatch.setattr(switches, "say", lambda message, level="warning": said.append(message))
    monkeypatch.setattr(lifecycle, "_exported", False)
    monkeypatch.setattr(lifecycle, "_replaced_value", None)
    monkeypatch.setattr(site_files, "site_dirs", lambda: ["/site-a", "/site-b"])
    monkeypatch.setattr(lifecycle.sglang_releases, "plugin_entry_point", lambda: None)

    def export(value, routes=NO_ROUTES, plugin=None):
        if value is None:
            monkeypatch.delenv(switches.HOOK, raising=False)
        else:
            monkeypatch.setenv(switches.HOOK, value)
        monkeypatch.setattr(site_files, "installed_routes", lambda: dict(routes))
        monkeypatch.setattr(lifecycle.sglang_releases, "plugin_entry_point", lambda: plugin)
        said.clear()
        lifecycle.export_for_children()
        return list(said), os.environ.get(switches.HOOK)

    return export


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_blank_becomes_1_and_the_user_environment_has_none(exporting, value):
    said, exported = exporting(value, routes={**NO_ROUTES, "pth": "/site-a/fp4_dynamo_shim.pth"})
    assert (said, exported) == ([], "1")
    assert switches.HOOK not in lifecycle.user_environment()


@pytest.mark.parametrize("value", ["1", " TRUE ", "On"])
def test_a_value_the_hook_understands_is_left_as_the_user_wrote_it(exporting, value):
    said, exported = exporting(value, routes={**NO_ROUTES, "hook_pth": "/site-a/fp4_dynamo_shim_hook.pth"})
    assert (said, exported) == ([], value)
    assert lifecycle.user_environment()[switches.HOOK] == value


def test_a_value_the_hook_does_not_understand_is_replaced_and_named(exporting):
    said, exported = exporting("bogus", routes={**NO_ROUTES, "sitecustomize": "/site-a/sitecustomize.py"})
    assert exported == "1"
    assert said == ["import fp4_dynamo_shim set FP4_DYNAMO_SHIM=1 for child processes in place of 'bogus', which "
                    "the import hook does not understand (children would run without the shim); revert() puts it back"]
    assert lifecycle.user_environment()[switches.HOOK] == "bogus"  # what the user set, for verify's worker check


def test_user_environment_gives_back_only_what_the_export_changed(exporting, monkeypatch):
    exporting(None, routes={**NO_ROUTES, "pth": "/p"})
    monkeypatch.setenv(switches.HOOK, "0")  # the user (or a test) set it after the import: theirs, not the export's
    assert lifecycle.user_environment()[switches.HOOK] == "0"


@pytest.mark.parametrize("shadow, plugin", [(None, None), ("/venv/sitecustomize.py", None), (None, "entry point")])
def test_without_a_start_up_route_the_export_warns_that_children_will_not_apply(exporting, shadow, plugin):
    said, exported = exporting(None, routes={**NO_ROUTES, "sitecustomize_shadowed_by": shadow}, plugin=plugin)
    assert exported == "1"
    assert said == [NO_HOOK.format(
        shadow=f"; {shadow} shadows the sitecustomize block" if shadow else "",
        plugin=" (the SGLang plugin still does, on SGLang >= 0.5.11)" if plugin else "")]


def test_with_no_site_directory_the_warning_says_so(exporting, monkeypatch):
    monkeypatch.setattr(site_files, "site_dirs", lambda: [])
    said, _ = exporting(None)
    assert "(no fp4_dynamo_shim.pth or fp4_dynamo_shim_hook.pth in any site directory)" in said[0]


@pytest.mark.parametrize("value, after_revert", [(None, None), ("bogus", "bogus"), ("1", "1")])
def test_revert_withdraws_exactly_what_the_export_set(exporting, unpatched, value, after_revert):
    """revert() gives the user's value back (none, or the one replaced) and forgets the export; a value the
    export did not set (the user's own 1) stays."""
    exporting(value, routes={**NO_ROUTES, "pth": "/p"})
    lifecycle.revert()
    assert os.environ.get(switches.HOOK) == after_revert and lifecycle._exported is False
    os.environ[switches.HOOK] = "1"  # set again after revert, by the user: not the export's to withdraw
    lifecycle.revert()
    assert os.environ[switches.HOOK] == "1"


def test_revert_leaves_a_value_the_user_changed_after_the_export(exporting, unpatched):
    exporting("bogus", routes={**NO_ROUTES, "pth": "/p"})
    os.environ[switches.HOOK] = "0"
    lifecycle.revert()
    assert os.environ[switches.HOOK] == "0" and lifecycle._exported is False
