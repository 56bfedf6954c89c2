"""Installing the shim where FlashInfer is newer than the tested range keeps that FlashInfer, and the shim works there.

The registry here stops at the newest tested release, so the newer release is that release's real wheel rebuilt
with metadata that says 0.7.9 (its files unchanged but ``_build_meta.py``'s version). pip resolves the project's
dependencies against the environment with no index: a requirement the installed FlashInfer does not meet fails
to resolve, as an upper bound on flashinfer-python would.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import venvs

NEWER = "0.7.9"
pytestmark = [pytest.mark.slow, pytest.mark.release_independent]


def rebuilt_wheel(wheel: Path, version: str, into: Path) -> Path:
    """``wheel`` as release ``version``: its dist-info renamed, METADATA, RECORD and ``_build_meta.py`` rewritten."""
    old = re.match(r"flashinfer_python-([^-]+)-", wheel.name).group(1)
    target = into / wheel.name.replace(f"-{old}-", f"-{version}-")
    records = []
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as rebuilt:
        for info in source.infolist():
            name = info.filename.replace(f"flashinfer_python-{old}.dist-info", f"flashinfer_python-{version}.dist-info")
            if name.endswith(".dist-info/RECORD"):
                record_name = name
                continue
            data = source.read(info)
            if name.endswith(".dist-info/METADATA"):
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data)
            elif name == "flashinfer/_build_meta.py":
                data = re.sub(rb'__version__ = "[^"]*"', f'__version__ = "{version}"'.encode(), data)
            rebuilt.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")
        rebuilt.writestr(record_name, "\n".join(records + [f"{record_name},,"]) + "\n")
    return target


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    """A venv whose dependencies are this one's, but FlashInfer: 0.7.9 there, installed from the rebuilt wheel."""
    root = tmp_path_factory.mktemp("newer-flashinfer")
    tested = importlib.metadata.version("flashinfer-python")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(root / "download"),
                    f"flashinfer-python=={tested}"], check=True, capture_output=True)
    (wheel,) = (root / "download").glob("flashinfer_python-*.whl")
    newer = rebuilt_wheel(wheel, NEWER, root)
    env = venvs.create(root, with_project=False, dependencies=venvs.dependency_paths_without(root, "flashinfer"))
    # --no-compile: pip byte-compiles all of FlashInfer otherwise (0.7.4: 30 s against 7 s without); the tests
    # import a few of its modules
    pip = [sys.executable, "-m", "pip", "--python", str(env.python), "install", "-q", "--no-index", "--no-compile"]
    subprocess.run(pip + ["--no-deps", str(newer)], check=True, capture_output=True)
    wheels = root / "wheels"
    with venvs.building_in_the_project():
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(wheels), str(venvs.PROJECT)], check=True, capture_output=True)
    installed = subprocess.run(pip + ["--find-links", str(wheels), "fp4-dynamo-shim"], capture_output=True, text=True)
    return env, installed


def test_pip_install_of_the_shim_keeps_the_newer_flashinfer(environment):
    env, installed = environment
    assert installed.returncode == 0, installed.stderr  # no upper bound to resolve against
    found = env.run("import importlib.metadata as m; print(m.version('flashinfer-python'))").stdout.strip()
    assert found == NEWER


def test_the_shim_applies_there_untested_and_verify_says_so(environment):
    env, installed = environment
    assert installed.returncode == 0, installed.stderr
    status = env.run("import json, fp4_dynamo_shim; print(json.dumps(fp4_dynamo_shim.status()))")
    assert '"applied": true' in status.stdout and f'"version": "{NEWER}", "tested": false' in status.stdout, status
    verify = env.command(["-m", "fp4_dynamo_shim.verify"], timeout=900)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    assert f"FlashInfer {NEWER} is newer than the tested range" in verify.stdout
    assert "13 of 13 parts match 0.7.4's" in verify.stdout


def test_strict_mode_there_raises_apply_error_naming_the_release(environment):
    env, installed = environment
    assert installed.returncode == 0, installed.stderr
    strict = env.run("import fp4_dynamo_shim", env={"FP4_DYNAMO_SHIM_STRICT": "1"})
    assert strict.returncode != 0 and "ApplyError" in strict.stderr and f"flashinfer-python {NEWER}" in strict.stderr
