"""The running interpreter's own site directories, which no test may change.

Every route test writes its start-up lines into a temporary site directory. A bug that drops that directory
(or a generated mutant of ``activation.site_files`` that does) writes them into the interpreter's own
site-packages instead, where they start the hook in every later interpreter of this environment: later tests
then see a route they never installed, and the developer's venv stays changed. The guard makes such a write
fail the test that did it, and puts the files back.
"""

from __future__ import annotations

import contextlib
import site
from pathlib import Path

#: What install-hook or a start-up route can leave in a site directory.
START_UP_FILES = ("fp4_dynamo_shim_hook.pth", "sitecustomize.py", "usercustomize.py")
#: Read once at import, before any test stands in ``site.getsitepackages`` for its temporary directory.
DIRECTORIES = tuple(dict.fromkeys(
    [*(site.getsitepackages() if hasattr(site, "getsitepackages") else []), site.getusersitepackages()]))


def snapshot() -> dict:
    """path -> bytes of each start-up file present in the interpreter's own site directories."""
    found = {}
    for directory in DIRECTORIES:
        for name in START_UP_FILES:
            path = Path(directory, name)
            try:
                found[path] = path.read_bytes()
            except OSError:
                pass
    return found


def restore(before: dict) -> list:
    """Put the start-up files back as ``before`` had them; the paths that differed, sorted."""
    changed = []
    now = snapshot()
    for path in sorted(set(before) | set(now)):
        if before.get(path) == now.get(path):
            continue
        changed.append(str(path))
        if path in before:
            path.write_bytes(before[path])
        else:
            path.unlink()
    return changed


@contextlib.contextmanager
def untouched():
    """Fail (AssertionError naming the files) where the block changed a start-up file, after putting it back."""
    before = snapshot()
    yield
    changed = restore(before)
    assert not changed, f"this interpreter's own start-up files were changed (now put back): {changed}"
