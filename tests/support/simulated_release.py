"""A FlashInfer release this machine's registry does not have, made from the installed one.

The registry stops at the newest tested release, so a newer one is simulated: a copy of the installed package
(a tree of links, with real copies of the files a test edits) and a ``flashinfer_python-<version>.dist-info`` that
says the new number, in a folder put first on ``PYTHONPATH``. What it cannot show: a real newer release's
other changes (new kernels, new dependencies); the slow tier installs a rebuilt wheel to show pip's side.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

from helpers import SRC

INSTALLED = Path(importlib.util.find_spec("flashinfer").submodule_search_locations[0])
TESTED = importlib.metadata.version("flashinfer-python")


def _link_tree(source: Path, target: Path, edits: Dict[Path, Callable[[str], str]]) -> None:
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name == "__pycache__":
            continue
        inside = {path.relative_to(entry.name): edit for path, edit in edits.items() if path.parts[0] == entry.name}
        if not inside:
            (target / entry.name).symlink_to(entry)
        elif Path(".") in inside:  # the file itself is edited
            (target / entry.name).write_text(inside[Path(".")](entry.read_text()))
        else:
            _link_tree(entry, target / entry.name, inside)


def make(root: Path, version: str, edits: Optional[Dict[str, Callable[[str], str]]] = None) -> Path:
    """A folder holding FlashInfer ``version``: the installed package with ``edits`` (path inside the package ->
    a function of the file's text) applied. Returns the folder to put first on PYTHONPATH."""
    edits = {Path("_build_meta.py"): lambda text: re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', text),
             **{Path(path): edit for path, edit in (edits or {}).items()}}
    _link_tree(INSTALLED, root / "flashinfer", edits)
    installed_meta = Path(importlib.metadata.distribution("flashinfer-python")._path)
    meta = root / f"flashinfer_python-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}",
                                          (installed_meta / "METADATA").read_text()))
    shutil.copy(installed_meta / "top_level.txt", meta) if (installed_meta / "top_level.txt").exists() else None
    return root


def replace(old: str, new: str, count: int = 1) -> Callable[[str], str]:
    """An edit that must find ``old`` (a test whose edit no longer applies fails rather than testing nothing)."""
    def edit(text: str) -> str:
        assert old in text, f"the edit's anchor is not in the installed release: {old!r}"
        return text.replace(old, new, count)

    return edit


#: Prints, as JSON: status(), whether each public name is the shim's, the warnings, and apply's exception.
PROBE = """
import io, json, logging, sys
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.WARNING, format="%(message)s")
import flashinfer, flashinfer.jit.cpp_ext as cpp_ext
error = None
try:
    import fp4_dynamo_shim  # applies, or raises under FP4_DYNAMO_SHIM_STRICT=1
except Exception as raised:
    error = f"{type(raised).__name__}: {raised}"
from _fp4_dynamo_shim import lifecycle
def shim(value):
    return getattr(value, "__fp4_dynamo_shim__", False) is True or "fp4_dynamo_shim" in getattr(value, "__module__", "")
names = {name: shim(getattr(flashinfer, name, None)) for name in ("fp4_quantize", "nvfp4_quantize", "mxfp4_quantize",
         "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float", "mm_fp4")}
names["get_cuda_version"] = shim(cpp_ext.get_cuda_version)
print(json.dumps({"status": lifecycle.status(), "shim": names, "error": error,
                  "warnings": [line for line in stream.getvalue().splitlines() if line.strip()]}))
"""


def run(folder: Path, arguments: list, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """``python *arguments`` in a fresh interpreter that finds the release in ``folder`` first."""
    import os

    environment = {key: value for key, value in os.environ.items() if not key.startswith("FP4_DYNAMO_SHIM")}
    environment.update(env or {})
    environment["PYTHONPATH"] = os.pathsep.join([str(folder), SRC])
    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=900, env=environment)


def probe(folder: Path, env: Optional[dict] = None, code: str = PROBE) -> dict:
    """Run ``code`` there; its last line as JSON."""
    completed = run(folder, ["-c", code], env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])
