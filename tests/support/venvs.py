"""Build a real virtual environment with this project installed from its wheel.

Used by tests/activation/test_activation.py and benchmarks/startup.py: the .pth import hook, the entry point and
the console script only exist in an installed copy. Dependencies (torch, flashinfer, wrapt) come from
the running environment through a path-only .pth, so nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
#: Whether the running test may build an environment: tests/conftest.py allows it for tests marked ``slow``
#: only, the tier the README's quick test command leaves out (a venv and a wheel cost seconds each).
building_allowed = True


class NotInTheSlowTier(RuntimeError):
    """A test builds a virtual environment but is not marked ``@pytest.mark.slow``."""


class Environment:
    def __init__(self, root: Path):
        self.root = root
        self.python = root / "env" / "bin" / "python"
        self.site = Path(self.run("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())

    def run(self, code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        return self.command(["-c", code], env, timeout)

    def command(self, arguments: list, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        """``python *arguments`` in this environment, with a minimal environment of its own plus ``env``."""
        environment = {"PATH": f"{self.python.parent}:/usr/bin:/bin", "HOME": str(self.root), **(env or {})}
        return subprocess.run([str(self.python), *arguments], capture_output=True, text=True, timeout=timeout,
                              env=environment, cwd=self.root)


@contextlib.contextmanager
def building_in_the_project():
    """One build of the project at a time, across pytest-xdist's workers: setuptools writes ``build/`` and
    ``src/*.egg-info`` inside the project, and two builds at once failed there."""
    key = hashlib.sha1(str(PROJECT).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"fp4-dynamo-shim-build-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def create(root: Path, with_project: bool = True, python: str = sys.executable, editable: bool = False,
           dependencies: list | None = None) -> Environment:
    """A venv at ``root/env`` made by ``python``; with ``with_project`` this project is installed into it,
    from its wheel or (``editable``) as ``pip install -e`` does it, build isolation and all. ``dependencies``:
    the folders its ``dependencies.pth`` names (this environment's site directories by default)."""
    if not building_allowed:
        raise NotInTheSlowTier("this test builds a virtual environment: mark it @pytest.mark.slow (the README's "
                               "test command leaves that tier to CI)")
    if python == sys.executable:
        venv.create(root / "env", with_pip=False)
    else:  # another interpreter (a Debian system Python): its own venv module
        subprocess.run([python, "-m", "venv", "--without-pip", str(root / "env")], check=True, capture_output=True)
    if with_project and editable:
        # --ignore-installed: without it pip first uninstalls the copy in the running environment.
        with building_in_the_project():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                            "--prefix", str(root / "env"), "-e", str(PROJECT)], check=True, capture_output=True)
    elif with_project:
        wheel = os.environ.get("FP4_DYNAMO_SHIM_TEST_WHEEL")  # prebuilt, where this machine cannot build one
        if not wheel:
            wheels = root / "wheels"
            with building_in_the_project():
                subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                                "-w", str(wheels), str(PROJECT)], check=True, capture_output=True)
            (wheel,) = wheels.glob("fp4_dynamo_shim-*.whl")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
                        "--prefix", str(root / "env"), str(wheel)], check=True, capture_output=True)
    environment = Environment(root)
    # Dependencies: appended after the venv's own site-packages (.pth files there are not run). The running
    # environment may hold an installed copy of this project too, so the file sorts after setuptools'
    # "__editable__.*.pth" (the editable source must come first on sys.path, or the test runs that copy)
    # and before fp4_dynamo_shim.pth (a real install has wrapt in place before the hook runs).
    paths = dependency_paths() if dependencies is None else dependencies
    (environment.site / "dependencies.pth").write_text("".join(f"{path}\n" for path in paths))
    found = environment.run("import fp4_dynamo_shim_hook; print(fp4_dynamo_shim_hook.__file__)").stdout.strip()
    if with_project and not found.startswith(str(PROJECT / "src") if editable else str(environment.site)):
        raise RuntimeError(f"the venv at {root} imports the project from {found}, not from its own install")
    return environment


def dependency_paths() -> list:
    """The running interpreter's site directories and PYTHONPATH entries, without this project's source."""
    source = str(PROJECT / "src")
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    site_dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    paths = []
    for path in extra + site_dirs:
        if path and os.path.isdir(path) and os.path.abspath(path) != source and path not in paths:
            paths.append(path)
    return paths


def dependency_paths_without(root: Path, prefix: str) -> list:
    """One folder of links to everything in this environment's site directories but the distributions whose
    names start with ``prefix`` (and this project): dependencies for a venv that installs its own of those."""
    folder = root / f"dependencies-without-{prefix}"
    folder.mkdir()
    skip = (prefix.lower(), "fp4_dynamo_shim", "fp4-dynamo-shim", "_fp4_dynamo_shim", "__editable__")
    for path in dependency_paths():
        for entry in Path(path).iterdir():
            if not entry.name.lower().startswith(skip) and not entry.name.endswith(".pth") \
                    and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return [str(folder)]


def passthrough_environment() -> dict:
    """What a child interpreter needs from this one (CUDA, FlashInfer's settings), but not PYTHONPATH."""
    keep = ("PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "TMPDIR")
    return {k: v for k, v in os.environ.items() if k in keep or k.startswith(("FLASHINFER_", "MAX_JOBS"))}


#: A parent that imports neither torch nor the shim and starts one *spawn* child (as SGLang starts its
#: workers); the child imports flashinfer and reports whether fp4_quantize is the shim and how it traces
#: (on the device named by FP4_DYNAMO_SHIM_TEST_DEVICE, CPU by default). Prints the child's JSON.
SPAWN_PARENT = """
import json, multiprocessing, os, sys

def child(queue):
    import flashinfer, torch
    from flashinfer import fp4_quantize
    patched = getattr(fp4_quantize, "__fp4_dynamo_shim__", False)
    result = {"patched": patched, "shim_imported": "_fp4_dynamo_shim.lifecycle" in sys.modules}
    if patched:
        device = os.environ.get("FP4_DYNAMO_SHIM_TEST_DEVICE", "cpu")
        x = torch.randn(16, 128, dtype=torch.bfloat16, device=device)
        torch._dynamo.mark_dynamic(x, 0)
        explanation = torch._dynamo.explain(lambda t, s: fp4_quantize(t, s))(x, torch.tensor([1.0], device=device))
        result.update(graphs=explanation.graph_count, breaks=explanation.graph_break_count)
    queue.put(result)

if __name__ == "__main__":
    assert "fp4_dynamo_shim" not in sys.modules and "torch" not in sys.modules
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    print(json.dumps(queue.get(timeout=500)))
    process.join()
"""
