"""Two things of the declared layer a compiled model meets whatever FlashInfer function it calls: the op names, which
stay the same whichever declarations a gate registers, and FlashInfer's own log-once lines on traced paths."""

from __future__ import annotations

import flashinfer.jit.core
import pytest
import torch
import torch._dynamo

import fp4_dynamo_shim
from helpers import apply_with


def test_an_op_name_two_declarations_share_is_qualified_by_each_ones_getter(monkeypatch):
    """trtllm-gen decode's and batch prefill's run functions are both ``paged_run`` (names FlashInfer computes at run
    time): neither takes the bare name by being built first, so an op's name does not depend on what else the gate
    turned on."""
    layer = apply_with(monkeypatch, FLASHINFER_OPS="all")["flashinfer_ops"]
    registered = layer["registered"]
    if "flashinfer.decode.get_trtllm_gen_decode_module.paged_run" not in registered:
        pytest.skip("this release has no trtllm-gen decode module")
    assert registered["flashinfer.decode.get_trtllm_gen_decode_module.paged_run"] == \
        "fp4_dynamo_shim_flashinfer::trtllm_gen_decode_paged_run"
    assert registered["flashinfer.prefill.get_batch_prefill_module.paged_run"] == \
        "fp4_dynamo_shim_flashinfer::batch_prefill_paged_run"
    assert not any(op.endswith("::paged_run") for op in registered.values())


def _notice(x):
    flashinfer.jit.core.logger.warning_once("a FlashInfer notice on a traced path")
    return x + 1


def test_flashinfers_log_once_lines_are_skipped_in_compiled_code_and_refused_again_after_revert(monkeypatch):
    """Dynamo refuses a logger's methods in traced code (FlashInfer's trtllm MoE logs a deprecation on its default
    path); while the layer is in force they are skipped there, and status() says so."""
    layer = apply_with(monkeypatch, FLASHINFER_OPS="all")["flashinfer_ops"]
    assert "flashinfer.jit.core.FlashInferJITLogger.warning_once (skipped in compiled code)" in layer["helpers"]
    assert torch.equal(torch.compile(_notice, fullgraph=True, backend="eager")(torch.ones(2)), torch.full((2,), 2.0))
    assert fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    try:
        with pytest.raises(torch._dynamo.exc.Unsupported, match="logging.Logger"):
            torch.compile(_notice, fullgraph=True, backend="eager")(torch.ones(2))
    finally:
        assert fp4_dynamo_shim.apply()


def test_with_the_layer_off_flashinfers_log_lines_are_left_to_dynamo(monkeypatch):
    layer = apply_with(monkeypatch, FLASHINFER_OPS="off")["flashinfer_ops"]
    assert not any("FlashInferJITLogger" in helper for helper in (layer or {}).get("helpers", ()))
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="logging.Logger"):
        torch.compile(_notice, fullgraph=True, backend="eager")(torch.ones(2))
