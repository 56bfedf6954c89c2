"""Each test case of pytest's JUnit XML reports with its outcome: the one reader CI and the tools share.

    python tools/junit_reports.py REPORT...   # "N passed, M failed, K skipped" (CI's stage lines)
"""

from __future__ import annotations

import dataclasses
import sys
import xml.etree.ElementTree as ElementTree
from typing import Iterable, Iterator


@dataclasses.dataclass(frozen=True)
class Case:
    classname: str  # the test's module, dotted (tests.fp4.test_compile)
    name: str  # the test function, with its parameters (test_x[inductor])
    outcome: str  # "passed", "failed" (a failure or an error) or "skipped"
    message: str  # the failure's, error's or skip's message; "" for a pass
    properties: dict  # what the test recorded (``record_property``, a report's ``user_properties``)


def cases(reports: Iterable) -> Iterator[Case]:
    for report in reports:
        for case in ElementTree.parse(report).iter("testcase"):
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            skipped = case.find("skipped")
            said = problem if problem is not None else skipped
            yield Case(case.get("classname", ""), case.get("name", ""),
                       "failed" if problem is not None else "skipped" if skipped is not None else "passed",
                       (said.get("message") or "") if said is not None else "",
                       {prop.get("name"): prop.get("value") for prop in case.iter("property")})


def counts(reports: Iterable) -> str:
    outcomes = [case.outcome for case in cases(reports)]
    return ", ".join(f"{outcomes.count(outcome)} {outcome}" for outcome in ("passed", "failed", "skipped"))


if __name__ == "__main__":
    print(counts(sys.argv[1:]))
