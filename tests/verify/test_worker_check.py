"""verify's worker-activation check answers what the user's own launch gets in its spawned workers.

A real venv with the project's wheel and SGLang 0.5.9 (its wheel from the index, ``--no-deps``: the check
reads only its installed version, SGLang's dependencies need CUDA). 0.5.9's piecewise CUDA graph traces
``flashinfer.fp4_quantize`` and it loads no plugins, so a plain ``python -m sglang.launch_server`` has no
route to the shim. verify's own import used to export FP4_DYNAMO_SHIM=1 to its probe, which then passed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import venvs

SGLANG = "0.5.9"
VERIFY = ["-m", "fp4_dynamo_shim.verify", "--json", "--device", "cpu"]
#: The check alone, in a process that imported the shim (whose import exports FP4_DYNAMO_SHIM=1).
CHECK = ("import json, fp4_dynamo_shim\nfrom _fp4_dynamo_shim.verify import workers, report\n"
         "print(json.dumps(report.run_check('worker-activation', workers.check_worker_activation, 'cpu').__dict__))")


#: Every test here builds a virtual environment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def with_sglang(tmp_path_factory) -> venvs.Environment:
    root = tmp_path_factory.mktemp("sglang")
    environment = venvs.create(root)
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                                "--prefix", str(root / "env"), f"sglang=={SGLANG}"], capture_output=True, text=True)
    if installed.returncode != 0:
        pytest.skip(f"sglang {SGLANG} could not be installed from the index: {installed.stderr[-300:]}")
    return environment


def worker_check(result) -> dict:
    return {check["name"]: check for check in json.loads(result.stdout)["checks"]}["worker-activation"]


def test_a_plain_launch_without_a_route_fails_on_an_sglang_that_needs_the_shim(with_sglang):
    result = with_sglang.command(VERIFY)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    check = worker_check(result)
    assert check["result"] == "fail", check
    assert "plain launch (this environment): NOT applied" in check["detail"]
    assert "with FP4_DYNAMO_SHIM=1: applied by the package's .pth hook" in check["detail"]
    assert f"sglang {SGLANG} needs the shim in its schedulers (piecewise CUDA graph off unless " in check["detail"]
    assert "and loads no plugins (before 0.5.11)" in check["detail"]
    assert "Start the launch with FP4_DYNAMO_SHIM=1" in check["detail"]


def test_the_check_ignores_the_variable_the_import_exported_here(with_sglang):
    result = with_sglang.run(CHECK)
    check = json.loads(result.stdout.strip().splitlines()[-1])
    assert check["result"] == "fail" and "plain launch (this environment): NOT applied" in check["detail"], check


@pytest.mark.parametrize("value", ["1", "2"])
def test_a_launch_with_the_variable_set_by_the_user_passes_and_a_value_not_understood_fails(with_sglang, value):
    check = json.loads(with_sglang.run(CHECK, env={"FP4_DYNAMO_SHIM": value}).stdout.strip().splitlines()[-1])
    if value == "1":
        assert check["result"] == "pass", check
        assert check["detail"].startswith("plain launch (this environment, FP4_DYNAMO_SHIM='1'): applied by the "
                                          "package's .pth hook")
    else:
        assert check["result"] == "fail", check
        assert "FP4_DYNAMO_SHIM='2' (not understood)): NOT applied" in check["detail"]


def test_after_install_hook_a_plain_launch_passes(with_sglang):
    script = with_sglang.root / "env" / "bin" / "fp4-dynamo-shim"
    assert with_sglang.command([str(script), "install-hook"]).returncode == 0
    try:
        check = json.loads(with_sglang.run(CHECK).stdout.strip().splitlines()[-1])
    finally:
        assert with_sglang.command([str(script), "uninstall-hook"]).returncode == 0
    assert check["result"] == "pass", check
    assert check["detail"].startswith("plain launch (this environment, an always-on hook (")
    assert "): applied by install-hook's always-on .pth" in check["detail"]
