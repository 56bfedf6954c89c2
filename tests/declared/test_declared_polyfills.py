"""The declared-ops layer's polyfills (``declared/polyfill.py``) and the rules' cases no release reaches
(``declared/rules.py``), each on its own.

The layer's tests (test_declared_ops_trace_on_cpu.py) install polyfills only for the installed FlashInfer's functions, whose
traceables match their signatures, on a torch whose tables are where the shim looks, and take each back once;
they read the rules only through that release's declarations. The generated mutants left standing there are
the cases below: a traceable whose signature differs, a torch that registers nothing the shim can take back,
an undo that leaves a polyfill behind, and rule inputs (another default dtype, a getter-bound exclusion, an
annotation that compares badly with one table entry) that no release's declaration supplies.

The polyfills here are for plain functions of this module, traced by real ``torch.compile(fullgraph=True,
backend="eager")`` on CPU; every test takes its polyfill back (the Dynamo tables are process-wide).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from _fp4_dynamo_shim.declared import polyfill
from _fp4_dynamo_shim.declared import adapters
from _fp4_dynamo_shim.declared import rules


def scaled(input, eps=1e-6):
    """Stands for a FlashInfer function: the value eager calls must keep giving."""
    return input + 1


def scaled_traceable(x, eps=1e-6):
    """What Dynamo should trace in its place; the first parameter is named differently, so Dynamo's own
    signature check (sig_ident compares positional names) would refuse the pair."""
    return x * 2


def _compiled_scaled(x):
    return scaled(x)


def test_dynamo_traces_the_traceable_in_place_of_the_original_even_when_their_signatures_differ():
    # install() asks substitute_in_graph to skip its signature check: the shim's traceables are generated and
    # need not spell the parameters as FlashInfer does. With the check, install would raise TypeError here.
    x = torch.arange(3.0)
    undo = polyfill.install(scaled, scaled_traceable)
    try:
        assert polyfill.is_polyfilled(scaled)
        compiled = torch.compile(_compiled_scaled, fullgraph=True, backend="eager")
        assert torch.equal(compiled(x), x * 2)  # the traceable, traced
        assert torch.equal(scaled(x), x + 1)  # eager calls stay FlashInfer's own
    finally:
        undo()
    assert not polyfill.is_polyfilled(scaled)
    torch._dynamo.reset()  # the cached graph's guards do not see the polyfill's removal
    assert torch.equal(torch.compile(_compiled_scaled, fullgraph=True, backend="eager")(x), x + 1)


def test_a_torch_that_registers_nothing_the_shim_can_take_back_is_refused_with_the_reason(monkeypatch):
    # A torch keeping its tables elsewhere: substitute_in_graph "succeeds" but none of the four tables the
    # undo empties holds the function. install must say so, after an undo that finds nothing to remove
    # (each removal tolerates the absent entry: a KeyError or TypeError here would hide the reason).
    monkeypatch.setattr(torch._dynamo, "substitute_in_graph",
                        lambda original, **_: (lambda traceable: traceable))
    with pytest.raises(RuntimeError) as refused:
        polyfill.install(scaled, scaled_traceable)
    assert str(refused.value) == "torch.compiler.substitute_in_graph registered nothing this shim can take back"
    assert not polyfill.is_polyfilled(scaled)


def test_an_undo_that_leaves_dynamo_seeing_the_polyfill_says_so(monkeypatch):
    # The undo empties the tables _tables() names; if Dynamo still counts the function as polyfilled (here:
    # the undo is handed empty stand-ins, as with a torch that keeps a second set), it must not pass silently.
    # The stand-in id set is a plain set, whose remove() raises KeyError for an absent id (torch 2.13's
    # FunctionIdSet.remove checks first): the removal tolerates both, so the reason is what comes out.
    undo = polyfill.install(scaled, scaled_traceable)
    try:
        monkeypatch.setattr(polyfill, "_tables", lambda: (dict(), set(), dict(), dict()))
        with pytest.raises(RuntimeError) as left:
            undo()
        assert str(left.value) == f"Dynamo still holds a polyfill for {scaled!r} after it was removed"
        assert polyfill.is_polyfilled(scaled)
    finally:
        monkeypatch.undo()
        undo()
    assert not polyfill.is_polyfilled(scaled)


def test_the_merge_states_fake_keeps_its_log_sum_exp_in_float32_whatever_the_default_dtype():
    # FlashInfer's merge_states returns the merged LSE as float32 whatever v's dtype; a fake leaving the
    # dtype to torch's default would follow torch.set_default_dtype instead.
    merged = rules.REPLACED_FAKES[("flashinfer.cascade", "merge_states")].fake
    v = torch.empty(5, 3, 8, 64, dtype=torch.float16, device="meta")
    s = torch.empty(5, 3, 8, device="meta")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out, lse = merged(v, s)
    finally:
        torch.set_default_dtype(default)
    assert (out.dtype, lse.dtype) == (torch.float16, torch.float32)


def test_the_sampling_fake_counts_indices_along_their_first_dimension_as_flashinfer_allocates():
    # FlashInfer allocates ``indices.size(0)`` samples (its text, below); a fake sized by the whole shape
    # would disagree with the kernel's output for indices of another rank.
    import flashinfer.sampling

    assert "batch_size = indices.size(0) if indices is not None else probs.size(0)" in inspect.getsource(
        flashinfer.sampling)
    samples = rules.DERIVED_FAKES[("flashinfer.sampling", "min_p_sampling_from_probs")]
    probs = torch.empty(4, 100, device="meta")
    indices = torch.empty(6, 2, dtype=torch.int64, device="meta")
    result = samples(probs, indices)
    assert (tuple(result.shape), result.dtype) == ((6,), torch.int64)


def test_an_exclusion_bound_to_a_getter_leaves_the_modules_other_getters_to_the_gate(monkeypatch):
    # Today's only exclusion covers a whole module, so excluded() passing the getter on is visible only with
    # one bound to a getter, as Exclusion allows (a release record may add one).
    monkeypatch.setattr(rules, "EXCLUSIONS", (rules.Exclusion("flashinfer.x", "why", getter="get_x"),))
    assert rules.excluded("flashinfer.x", "get_x", "op") == (rules.OUT_OF_SCOPE, "why")
    assert rules.excluded("flashinfer.x.y", "get_x", "op") == (rules.OUT_OF_SCOPE, "why")
    assert rules.excluded("flashinfer.x", "get_y", "op") is None
    assert rules.excluded("flashinfer.x", None, "op") is None


def test_an_annotation_that_fails_to_compare_with_one_entry_is_still_matched_against_the_others():
    # A comparison that raises TypeError rules out that entry only: the table lookup goes on to the next.
    class ComparesOnlyWithClasses:
        def __eq__(self, other):
            if isinstance(other, type):
                return other is torch.Generator
            raise TypeError("cannot compare with a typing construct")

        __hash__ = object.__hash__

    found = adapters.adapter_for(ComparesOnlyWithClasses())
    assert found is not None and found.name == "torch.Generator (must be None)"
