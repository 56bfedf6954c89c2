"""Rewrite tests/data/cli_help.txt, the command line's help pages, for review:

    python tools/golden/cli_help.py            # then read `git diff tests/data/cli_help.txt` and commit it

What goes into the file is tests/support/cli_help.py's, which tests/verify/test_cli_commands.py compares with the code.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
import cli_help  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_help.main())
