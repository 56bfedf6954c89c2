"""Environment variables: every one is read by the same parser, with the same case, whitespace and unknown-word
rules (an on/off variable stands for them all here)."""

from __future__ import annotations

import pytest

from _fp4_dynamo_shim import switches


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
    assert (value, problem) == (False, f"{SWITCH}='maybe' is not understood; use 1, true, yes or on to switch it "
                                       "on, or 0, false, no, off or unset for off (treated as off)")
