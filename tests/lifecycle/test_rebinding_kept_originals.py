"""Swapping a function wherever a module global is it (rebind.py): which modules are walked, which are never
touched, and what a layer's Swaps record."""

from __future__ import annotations

import sys
import types

from _fp4_dynamo_shim import rebind


def test_only_the_front_and_the_implementation_count_as_the_shims_own_modules():
    assert rebind.is_shim_module("fp4_dynamo_shim") and rebind.is_shim_module("_fp4_dynamo_shim.fp4.fp4_layer")
    assert not rebind.is_shim_module("fp4_dynamo_shim_hook")  # the forwarder holds no original
    assert not rebind.is_shim_module("sglang.fp4_dynamo_shim") and not rebind.is_shim_module("flashinfer")


def _module(name, **globals_):
    module = types.ModuleType(name)
    module.__dict__.update(globals_)
    return module


def test_swap_walks_only_the_modules_given_and_never_the_shims_own():
    def original():
        pass

    def replacement():
        pass

    given, other = _module("user_given", f=original, alias=original), _module("user_other", f=original)
    own = _module("_fp4_dynamo_shim.kept", f=original)
    found = rebind.swap([(original, replacement)], [own, "not a module", given])  # the walk goes on past both
    assert sorted(map(str, found)) == ["user_given.alias", "user_given.f"]
    assert given.f is replacement and given.alias is replacement
    assert other.f is original and own.f is original


def test_swaps_record_what_they_rebound_rebind_late_comers_and_undo_everything(monkeypatch):
    def original():
        pass

    def replacement():
        pass

    early, late, untouched = _module("user_early", f=original), _module("user_late"), _module("user_untouched")
    for module in (early, late, untouched):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    swaps = rebind.Swaps()
    swaps.swap((original, replacement))
    assert swaps.pairs == [(original, replacement)] and early.f is replacement
    assert [str(binding) for binding in swaps.bindings] == ["user_early.f"]
    late.g = original  # bound after the swap, as a module imported later does
    untouched.h = original
    found = swaps.rebind([early, late])
    assert [str(binding) for binding in found] == ["user_late.g"] and late.g is replacement
    assert untouched.h is original  # not among the modules asked for
    assert "user_late.g" in [str(binding) for binding in swaps.bindings]
    swaps.undo()
    assert late.g is original and early.f is original
