"""The start-up routes to the import hook: ``install-hook`` / ``uninstall-hook`` write and remove them (where
they are, and which this interpreter has, is ``startup_files``).

Three files can start the hook (``fp4_dynamo_shim_hook``) when an interpreter starts:

* ``fp4_dynamo_shim.pth``, shipped with the package (wheel and editable installs): only with
  ``FP4_DYNAMO_SHIM=1``;
* ``fp4_dynamo_shim_hook.pth``, written by ``install-hook`` into a site directory: always. A ``.pth`` runs
  wherever site directories are processed, whatever ``sitecustomize`` the interpreter has (Debian and
  Ubuntu ship one in ``/usr/lib/python3.X`` that shadows a venv's);
* a marked block in ``sitecustomize.py``, written by ``install-hook`` into a directory that is not a site
  directory (``pip install --target`` onto ``PYTHONPATH``), where ``.pth`` files are never read.

``install-hook`` proves the route it wrote by starting an interpreter and looking for the hook there; when
the hook does not run, it takes the file back out and says which file is in the way. All logic stays in
``fp4_dynamo_shim_hook``; the files only call it, the way OpenTelemetry's sitecustomize does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from ..startup_files import BEGIN, END, HOOK_PTH, default_site_dir, site_dirs

#: One line (site.py runs a .pth line that starts with "import"). The package may be uninstalled before the
#: hook is: then the hook module is missing and the line does nothing, silently; any other failure is
#: reported by site.py as usual.
HOOK_PTH_TEXT = ("import sys; exec(\"try:\\n    import fp4_dynamo_shim_hook\\nexcept ModuleNotFoundError as missing:\\n"
                 "    if missing.name != 'fp4_dynamo_shim_hook':\\n        raise\\n"
                 "else:\\n    fp4_dynamo_shim_hook.install('install-hook')\")\n")
BLOCK = f"""{BEGIN}
# Applies fp4_dynamo_shim whenever flashinfer is imported. Written by `fp4-dynamo-shim install-hook`;
# remove with `fp4-dynamo-shim uninstall-hook` (before `pip uninstall fp4-dynamo-shim`; once the package is
# gone this block does nothing). FP4_DYNAMO_SHIM_DISABLE=1 turns it off.
try:
    import fp4_dynamo_shim_hook
    fp4_dynamo_shim_hook.install()
except Exception as _fp4_dynamo_shim_error:
    if getattr(_fp4_dynamo_shim_error, "name", None) != "fp4_dynamo_shim_hook":
        import sys
        sys.stderr.write("fp4_dynamo_shim import hook in %s: %r\\n" % (__file__, _fp4_dynamo_shim_error))
{END}
"""
#: The documented one-liner, for writing sitecustomize.py by hand.
ONE_LINER = "import fp4_dynamo_shim_hook; fp4_dynamo_shim_hook.install()"


class HookNotRunning(RuntimeError):
    """The route was written but a new interpreter does not run it; the message names the file in the way."""


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
    """Replace ``path`` in one step, keeping its permission bits; a new file gets what ``open`` would give it
    (mkstemp's own 0600 would hide a hook that root installs from every other user's interpreter)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclasses.dataclass(frozen=True)
class Installed:
    path: Path
    changed: bool
    route: str  # "pth" or "sitecustomize"


def _is_site_dir(directory: Path) -> bool:
    return directory.resolve() in [d.resolve() for d in site_dirs()]


_PROBE = ("import importlib.util, json, sys; hook = sys.modules.get('_fp4_dynamo_shim.activation.startup'); "
          "spec = importlib.util.find_spec('sitecustomize'); "
          "print(json.dumps([getattr(hook, 'route', None), spec.origin if spec else None]))")


def _probe(directory: Path, route: str) -> tuple:
    """(the hook's route, the sitecustomize file) in a fresh interpreter with this environment; a
    sitecustomize directory that is not a site directory is put on PYTHONPATH, as it will be where that
    route is used (``pip install --target``)."""
    environment = dict(os.environ)
    environment.pop("FP4_DYNAMO_SHIM", None)  # the package's own .pth must not pass for the new route
    # The kill switch makes a running hook do nothing, which looks like no hook at all; the CLI says it is set.
    environment.pop("FP4_DYNAMO_SHIM_DISABLE", None)
    if route == "sitecustomize" and not _is_site_dir(directory):
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(directory), environment.get("PYTHONPATH")) if p)
    # Another start-up file may print anything, in any encoding: only the probe's own last line is read.
    completed = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, errors="replace",
                               env=environment, timeout=120)
    if completed.returncode != 0:
        return None, None
    return tuple(json.loads(completed.stdout.strip().splitlines()[-1]))


def install_hook(site_dir: Optional[Path] = None, sitecustomize: bool = False, check: bool = True) -> Installed:
    """Install the always-on hook: ``fp4_dynamo_shim_hook.pth`` in a site directory, or the sitecustomize
    block elsewhere (or when ``sitecustomize`` is asked for). With ``check``, a fresh interpreter must run it,
    else the file is taken back out and :class:`HookNotRunning` names what is in the way."""
    directory = Path(site_dir or default_site_dir())
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    route = "sitecustomize" if sitecustomize or not _is_site_dir(directory) else "pth"
    if route == "pth":
        path, existing = directory / HOOK_PTH, None
        changed = not path.exists() or path.read_text() != HOOK_PTH_TEXT
        if changed:
            _write_atomically(path, HOOK_PTH_TEXT)
    else:
        path = directory / "sitecustomize.py"
        existing = path.read_text() if path.exists() else ""
        changed = BEGIN not in existing
        if changed:
            separator = "" if not existing or existing.endswith("\n") else "\n"
            _write_atomically(path, existing + separator + ("\n" if existing else "") + BLOCK)
    if check:
        try:
            hook_route, origin = _probe(directory, route)
        except (subprocess.TimeoutExpired, ValueError, IndexError) as error:
            if changed:
                _undo(path, route, existing)
            raise HookNotRunning(f"wrote the hook to {path}, but could not check that a new interpreter runs it "
                                 f"({type(error).__name__}: {error}); took it back out.") from error
        if hook_route is None:
            if changed:
                _undo(path, route, existing)
            raise HookNotRunning(_why_not_running(path, route, origin))
    return Installed(path, changed, route)


def _undo(path: Path, route: str, existing: Optional[str]) -> None:
    if route == "pth" or not existing:
        path.unlink()
    else:
        _write_atomically(path, existing)


def _why_not_running(path: Path, route: str, origin: Optional[str]) -> str:
    if route == "sitecustomize" and origin and Path(origin).resolve() != path.resolve():
        return (f"wrote the hook to {path}, but this interpreter imports {origin} as sitecustomize (it comes "
                f"first on sys.path), so the hook would never run; took it back out. Install the .pth route "
                f"instead: `fp4-dynamo-shim install-hook` (into this interpreter's site-packages), or "
                f"`--site-dir` a site directory.")
    return (f"wrote the hook to {path}, but a new interpreter does not run it (site directories processed: "
            f"{', '.join(map(str, site_dirs())) or 'none'}; sitecustomize: {origin}); took it back out.")


def uninstall_hook(site_dir: Optional[Path] = None) -> List[Path]:
    """Remove what ``install-hook`` wrote in ``site_dir`` (its .pth, its sitecustomize block; the file
    itself only if nothing else was in it). Returns the files changed."""
    directory = Path(site_dir or default_site_dir())
    path = directory / "sitecustomize.py"
    existing = path.read_text() if path.exists() else None
    try:  # before anything is removed: a block that cannot be taken out leaves both files as they are
        remaining = _without_block(existing) if existing is not None else None
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    changed = []
    pth = directory / HOOK_PTH
    if pth.exists():
        pth.unlink()
        changed.append(pth)
    if existing is not None:
        if remaining != existing:
            if remaining.strip():
                _write_atomically(path, remaining.rstrip("\n") + "\n")
            else:
                path.unlink()
            changed.append(path)
    return changed
