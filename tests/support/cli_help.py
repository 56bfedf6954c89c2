"""The command line's help pages as users read them, pinned in tests/data/cli_help.txt.

Every word of ``fp4-dynamo-shim --help`` and of each command's ``--help`` is user-facing; a change to them is
reviewed as a diff of that file (``python tools/golden/cli_help.py`` rewrites it). argparse lays the pages out
for the terminal's width and words a few headings differently between Python versions, so the pages are made
80 columns wide and the file names the Python version it was written with.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

FILE = Path(__file__).resolve().parents[1] / "data" / "cli_help.txt"
COMMANDS = ((), ("verify",), ("status",), ("install-hook",), ("uninstall-hook",))


def python_version() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def pages() -> str:
    """The header line, then each page after the command line that shows it."""
    from _fp4_dynamo_shim import cli

    with mock.patch.dict(os.environ, {"COLUMNS": "80"}):
        parser = cli._parser()
        subparsers = next(action for action in parser._actions if action.dest == "command").choices
        shown = [f"# argparse's layout under Python {python_version()}; rewrite: python tools/golden/cli_help.py\n"]
        for command in COMMANDS:
            page = (subparsers[command[0]] if command else parser).format_help()
            shown.append(f"$ fp4-dynamo-shim {' '.join((*command, '--help'))}\n{page}")
    return "\n".join(shown)


def recorded_python_version() -> str:
    return FILE.read_text().split("Python ", 1)[1].split(";", 1)[0]


def main() -> int:
    FILE.write_text(pages())
    print(f"wrote {FILE}: review `git diff {FILE.relative_to(FILE.parents[2])}` and commit it")
    return 0
