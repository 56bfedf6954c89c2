"""Where the shim's start-up files live for this interpreter, and which of them it has: read only.

``activation.site_files`` writes and removes them (``install-hook`` / ``uninstall-hook``); ``status()`` and the
export to spawned children read them here.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

from . import switches

PACKAGE_PTH = "fp4_dynamo_shim.pth"
HOOK_PTH = "fp4_dynamo_shim_hook.pth"
#: The marks around the block ``install-hook`` writes into a sitecustomize.py.
BEGIN = "# >>> fp4-dynamo-shim import hook >>>"
END = "# <<< fp4-dynamo-shim import hook <<<"


def site_dirs() -> List[Path]:
    """Directories whose ``.pth`` files this interpreter processes at start-up."""
    candidates = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    seen = []
    for candidate in candidates:
        path = Path(candidate)
        if path.is_dir() and path.resolve() not in [p.resolve() for p in seen]:
            seen.append(path)
    return seen


def default_site_dir() -> Path:
    """The site-packages directory of the running interpreter (the venv's, inside a venv)."""
    directories = site_dirs()
    return directories[0] if directories else Path(sysconfig.get_paths()["purelib"])


def find_in_site_dirs(name: str) -> Optional[str]:
    for directory in site_dirs():
        if (directory / name).is_file():
            return str(directory / name)
    return None


def sitecustomize_origin() -> Optional[str]:
    """The file ``import sitecustomize`` loads in this interpreter (the first on sys.path)."""
    loaded = sys.modules.get("sitecustomize")
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec("sitecustomize")
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
    return origin


def calls_hook(path) -> bool:
    """Whether a sitecustomize file starts the hook: install-hook's block, or a line written by hand
    (the documented one-liner, ``ONE_LINER``, or any other call of ``fp4_dynamo_shim_hook.install``)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return False
    return BEGIN in text or "fp4_dynamo_shim_hook.install(" in text


def installed_routes() -> dict:
    """Which start-up routes exist for this interpreter, by file (None where absent)."""
    sitecustomize = sitecustomize_origin()
    runs_hook = bool(sitecustomize) and calls_hook(sitecustomize)
    blocks = [str(d / "sitecustomize.py") for d in site_dirs() if calls_hook(d / "sitecustomize.py")]
    return {
        "pth": find_in_site_dirs(PACKAGE_PTH),
        "hook_pth": find_in_site_dirs(HOOK_PTH),
        "sitecustomize": sitecustomize if runs_hook else None,
        # A hook this interpreter never runs, because another sitecustomize comes first on sys.path.
        "sitecustomize_shadowed_by": sitecustomize if blocks and not runs_hook else None,
    }


def children(exported: bool = False) -> dict:
    """``status()["children"]``: the variable a spawned child starts with, and whether the import set it."""
    return {switches.HOOK: os.environ.get(switches.HOOK), "exported_by_import": exported}
