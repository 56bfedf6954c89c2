"""The start-up hook, the SGLang plugin and the front's command-line check, called in this process.

test_no_route_is_silently_off.py and test_activation.py run these routes where users meet them: in fresh interpreters and
virtual environments. Here the same functions run in this process, case by case: which route
``status()["activated_by"]`` records, the one warning a failure becomes, the ApplyError that strict mode alone
may raise, the finder that waits for flashinfer, the plugin's line in the scheduler's log, and which module
``python -m`` was given. Everything a test changes (``sys.meta_path``, the hook's globals, the variables, the
shim's state) is put back; the autouse fixture applies the shim again afterwards.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types

import flashinfer
import pytest
import wrapt

import _fp4_dynamo_shim
import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.activation import sglang_plugin, startup
from _fp4_dynamo_shim.activation import importer
from fp4_dynamo_shim.errors import ApplyError
import user_lines

BOGUS_FALLBACK = user_lines.not_understood("FP4_DYNAMO_SHIM_FALLBACK", "bogus")


def spelled(value):
    """A command line in a test's id as it is typed."""
    return " ".join(value) if isinstance(value, list) else None


@pytest.fixture
def fresh_start(monkeypatch, hook_not_installed, without_the_export, said):
    """This process as a fresh interpreter's start-up finds it: the hook not installed, no route, the shim not
    applied, no warning said yet, none of the shim's variables set, and a copy of ``sys.meta_path`` to change.
    Whatever the test applies is reverted under its own variables before they are put back."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in switches.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    fp4_dynamo_shim.revert()


def activated_by():
    state = fp4_dynamo_shim.status()
    return state["activated_by"] if state["applied"] else None


# --- which import is the command line's -----------------------------------------------------------------------

@pytest.mark.parametrize("options, module", [
    (["-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),
    (["-m", "fp4_dynamo_shim.verify", "--json", "-m"], "fp4_dynamo_shim.verify"),  # the module's own arguments
    (["-mfp4_dynamo_shim.verify"], "fp4_dynamo_shim.verify"),  # the name joined to the flag
    (["-Im", "fp4_dynamo_shim"], "fp4_dynamo_shim"),  # flags in one group, -m last
    (["-I", "-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),
    (["-X", "importtime", "-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),  # -X and -W take the next argument...
    (["-W", "ignore", "-m", "fp4_dynamo_shim.__main__"], "fp4_dynamo_shim.__main__"),
    (["-IX", "dev", "-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),  # ...also last in a group
    (["-Ximporttime", "-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),  # ...or the rest of their own
    (["-Wignore::DeprecationWarning", "-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),
    (["--check-hash-based-pycs", "always", "-m", "fp4_dynamo_shim"], "fp4_dynamo_shim"),  # the one long option
    (["-E", "--check-hash-based-pycs", "never", "-Im", "fp4_dynamo_shim"], "fp4_dynamo_shim"),  # with a value
    (["--check-hash-based-pycs"], None),  # the interpreter refuses this itself; asking must not fail
    (["-c", "import fp4_dynamo_shim", "-m", "fp4_dynamo_shim"], None),  # -c: later words are the code's arguments
    (["-cimport fp4_dynamo_shim"], None),  # the code joined to -c (its letters are not flags)
    (["-Ic", "import fp4_dynamo_shim"], None),
    (["run.py", "-m", "fp4_dynamo_shim"], None),  # a script, and its own arguments
    (["-", "-m", "fp4_dynamo_shim"], None),  # the program on stdin
    (["--", "-m", "fp4_dynamo_shim"], None),  # after --, "-m" is a script's file name
    (["-m"], None),  # the interpreter refuses this itself; asking must not fail
    ([], None),
], ids=spelled)
def test_the_module_python_m_was_given_is_found_past_the_interpreters_options(options, module):
    assert importer.module_after_m(options) == module


@pytest.mark.parametrize("orig_argv, argv, command_line", [
    (["python", "-m", "fp4_dynamo_shim", "status"], ["-m", "status"], True),
    (["python", "-X", "importtime", "-m", "fp4_dynamo_shim", "--version"], ["-m", "--version"], True),
    (["python", "-Im", "fp4_dynamo_shim.verify", "--json"], ["-m", "--json"], True),
    (["python", "-m", "fp4_dynamo_shim.__main__"], ["-m"], True),
    # A program run with -m whose package imports the shim on the way: the shim applies.
    (["python", "-m", "launcher", "--port", "8000"], ["-m", "--port", "8000"], False),
    (["python", "-m", "fp4_dynamo_shim.errors"], ["-m"], False),  # a module of the package, not the command line
    (["python", "run.py", "-m", "fp4_dynamo_shim"], ["run.py", "-m", "fp4_dynamo_shim"], False),
    (["python", "-c", "import fp4_dynamo_shim"], ["-c"], False),
], ids=spelled)
def test_the_front_holds_back_only_while_python_m_locates_the_command_line(orig_argv, argv, command_line,
                                                                         monkeypatch):
    """While ``python -m`` locates a module, ``sys.argv`` is "-m" and the module's arguments; the module's name
    is only in ``sys.orig_argv``."""
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", argv)
    assert importer.running_the_command_line() is command_line


def test_without_the_original_command_line_the_import_is_a_programs(monkeypatch):
    """An interpreter without ``sys.orig_argv`` (before 3.10, or an embedding that took it away) cannot say
    which module -m was given: the front applies rather than fail or guess."""
    monkeypatch.delattr(sys, "orig_argv")
    monkeypatch.setattr(sys, "argv", ["-m", "status"])
    assert importer.running_the_command_line() is False


# --- FP4_DYNAMO_SHIM and the kill switch at start-up ---------------------------------------------------------

@pytest.mark.parametrize("hook, disable, enabled", [
    (None, None, False),  # the package's .pth line does nothing at all by default
    ("1", None, True),
    (" Yes ", "0", True),
    ("1", "1", False),  # the kill switch vetoes it
    ("0", None, False),
    (None, "1", False),
])
def test_the_pth_line_is_on_only_when_the_variable_asks_and_the_kill_switch_is_off(hook, disable, enabled,
                                                                                  fresh_start):
    for name, value in ((switches.HOOK, hook), (switches.DISABLE, disable)):
        if value is not None:
            fresh_start.setenv(name, value)
    assert startup.enabled_by_environment() is enabled


def test_values_the_pth_line_does_not_understand_are_off_and_each_is_warned_once(fresh_start, said):
    fresh_start.setenv(switches.HOOK, "2")
    fresh_start.setenv(switches.DISABLE, "maybe")
    assert startup.enabled_by_environment() is False
    assert startup.enabled_by_environment() is False
    assert said() == [("WARNING", user_lines.not_understood("FP4_DYNAMO_SHIM", "2")),
                            ("WARNING", user_lines.not_understood("FP4_DYNAMO_SHIM_DISABLE", "maybe"))]


@pytest.mark.parametrize("hook, route", [("1", "pth"), ("0", None), (None, None)])
def test_the_pth_line_installs_the_hook_on_the_pth_route_only_when_asked(hook, route, fresh_start):
    if hook is not None:
        fresh_start.setenv(switches.HOOK, hook)
    before = list(sys.meta_path)
    startup.install_if_enabled()
    assert (startup.route, activated_by()) == (route, route)
    assert sys.meta_path == before  # flashinfer is imported here already: applied at once, or nothing at all


# --- install() ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arguments, route", [((), "sitecustomize"), (("install-hook",), "install-hook")])
def test_install_with_flashinfer_already_imported_applies_at_once_on_its_route(arguments, route, fresh_start,
                                                                               said):
    """The sitecustomize block calls install() without arguments; the installed .pth names its route."""
    before = list(sys.meta_path)
    startup.install(*arguments)
    assert (startup.route, activated_by()) == (route, route)
    assert sys.meta_path == before and said() == []


def test_install_runs_once_per_process(fresh_start):
    """CPython 3.11's site.py processes a venv's .pth files twice: the second call must do nothing."""
    startup.install("install-hook")
    fp4_dynamo_shim.revert()
    startup.install("pth")
    assert (startup.route, activated_by()) == ("install-hook", None)


def test_install_before_flashinfer_is_imported_puts_one_finder_first_and_applies_nothing_yet(fresh_start):
    """First on ``sys.meta_path``: a finder ahead of it that finds flashinfer (an editable install's, another
    hook's) would let the import through unseen. flashinfer is taken out of ``sys.modules`` for the call only."""
    before = list(sys.meta_path)
    with pytest.MonkeyPatch.context() as not_imported:  # flashinfer back before anything can import it again
        not_imported.delitem(sys.modules, "flashinfer")
        startup.install("pth")
        startup.install("pth")
    assert startup.route == "pth" and not fp4_dynamo_shim.status()["applied"]
    assert [type(finder) for finder in sys.meta_path[:1]] == [startup._AwaitFlashinfer]
    assert sys.meta_path[1:] == before


def test_an_unknown_kill_switch_value_is_warned_once_and_the_hook_goes_on(fresh_start, said):
    fresh_start.setenv(switches.DISABLE, "maybe")
    startup.install("pth")
    assert (startup.route, activated_by()) == ("pth", "pth")
    assert said() == [("WARNING", user_lines.not_understood("FP4_DYNAMO_SHIM_DISABLE", "maybe"))]


def test_install_never_raises_strict_modes_refusal_becomes_the_hooks_one_warning(fresh_start, said):
    """install() runs from a .pth line or sitecustomize and never raises; with flashinfer already imported,
    strict mode's refusal of a value it does not understand reaches the user as the hook's warning."""
    fresh_start.setenv(switches.STRICT, "1")
    fresh_start.setenv(switches.FALLBACK, "bogus")
    startup.install("pth")
    assert activated_by() is None
    assert said() == [("WARNING", f"import hook: installing the import hook failed (ApplyError: {BOGUS_FALLBACK}); "
                                        "continuing without the shim")]


# --- when flashinfer is imported ----------------------------------------------------------------------------

def test_the_post_import_hook_applies_on_the_route_that_installed_it(fresh_start):
    fresh_start.setattr(startup, "route", "install-hook")
    startup._on_flashinfer_imported(flashinfer)
    assert activated_by() == "install-hook"


def test_strict_mode_alone_makes_the_post_import_hook_raise(fresh_start, said):
    fresh_start.setenv(switches.STRICT, "1")
    fresh_start.setenv(switches.FALLBACK, "bogus")
    with pytest.raises(ApplyError) as raised:
        startup._on_flashinfer_imported(flashinfer)
    assert str(raised.value) == BOGUS_FALLBACK and said() == []


def test_any_other_failure_of_the_post_import_hook_is_one_warning_and_the_program_goes_on(fresh_start, said):
    """A broken install: the implementation's lifecycle module cannot be imported (``None`` in ``sys.modules``
    makes that import raise, as in test_activation's subprocess version of this test)."""
    fresh_start.delattr(_fp4_dynamo_shim, "lifecycle")
    fresh_start.setitem(sys.modules, "_fp4_dynamo_shim.lifecycle", None)
    with pytest.raises(ModuleNotFoundError) as broken:
        importlib.import_module("_fp4_dynamo_shim.lifecycle")
    startup._on_flashinfer_imported(flashinfer)
    startup._on_flashinfer_imported(flashinfer)
    assert said() == [("WARNING", f"import hook: applying the shim failed (ModuleNotFoundError: {broken.value}); "
                                        "continuing without the shim")]
    assert not lifecycle.status()["applied"]


@pytest.fixture
def registered(fresh_start):
    """wrapt's ``register_post_import_hook`` stood in by a recorder of (hook, module name). The real one calls the
    hook at once for an imported flashinfer and leaves its own finder on ``sys.meta_path`` for good (a global
    flag in wrapt), so the recorder stops there: the test calls the recorded hook as wrapt would when the
    import completes. Whether wrapt then fires it is wrapt's part, run for real in test_activation.py."""
    calls = []
    fresh_start.setattr(wrapt, "register_post_import_hook", lambda hook, name: calls.append((hook, name)))
    return calls


def test_the_finder_ignores_every_other_import(registered):
    finder = startup._AwaitFlashinfer()
    sys.meta_path.insert(0, finder)
    assert [finder.find_spec(name) for name in ("flashinfer_like", "torch", "flashinfer.fp4_quantization")] == [None] * 3
    assert sys.meta_path[0] is finder and registered == []


def test_the_finder_leaves_at_flashinfers_import_and_hands_it_to_a_hook_that_applies_the_shim(registered,
                                                                                              fresh_start):
    fresh_start.setattr(startup, "route", "pth")
    finder = startup._AwaitFlashinfer()
    sys.meta_path.insert(0, finder)
    spec = finder.find_spec("flashinfer")
    assert finder not in sys.meta_path
    assert spec.name == "flashinfer" and spec.origin == flashinfer.__spec__.origin  # this import goes on
    assert [name for _, name in registered] == ["flashinfer"]
    (hook, _), = registered
    hook(flashinfer)  # what wrapt does once flashinfer's import completes
    assert activated_by() == "pth"


def test_a_post_import_hook_that_cannot_be_registered_is_one_warning_and_the_import_goes_on(fresh_start, said):
    """wrapt's registration stood in by one that raises (a broken wrapt; the subprocess version in
    test_activation.py breaks wrapt's import itself)."""
    def broken(hook, name):
        raise RuntimeError("wrapt is broken here")

    fresh_start.setattr(wrapt, "register_post_import_hook", broken)
    finder = startup._AwaitFlashinfer()
    sys.meta_path.insert(0, finder)
    assert finder.find_spec("flashinfer") is None  # the other finders find flashinfer
    assert finder not in sys.meta_path
    assert said() == [("WARNING", "import hook: installing the post-import hook failed "
                                        "(RuntimeError: wrapt is broken here); continuing without the shim")]


# --- the SGLang plugin's line in the scheduler's log -------------------------------------------------------

def test_the_plugin_says_at_info_that_the_shim_is_active_by_which_route_and_what_it_rebound(fresh_start, said):
    version = importlib.metadata.version("flashinfer-python")
    sglang_plugin.plugin()
    bound_after_apply = types.ModuleType("bound_after_apply")  # a module that kept FlashInfer's own function
    bound_after_apply.fp4_quantize = lifecycle.original_function()
    fresh_start.setitem(sys.modules, "bound_after_apply", bound_after_apply)
    sglang_plugin.plugin()
    assert [line for line in said() if "SGLang" in line[1]] == [
        ("INFO", f"fp4_dynamo_shim is active in this SGLang process (activated by plugin; flashinfer {version}; "
                 "0 more bindings rebound now)"),
        ("INFO", f"fp4_dynamo_shim is active in this SGLang process (activated by plugin; flashinfer {version}; "
                 "1 more bindings rebound now)"),
    ]


def test_the_plugin_says_why_the_shim_is_not_active_at_info_when_switched_off(fresh_start, said):
    fresh_start.setenv(switches.DISABLE, "1")
    sglang_plugin.plugin()
    assert said() == [("INFO", "fp4_dynamo_shim is NOT active in this SGLang process: FP4_DYNAMO_SHIM_DISABLE=1 "
                                     "is set: the shim is switched off on every route")]


def test_the_plugin_warns_why_the_shim_is_not_active_when_it_failed(fresh_start, said):
    """A failing kernel load stands in for any failure of apply() (FlashInfer is left untouched)."""
    fresh_start.setattr("_fp4_dynamo_shim.fp4.kernels.load",
                        lambda *arguments: (_ for _ in ()).throw(RuntimeError("boom")))
    sglang_plugin.plugin()
    problem = "RuntimeError: boom; FlashInfer was left untouched"
    assert said() == [("WARNING", f"fp4_dynamo_shim not applied: {problem}"),
                            ("WARNING", f"fp4_dynamo_shim is NOT active in this SGLang process: {problem}")]
