"""A getter's polyfill (``declared/build.py``'s ``getter``), built from a module written like FlashInfer's
sampling module: what Dynamo traces in place of ``get_module(kind)`` returns a namespace whose declared entries
call the shim's ops (under the key the getter computes), whose other entries refuse by name, and which
``revert`` disarms; the declarations it cannot build say why.

The layer's tests reach this only through the installed release's getters, where every member builds and
every entry is declared; the cases below (an unbuildable member, an undeclared entry, a getter that is not
a module attribute, a namespace the scan could not read) occur in some releases and not in others. The
module is executed source text with no-op decorators, as FlashInfer's are when its custom ops are off; the
ops are real, in a fragment of the shim's namespace that each test destroys.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from _fp4_dynamo_shim.declared import build
from _fp4_dynamo_shim.declared import codegen
from _fp4_dynamo_shim.declared.codegen import NotExpressibleError

import flashinfer_like
from flashinfer_like import NO_OP_DECORATORS


SOURCE = NO_OP_DECORATORS + '''
@functools.cache
def get_module(kind: str = "silu"):
    fname = f"{kind}_PREFIX"

    @register_custom_op(f"flashinfer::{fname}", mutates_args=())
    def _op(x: torch.Tensor, offset: float = 1.0) -> torch.Tensor:
        return x + offset

    @register_fake_op(f"flashinfer::{fname}")
    def _fake_op(x: torch.Tensor, offset: float = 1.0) -> torch.Tensor:
        return torch.empty_like(x)

    @register_custom_op("flashinfer::PREFIX_unfaked", mutates_args=())
    def _unfaked(x: torch.Tensor) -> torch.Tensor:
        return x

    def helper(x):
        return x

    return SimpleNamespace(**{fname: _op, f"{kind}_helper": helper}, unfaked=_unfaked, helper=helper)
'''


@pytest.fixture
def example():
    """(module, declarations, namespace facts, layer, registrar, the module's name suffix); the layer is undone
    afterwards, which destroys its fragment."""
    module, declarations, namespaces, prefix = flashinfer_like.load(SOURCE, "getter_example")
    layer = build.Layer("all", "a test")
    registrar = build.Registrar(layer)
    yield module, declarations, namespaces[0], layer, registrar, prefix
    layer.undo.undo_all()


def _members(declarations):
    return [(d, build.Outcome(d.key, d.module, d.name_source, "all")) for d in declarations]


def test_the_polyfill_returns_a_namespace_whose_declared_entry_calls_the_op_and_whose_others_refuse_by_name(example):
    module, declarations, facts, layer, registrar, prefix = example
    members = _members(declarations)
    build.getter(layer, registrar, members, module, facts)
    (built, built_outcome), (unfaked, unfaked_outcome) = members
    assert built_outcome.op == "fp4_dynamo_shim_flashinfer::op"  # a computed name: the function's, less its _
    assert (unfaked_outcome.op, unfaked_outcome.reason) == (None, "returns a value and FlashInfer wrote no fake for it")
    ((original, traceable, served, what),) = layer.pending
    assert original is module.get_module.__wrapped__ and served == [built_outcome]
    assert what == f"{module.__name__}.get_module"

    namespace = traceable("gelu")  # what Dynamo sees get_module("gelu") return
    assert torch.equal(getattr(namespace, f"gelu_{prefix}")(torch.zeros(3)), torch.ones(3))  # through the op
    # The getter's default and the op's each reach their own parameter.
    assert torch.equal(getattr(traceable(), f"silu_{prefix}")(torch.zeros(3), 2.0), torch.full((3,), 2.0))
    assert torch.equal(getattr(traceable(), f"silu_{prefix}")(torch.zeros(3)), torch.ones(3))
    for entry, described in (("unfaked", "unfaked"), ("helper", "helper"), ("gelu_helper", "f'{kind}_helper'")):
        with pytest.raises(NotExpressibleError) as refused:
            getattr(namespace, entry)(torch.zeros(3))
        assert str(refused.value).startswith(
            f"fp4_dynamo_shim: {module.__name__}.get_module().{described} is not behind a custom op")

    layer.undo.undo_all()  # revert: the generated getter's ops are gone from its globals
    assert traceable.__globals__[next(k for k in traceable.__globals__ if k.startswith("_op_"))] is None


def test_members_the_polyfill_cannot_hold_say_why(example):
    module, declarations, facts, layer, registrar, prefix = example
    members = _members(declarations)
    build.getter(layer, registrar, members, module, dataclasses.replace(facts, problem="built in a loop"))
    assert [o.reason for _, o in members] == ["built in a loop"] * 2

    members = _members(declarations)
    without_op = dataclasses.replace(facts, entries=tuple((k, v) for k, v in facts.entries if v != "_op"))
    build.getter(layer, registrar, members, module, without_op)
    assert members[0][1].reason == "get_module's namespace does not hold _op" and not layer.pending

    members = _members(declarations)
    del module.__dict__["get_module"]
    build.getter(layer, registrar, members, module, facts)
    assert [o.reason for _, o in members] == ["get_module is not a module attribute"] * 2 and not layer.pending


def test_a_getter_without_a_cache_is_traced_itself_and_a_failed_registration_is_listed(example, monkeypatch):
    module, declarations, facts, layer, registrar, prefix = example
    module.get_module = module.get_module.__wrapped__  # a getter FlashInfer did not wrap in functools.cache
    members = _members(declarations)
    build.getter(layer, registrar, members, module, facts)
    ((original, traceable, _, _),) = layer.pending
    assert original is module.get_module and members[0][1].op == "fp4_dynamo_shim_flashinfer::op"
    layer.undo.undo_all()

    def broken(op, kernel, fake):
        raise RuntimeError("the fragment is gone")

    monkeypatch.setattr(registrar, "register", broken)
    members = _members(declarations)
    build.getter(layer, registrar, members, module, facts)
    assert (members[0][1].kind, members[0][1].reason) == ("failed", "RuntimeError: the fragment is gone")


def test_a_getter_whose_signature_does_not_evaluate_refuses_its_members_by_name(example):
    module, declarations, facts, layer, registrar, prefix = example
    module.get_module.__wrapped__.__annotations__ = {"kind": "NoSuchType"}  # as a string annotation would read
    members = _members(declarations)
    build.getter(layer, registrar, members, module, facts)
    assert [o.reason for _, o in members] == [
        "get_module: signature: NameError: name 'NoSuchType' is not defined"] * 2 and not layer.pending


SHARED_NAME = NO_OP_DECORATORS + '''
@functools.cache
def get_module(q_seq_len: int, *, tiles: int = 4):
    built_for = q_seq_len * 100 + tiles

    @register_custom_op("flashinfer::PREFIX_attend", mutates_args=())
    def attend(x: torch.Tensor, q_seq_len: int, tiles: int = 1) -> torch.Tensor:
        return x * built_for + q_seq_len * 10 + tiles

    @register_fake_op("flashinfer::PREFIX_attend")
    def _fake_attend(x: torch.Tensor, q_seq_len: int, tiles: int = 1) -> torch.Tensor:
        return torch.empty_like(x)

    return SimpleNamespace(attend=attend)
'''


def test_a_getter_and_its_function_that_share_a_parameter_name_each_get_their_own_value():
    """As flashinfer.xqa's getter and ``xqa`` both take ``q_seq_len``: a call that gives the two different
    values must reach the module built for the getter's and run it with the function's."""
    module, declarations, namespaces, _ = flashinfer_like.load(SHARED_NAME, "getter_shared")
    layer = build.Layer("all", "a test")
    try:
        members = _members(declarations)
        build.getter(layer, build.Registrar(layer), members, module, namespaces[0])
        assert members[0][1].op is not None, members[0][1].reason
        ((_, traceable, _, _),) = layer.pending
        x = torch.ones(2)
        for getter_args, call_args in (((2,), (x, 1)), ((3,), (x, 5, 7))):
            eager = module.get_module(*getter_args, tiles=9).attend(*call_args)
            assert torch.equal(traceable(*getter_args, tiles=9).attend(*call_args), eager), (getter_args, call_args)
        assert torch.equal(traceable(2, tiles=9).attend(x, q_seq_len=1, tiles=3), torch.full((2,), 222.0))  # 1 * (2*100 + 9) + 1*10 + 3
    finally:
        layer.undo.undo_all()


def test_op_parameters_that_would_collide_are_refused_by_name():
    def getter(k: int):
        pass

    def function(x: torch.Tensor, getter_k: int) -> torch.Tensor:
        pass

    with pytest.raises(codegen.NotExpressible) as refused:
        codegen.plan("op", "function", inspect.signature(function), (), inspect.signature(getter))
    assert str(refused.value) == "function: op parameter names collide (getter_k)"
