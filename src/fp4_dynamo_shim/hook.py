"""The sitecustomize route to the import hook, for environments that do not process ``.pth`` files.

``fp4-dynamo-shim install-hook`` adds a marked block to ``sitecustomize.py`` in a
site directory; ``uninstall-hook`` removes exactly that block. An existing
sitecustomize is kept as it is around the block, writing twice changes nothing,
and the file is replaced atomically. All logic stays in ``fp4_dynamo_shim_hook``;
the block only calls it, the way OpenTelemetry's sitecustomize does.
"""

from __future__ import annotations

import os
import site
import sysconfig
import tempfile
from pathlib import Path
from typing import Optional, Tuple

BEGIN = "# >>> fp4-dynamo-shim import hook >>>"
END = "# <<< fp4-dynamo-shim import hook <<<"
BLOCK = f"""{BEGIN}
# Applies fp4_dynamo_shim whenever flashinfer is imported. Written by `fp4-dynamo-shim install-hook`;
# remove with `fp4-dynamo-shim uninstall-hook`. FP4_DYNAMO_SHIM_DISABLE=1 turns it off.
try:
    import fp4_dynamo_shim_hook
    fp4_dynamo_shim_hook.install()
except Exception as _fp4_dynamo_shim_error:
    import sys
    sys.stderr.write("fp4_dynamo_shim import hook in %s: %r\\n" % (__file__, _fp4_dynamo_shim_error))
{END}
"""
#: The documented one-liner, for writing sitecustomize.py by hand.
ONE_LINER = "import fp4_dynamo_shim_hook; fp4_dynamo_shim_hook.install()"


def default_site_dir() -> Path:
    """The site-packages directory of the running interpreter (the venv's, inside a venv)."""
    candidates = [p for p in site.getsitepackages() if os.path.isdir(p)] if hasattr(site, "getsitepackages") else []
    return Path(candidates[0] if candidates else sysconfig.get_paths()["purelib"])


def _without_block(text: str) -> str:
    start = text.find(BEGIN)
    if start < 0:
        return text
    end = text.find(END, start)
    if end < 0:
        raise ValueError(f"found {BEGIN!r} without {END!r}; fix the file by hand")
    end += len(END)
    if text[end:end + 1] == "\n":
        end += 1
    return text[:start] + text[end:]


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".sitecustomize.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _sitecustomize(site_dir: Optional[Path]) -> Path:
    directory = Path(site_dir or default_site_dir())
    if not directory.is_dir():
        raise FileNotFoundError(f"site directory {directory} does not exist")
    return directory / "sitecustomize.py"


def install_hook(site_dir: Optional[Path] = None) -> Tuple[Path, bool]:
    """Add the block to ``<site_dir>/sitecustomize.py``; returns (path, whether the file changed)."""
    path = _sitecustomize(site_dir)
    existing = path.read_text() if path.exists() else ""
    if BEGIN in existing:
        return path, False
    separator = "" if not existing or existing.endswith("\n") else "\n"
    _write_atomically(path, existing + separator + ("\n" if existing else "") + BLOCK)
    return path, True


def uninstall_hook(site_dir: Optional[Path] = None) -> Tuple[Path, bool]:
    """Remove the block; deletes the file only if nothing else was in it. Returns (path, changed)."""
    path = _sitecustomize(site_dir)
    if not path.exists():
        return path, False
    existing = path.read_text()
    remaining = _without_block(existing)
    if remaining == existing:
        return path, False
    if remaining.strip():
        _write_atomically(path, remaining.rstrip("\n") + "\n")
    else:
        path.unlink()
    return path, True
