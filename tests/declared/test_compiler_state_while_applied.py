"""What the shim changes in torch's compiler while FlashInfer's declared ops are registered, and puts back on revert.

Inductor has no lowering for ``aten.sym_storage_offset``, which a written view of a larger tensor needs under
dynamic shapes (what it fixes: ``test_attention_wrappers.py``, a KV cache of one tensor); torch's graph caches
key a graph by its code, not by the schemas of the ops it calls or by the lowerings. These tests stand in for
torch's states (a fallback Inductor registered before the shim applied, a torch with its own lowering, a torch
that refuses one) by setting torch's tables, never the shim's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fp4_dynamo_shim
from helpers import apply_with

#: Read from torch's source, not from its tables, which the shim changes.
torch_lowers_it_itself = pytest.mark.skipif(
    "aten.sym_storage_offset" in Path(torch.__file__).with_name("_inductor").joinpath("lowering.py").read_text(),
    reason="this torch lowers aten.sym_storage_offset itself: the shim adds nothing")


@torch_lowers_it_itself
def test_while_applied_torchs_compile_caches_tell_the_ops_apart_and_revert_puts_torch_back(monkeypatch):
    """Torch's graph caches key a graph by its code, not by the schemas of the ops it calls, and not by Inductor's
    lowerings: the shim adds a digest of both to torch's cache tag, after the user's own. Its lowering replaces the
    fallback Inductor registers for an op it cannot lower (here as after a compile before the shim applied), and
    revert puts everything back."""
    import torch._inductor.lowering as lowering

    op = torch.ops.aten.sym_storage_offset.default
    fallback = lambda *args: 0  # noqa: E731
    fp4_dynamo_shim.revert()
    monkeypatch.setitem(lowering.lowerings, op, fallback)
    monkeypatch.setattr(lowering, "fallbacks", lowering.fallbacks | {op})
    with torch.compiler.config.patch(cache_key_tag="the user's"):
        status = apply_with(monkeypatch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        assert [line.split(":")[0] for line in status["flashinfer_ops"]["compiler"]] == [
            "torch.compiler.config.cache_key_tag", "torch._inductor.lowering"]
        assert lowering.lowerings[op] is not fallback
        assert torch.compiler.config.cache_key_tag.startswith("the user's|fp4_dynamo_shim:")
        fp4_dynamo_shim.revert()
        assert torch.compiler.config.cache_key_tag == "the user's"
        assert lowering.lowerings[op] is fallback
    monkeypatch.undo()
    assert fp4_dynamo_shim.apply()


@torch_lowers_it_itself
def test_revert_leaves_inductor_without_the_lowering_and_a_tag_the_user_set_since_as_they_are(monkeypatch):
    import torch._inductor.lowering as lowering

    op = torch.ops.aten.sym_storage_offset.default
    fp4_dynamo_shim.revert()
    monkeypatch.delitem(lowering.lowerings, op, raising=False)  # as before Inductor's first compile
    with torch.compiler.config.patch(cache_key_tag=""):
        assert apply_with(monkeypatch, FLASHINFER_OPS="all")["applied"]
        assert op in lowering.lowerings
        torch.compiler.config.cache_key_tag = "the user's, set while applied"
        fp4_dynamo_shim.revert()
        assert op not in lowering.lowerings
        assert torch.compiler.config.cache_key_tag == "the user's, set while applied"
    monkeypatch.undo()
    assert fp4_dynamo_shim.apply()


def test_a_torch_that_lowers_sym_storage_offset_itself_keeps_its_own(monkeypatch):
    import torch._inductor.lowering as lowering

    op = torch.ops.aten.sym_storage_offset.default
    torchs_own = lambda *args: 0  # noqa: E731
    fp4_dynamo_shim.revert()
    monkeypatch.setitem(lowering.lowerings, op, torchs_own)
    monkeypatch.setattr(lowering, "fallbacks", lowering.fallbacks - {op})
    assert apply_with(monkeypatch, FLASHINFER_OPS="all")["applied"]
    assert lowering.lowerings[op] is torchs_own
    monkeypatch.undo()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


@torch_lowers_it_itself
def test_a_lowering_torch_refuses_is_said_in_status_and_the_shim_applies_without_it(monkeypatch, capfd, caplog):
    import torch._inductor.lowering as lowering

    def refuse(*args, **kwargs):
        raise RuntimeError("this torch's register_lowering changed")

    fp4_dynamo_shim.revert()
    op = torch.ops.aten.sym_storage_offset.default
    monkeypatch.setattr(lowering, "register_lowering", refuse)
    status = apply_with(monkeypatch, FLASHINFER_OPS="all")
    assert status["applied"], status["problem"]
    assert "register_lowering changed" in capfd.readouterr().err + caplog.text  # a warning, as well
    assert (
        "fp4_dynamo_shim: the lowering for aten.sym_storage_offset could not be added (RuntimeError: this torch's "
        "register_lowering changed); compiled with Inductor under dynamic shapes, a declared op that writes a view "
        "of a larger tensor (a KV cache of one tensor) may get it at offset 0") in status["flashinfer_ops"]["compiler"]
    monkeypatch.undo()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()  # with the lowering, for the tests after this one
