"""What the shim and verify change in the user's own process while they work, they put back: a user who runs
verify in a notebook, or applies the shim in a server that configured its logging, finds the process as it was.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

import fp4_dynamo_shim
import fp4_dynamo_shim.verify

#: The logger the declared layer quiets while torch infers a schema (infer_schema warns before it raises).
TORCH_SCHEMA_LOGGER = "torch._library.opaque_object"


def _loggers():
    return {name: logging.getLogger(name).level for name in ("fp4_dynamo_shim", "torch", TORCH_SCHEMA_LOGGER)}


@pytest.mark.slow  # verify's worker check starts two interpreters
def test_verify_leaves_the_environment_the_main_module_and_logging_as_it_found_them(monkeypatch, capsys):
    """The worker check starts its probes from a changed ``os.environ`` and ``__main__`` (spawned children copy
    them); after verify, the user's variables are theirs again. FP4_DYNAMO_SHIM is unset here, as where a start-up
    hook applied the shim (nothing exported): the probe started with FP4_DYNAMO_SHIM=1 must not leave it behind."""
    monkeypatch.delenv("FP4_DYNAMO_SHIM", raising=False)
    monkeypatch.setenv("SOMETHING_OF_THE_USERS", "kept")
    monkeypatch.setenv("FP4_DYNAMO_SHIM_FALLBACK", "reference")
    for name in _loggers():
        monkeypatch.setattr(logging.getLogger(name), "level", logging.INFO)  # the user's choice
    environment, main, loggers = dict(os.environ), sys.modules["__main__"], _loggers()

    code = fp4_dynamo_shim.verify.main(["--json", "--device", "cpu"])

    checks = {check["name"]: check["result"] for check in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["worker-activation"] in ("pass", "fail") and code in (0, 1)  # the probes were started
    assert dict(os.environ) == environment
    assert sys.modules["__main__"] is main
    assert _loggers() == loggers


def test_applying_leaves_torchs_logging_as_the_user_set_it(applied_with, monkeypatch):
    """Every declared op's schema is inferred while its logger is quieted; the level the user chose comes back,
    whatever it was (DEBUG here, to see every record torch has to say)."""
    logger = logging.getLogger(TORCH_SCHEMA_LOGGER)
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    status = applied_with(FLASHINFER_OPS="all")
    assert status["applied"] and status["flashinfer_ops"]["registered"], status["problem"]
    assert logger.level == logging.DEBUG
    fp4_dynamo_shim.revert()
    assert logger.level == logging.DEBUG
