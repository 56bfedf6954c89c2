"""Environment variables: every one is read by the same parser, with the same case, whitespace and unknown-word
rules (an on/off variable stands for them all here)."""

from __future__ import annotations

import json
import logging
import runpy

import pytest

import fp4_dynamo_shim
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.settings import Settings
from fp4_dynamo_shim.errors import ApplyError
import user_lines


SWITCH = switches.STRICT


@pytest.mark.parametrize("raw, value", [("TRUE", True), ("On", True), (" Yes ", True), ("1", True), ("oN\n", True),
                                        ("FALSE", False), ("Off", False), ("NO", False), ("0", False), ("", False)])
def test_switch_values_are_case_insensitive_and_stripped(raw, value):
    assert switches.read(SWITCH, {SWITCH: raw}) == (value, None)


@pytest.mark.parametrize("raw", ["2", "enabled", "TRUE!", "o n"])
def test_an_unknown_switch_value_is_off_with_a_problem_naming_it(raw):
    value, problem = switches.read(SWITCH, {SWITCH: raw})
    assert value is False and SWITCH in problem and repr(raw) in problem


def test_an_unset_switch_is_off_without_a_problem_and_a_bad_one_says_what_is_accepted():
    assert switches.read(SWITCH, {}) == (False, None)
    assert switches.read(SWITCH, {"OTHER": "1"}) == (False, None)
    value, problem = switches.read(SWITCH, {SWITCH: "maybe"})
    assert (value, problem) == (False, user_lines.not_understood(SWITCH, "maybe"))


# --- every variable in one table: words in any case and spacing, unset, empty, unknown ------------------------------

def _spellings(word):
    return [word, word.upper(), word[:1].upper() + word[1:], f"  {word}\t", f"\n{word.upper()} "]


def _cases():
    for name, variable in switches.VARIABLES.items():
        yield name, None, variable.default, False
        yield name, "", variable.default, False
        yield name, "  ", variable.default, False
        for word, value in variable.words.items():
            for spelling in _spellings(word):
                yield name, spelling, value, False
        yield name, "bogus", variable.default, True
    yield switches.CUDA_VERSION, " 12.8 ", "12.8", False  # the one variable that also takes a pattern


@pytest.mark.parametrize("name, raw, value, understood_not", list(_cases()),
                         ids=lambda item: repr(item) if isinstance(item, str) or item is None else "")
def test_every_variable_reads_every_spelling_the_same_way(name, raw, value, understood_not, monkeypatch):
    for other in switches.VARIABLES:
        monkeypatch.delenv(other, raising=False)
    if raw is not None:
        monkeypatch.setenv(name, raw)
    settings = Settings.from_environment()
    assert getattr(settings, switches.VARIABLES[name].setting) == value
    assert len(settings.problems) == int(understood_not)
    if understood_not:
        assert name in settings.problems[0] and "'bogus'" in settings.problems[0]


@pytest.mark.parametrize("strict", [False, True], ids=["strict-off", "strict-on"])
@pytest.mark.parametrize("disabled", [False, True], ids=["kill-off", "kill-on"])
@pytest.mark.parametrize("name", [name for name in switches.VARIABLES if name not in (switches.STRICT, switches.DISABLE)])
def test_an_unknown_value_with_strict_and_the_kill_switch(name, strict, disabled, applied_with):
    """Unknown value: warned and in status() always; an ApplyError only under strict with the shim switched on
    (switched off, the shim raises nothing: the kill switch is the user's choice, not a refusal)."""
    environment = {name: "bogus", "STRICT": "1" if strict else None, "DISABLE": "1" if disabled else None}
    if strict and not disabled:
        with pytest.raises(ApplyError, match=name):
            applied_with(**environment)
        assert not fp4_dynamo_shim.status()["applied"]
        return
    status = applied_with(**environment)
    assert status["applied"] is not disabled and status["disabled"] is disabled
    assert [warning for warning in status["warnings"] if name in warning and "'bogus'" in warning]
    shows_the_default = {
        switches.FALLBACK: lambda: status["fallback"] == "error",
        switches.FLASHINFER_OPS: lambda: disabled or status["flashinfer_ops"]["gate"] == "proven",
        switches.CUDA_VERSION: lambda: disabled or status["cuda_version"]["source"] != "environment",
        switches.HOOK: lambda: status["children"][switches.HOOK] == "bogus",  # apply() exports nothing
    }
    assert shows_the_default[name]()


def test_the_variables_table_built_afresh_gives_the_reviewed_words():
    """The table is built once, when switches is imported. Running the module's source again builds it now, through
    its builders (which is how a generated mutant of a builder shows at all), and it must give the words users
    read: tests/data/user_lines.json, reviewed."""
    fresh = runpy.run_path(switches.__file__, run_name=switches.__name__)["VARIABLES"]
    reviewed = json.loads(user_lines.FILE.read_text())["variables"]
    assert user_lines.variable_lines(fresh) == reviewed
    assert user_lines.variable_lines(switches.VARIABLES) == reviewed


def test_say_logs_to_the_projects_logger_when_logging_is_set_up_and_else_names_the_project_on_stderr(
        caplog, capsys, monkeypatch):
    with caplog.at_level(logging.INFO, logger="fp4_dynamo_shim"):
        switches.say("one", "info")
        switches.say("fp4_dynamo_shim: two")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records][-2:] == [
        ("fp4_dynamo_shim", "INFO", "one"), ("fp4_dynamo_shim", "WARNING", "fp4_dynamo_shim: two")]
    monkeypatch.setattr(logging.Logger, "hasHandlers", lambda self: False)  # start-up: nothing set up yet
    capsys.readouterr()
    switches.say("three")
    switches.say("fp4_dynamo_shim: four")
    assert capsys.readouterr().err == "fp4_dynamo_shim: three\nfp4_dynamo_shim: four\n"


def test_warn_says_each_message_once_and_returns_whether_it_did(said):
    assert switches.warn("a") is True and switches.warn("a") is False and switches.warn("b") is True
    assert said() == [("WARNING", "a"), ("WARNING", "b")]


@pytest.mark.parametrize("raw", ["12.8junk", "12.8rc1", "12.8.post1", "12.8.0.1", "12.8 .1", "v12.8", "12.", ".8"])
def test_a_value_that_only_begins_like_a_version_is_not_a_cuda_version(raw, applied_with):
    """FlashInfer's JIT would be told a version nobody asked for (12.8rc1 is a pre-release of 12.8, below it):
    a value is a version only as a whole, else it is not understood, said so, and the default is used."""
    status = applied_with(CUDA_VERSION=raw)
    assert status["applied"], status["problem"]
    assert status["cuda_version"]["source"] != "environment", status["cuda_version"]
    assert [line for line in status["warnings"] if switches.CUDA_VERSION in line] == [
        user_lines.not_understood(switches.CUDA_VERSION, raw)]
    with pytest.raises(ApplyError, match=f"{switches.CUDA_VERSION}={raw!r} is not understood"):
        applied_with(CUDA_VERSION=raw, STRICT="1")


@pytest.mark.parametrize("raw, told", [("12.8", "12.8"), (" 12.8.1 ", "12.8.1"), ("13.0", "13.0")])
def test_a_whole_version_is_what_flashinfers_jit_is_told(raw, told, applied_with):
    status = applied_with(CUDA_VERSION=raw)
    assert (status["cuda_version"]["source"], status["cuda_version"]["value"], status["warnings"]) == (
        "environment", told, [])
