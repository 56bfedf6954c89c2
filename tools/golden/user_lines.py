"""Rewrite tests/data/user_lines.json, the words users read per release row and per variable, for review:

    python tools/golden/user_lines.py            # then read `git diff tests/data/user_lines.json` and commit it

What goes into the file is tests/support/user_lines.py's, which the tests compare with the code.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
import user_lines  # noqa: E402

if __name__ == "__main__":
    sys.exit(user_lines.main())
