"""The GPU harness works on a fresh machine: its scripts build what they promise and name only files that exist.

The GPU tests themselves run on the GPU machine; these run here, because a harness that fails on a fresh
machine is found only when GPU minutes are already being spent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_gpu_harness_path_the_project_names_exists():
    named = set()
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("tests/**/*.sh"), *ROOT.glob("tools/gpu/**/*.py"),
                 *ROOT.glob("tools/gpu/**/*.sh"), *ROOT.glob("docs/*.md"), ROOT / "README.md"]:
        if ".venv" not in path.parts and "mutation" not in path.parts:  # mutations name broken paths on purpose
            named.update(re.findall(r"(?:tests|tools)/gpu/[A-Za-z0-9_./-]*[A-Za-z0-9_]", path.read_text()))
    assert named
    assert sorted(name for name in named if not (ROOT / name).exists()) == []


def test_every_project_module_a_gpu_test_imports_is_on_the_gpu_runs_path():
    """The GPU run puts tests/gpu, tests/gpu/engine and tests/support on the path (pyproject, conftest), nothing
    under tools/: a GPU test importing a helper that moved there fails at collection, on the GPU machine only
    (tests/gpu/conftest.py skips collecting them here)."""
    import ast

    on_path = {path.stem for folder in ("tests/gpu", "tests/gpu/engine", "tests/support") for path in (ROOT / folder).glob("*.py")}
    elsewhere = {path.stem for path in ROOT.glob("tools/**/*.py")} | {path.stem for path in ROOT.glob("benchmarks/*.py")}
    missing = []
    for path in ROOT.glob("tests/gpu/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            missing += [f"{path.relative_to(ROOT)}: {name}" for name in names
                        if name.split(".")[0] in elsewhere and name.split(".")[0] not in on_path]
    assert missing == []


@pytest.mark.slow
def test_fetch_shim_builds_the_wheel_in_a_fresh_venv_with_only_pip(tmp_path):
    """No setuptools, no wheel package: the build gets its backend from the index (build isolation)."""
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools", "wheel"], capture_output=True)
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert [line.split("==")[0].lower() for line in listed.split()] == ["pip"]
    copy = tmp_path / "checkout"  # the project's files without what was built or carried here
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist"))
    path = f"{environment / 'bin'}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(["bash", "tools/gpu/fetch.sh", "shim"], cwd=copy, capture_output=True, text=True,
                            env={**os.environ, "PATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [p.name for p in (copy / ".ourwheel").glob("fp4_dynamo_shim-*.whl")], result.stdout


def test_graph_break_count_counts_each_logged_break_once_at_the_place_dynamo_names():
    """Lines as TORCH_LOGS=graph_breaks wrote them on the H200 (SGLang 0.5.14, FlashInfer attention): each break's
    explanation and hints say "graph break" again, and a counter that matched those counted 98 breaks for 31."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("graph_breaks", ROOT / "tools" / "gpu" / "graph_breaks.py")
    graph_breaks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph_breaks)
    prefix = "[rank0]:V1203 16:00:17.863000 4281 torch/_dynamo/symbolic_convert.py:5127]"
    log = "\n".join(f"{prefix} [{frame}] [__graph_breaks] {text}" for frame, text in [
        ("13/0", "Graph break in user code at /tmp/site14/flashinfer/decode.py:269"),
        ("13/0", "Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call"),
        ("13/0", " For more details about this graph break, please visit: https://meta-pytorch.github.io/gb0156"),
        ("14/0", "Graph break (user stack suppressed due to duplicate graph break) in user code at "
                 "/tmp/site14/flashinfer/decode.py:269"),
        ("10/0", "Graph break (user stack suppressed due to duplicate graph break) in user code at "
                 "/opt/torch/site-packages/torch/_dynamo/polyfills/__init__.py:528"),
        ("2/0", "*** While handling this graph break, another graph break occurred: ***"),
        ("2/0", "  File \"/tmp/site14/flashinfer/decode.py\", line 269, in run_batch_decode"),
    ])
    run = {"log_text": "Capturing batches (bs=2):  33%|" + log, "schedulers": [{"shim": {"applied": True}}]}
    summary = graph_breaks.summarise(run)
    assert summary["breaks_at"] == {"/tmp/site14/flashinfer/decode.py:269": 2,
                                    "/opt/torch/site-packages/torch/_dynamo/polyfills/__init__.py:528": 1}
    assert (summary["graph_breaks"], summary["flashinfer_breaks"]) == (3, 2)


def test_a_greedy_difference_is_reported_where_it_starts_with_both_runs_best_two_logprobs():
    """Under --enable-torch-compile a shim-compiled decode step fuses differently from one broken at every
    FlashInfer call; a differing greedy id then needs its margin beside it to tell a near tie from a wrong result."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("graph_breaks", ROOT / "tools" / "gpu" / "graph_breaks.py")
    graph_breaks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph_breaks)
    baseline = {"output_ids": [[5, 6, 7], [1, 2, 3]],
                "top_logprobs": [[[[-1.0, 5]]] * 3, [[[-0.5, 1]], [[-0.69, 2], [-0.70, 9]], [[-0.1, 3]]]]}
    case = {"output_ids": [[5, 6, 7], [1, 9, 4]],
            "top_logprobs": [[[[-1.0, 5]]] * 3, [[[-0.5, 1]], [[-0.69, 9], [-0.70, 2]], [[-0.2, 4]]]]}
    assert graph_breaks.first_difference(case, baseline) == {
        "prompt": 1, "position": 1, "token": 9, "baseline_token": 2,
        "top_logprobs": [[[-0.69, 9], [-0.70, 2]]], "baseline_top_logprobs": [[[-0.69, 2], [-0.70, 9]]]}
    assert graph_breaks.first_difference(baseline, baseline) is None
