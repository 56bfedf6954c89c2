"""Write tests/data/user_lines.json: the words a user reads for each row of the shim's release tables.

For every SGLang release the table knows (each version with pins, plus one before the first and one after the
last), what ``status()["sglang"]`` and verify say: the need line, the derived flags and verify's worker-check line
for a plain launch whose worker runs without the shim. For every FlashInfer row, ``status()["target"]``. For every
environment variable, its words, its default and what a value it does not understand is told.
``tests/sglang/test_user_lines.py`` compares the file with what the code says now, both ways: a change to a
row or to the logic that words it shows up as a diff of this file, to be read and committed on purpose.

    python tools/golden/user_lines.py            # rewrite the file; review `git diff tests/data/user_lines.json`

It lives with the tests' helpers because the tests build the same words from it (and generated-mutant runs copy
only src/ and tests/); tools/golden/user_lines.py is the command that writes the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "tests" / "data" / "user_lines.json"
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from _fp4_dynamo_shim import switches  # noqa: E402
from _fp4_dynamo_shim.fp4 import fp4_releases  # noqa: E402
from _fp4_dynamo_shim.sglang import sglang_releases  # noqa: E402
from _fp4_dynamo_shim.verify import workers  # noqa: E402

#: A plain launch's worker without the shim, and one started with FP4_DYNAMO_SHIM=1 that has it.
_PLAIN = {"active": False}
_WITH_VARIABLE = {"active": True, "activated_by": "pth"}


def sglang_lines(version: str) -> dict:
    release = sglang_releases.release_for(version)
    passed, line = workers.worker_verdict(_PLAIN, _WITH_VARIABLE, [], version)
    return {
        **sglang_releases.describe_version(version),  # status()["sglang"] where this version is installed
        "needs_shim": sglang_releases.needs_shim(release),
        "verify_worker_check": {"passed": passed, "line": line},
    }


def variable_lines(variables) -> dict:
    """Per variable of a ``switches.VARIABLES`` table: what a user can write and what a wrong value is told."""
    return {name: {"setting": variable.setting, "default": variable.default, "words": sorted(variable.words),
                   "means": [variable.words[word] for word in sorted(variable.words)], "pattern": variable.pattern,
                   "not_understood": variable.parse("bogus")[1], "blank": list(variable.parse("  ")),
                   "shouted": list(variable.parse(f" {sorted(variable.words)[0].upper()} "))}
            for name, variable in variables.items()}


def not_understood(name: str, raw: str) -> str:
    """What a user is told for ``name=raw``, a value the variable does not take: the reviewed words in the file
    (written for 'bogus'), so that tests need not spell them again."""
    reviewed = json.loads(FILE.read_text())["variables"][name]["not_understood"]
    return reviewed.replace(repr("bogus"), repr(raw), 1)


def versions() -> list:
    return ["0.5.2", *sglang_releases.PINS, "0.5.24"]


def current() -> dict:
    return {
        "sglang": {version: sglang_lines(version) for version in versions()},
        "flashinfer": {str(target.versions): fp4_releases.describe(target) for target in fp4_releases.TARGETS},
        "variables": variable_lines(switches.VARIABLES),
    }


def main() -> int:
    FILE.write_text(json.dumps(current(), indent=1, sort_keys=False) + "\n")
    print(f"wrote {FILE.relative_to(ROOT)}; review the diff before committing it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
