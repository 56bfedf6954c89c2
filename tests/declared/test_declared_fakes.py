"""Which fake each declaration gets (``declared/build.py``'s ``_fake``), case by case, on modules written like
FlashInfer's: none where the function returns None, FlashInfer's own as written or by keyword where it lacks
parameters, the shim's where a rule derives or replaces one, and a refusal naming the reason otherwise.

The layer's tests (test_declared_ops_trace_on_cpu.py) reach these only through the installed release's declarations, where most
cases do not occur (one release has no stale fake, another no getter-local one) and the words that status()
shows are not compared. The modules here are executed source text with no-op decorators, as FlashInfer's are
when its custom ops are off.
"""

from __future__ import annotations

import types

import pytest
import torch

from _fp4_dynamo_shim.declared import build, rules
from _fp4_dynamo_shim.declared import scan
from _fp4_dynamo_shim.declared.codegen import NotExpressible

from flashinfer_like import NO_OP_DECORATORS

#: Which fake a declaration gets: the installed release reaches few of these cases, so they are asked directly.
fake_for = build._fake

CASES = NO_OP_DECORATORS + '''
@register_custom_op("flashinfer::writes", mutates_args=("out",))
def _writes(out: torch.Tensor) -> None:
    pass

@register_custom_op("flashinfer::unfaked", mutates_args=())
def _unfaked(x: torch.Tensor) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::same", mutates_args=())
def _same(x: torch.Tensor, y: int) -> torch.Tensor:
    return x

@register_fake_op("flashinfer::same")
def _same_fake(x: torch.Tensor, y: int) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::fewer", mutates_args=())
def _fewer(x: torch.Tensor, y: int, z: int) -> torch.Tensor:
    return x

@register_fake_op("flashinfer::fewer")
def _fewer_fake(x: torch.Tensor) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::reordered", mutates_args=())
def _reordered(x: torch.Tensor, y: int) -> torch.Tensor:
    return x

@register_fake_op("flashinfer::reordered")
def _reordered_fake(y: int, x: torch.Tensor) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::stale", mutates_args=())
def _stale(x: torch.Tensor) -> torch.Tensor:
    return x

@register_fake_op("flashinfer::stale")
def _stale_fake(x: torch.Tensor, gone: int, old: int) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::stale_writes", mutates_args=("x",))
def _stale_writes(x: torch.Tensor) -> None:
    pass

@register_fake_op("flashinfer::stale_writes")
def _stale_writes_fake(x: torch.Tensor, gone: int) -> None:
    pass

def get_module():
    scale = 3

    @register_custom_op("flashinfer::reads_local", mutates_args=())
    def _reads_local(x: torch.Tensor) -> torch.Tensor:
        return x

    @register_fake_op("flashinfer::reads_local")
    def _reads_local_fake(x: torch.Tensor) -> torch.Tensor:
        return x * scale + offset

    @register_custom_op("flashinfer::nested", mutates_args=())
    def _nested(x: torch.Tensor) -> torch.Tensor:
        return x

    @register_fake_op("flashinfer::nested")
    def _nested_fake(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x) if len(x.shape) else x  # a builtin is no getter local

    return SimpleNamespace(reads_local=_reads_local, nested=_nested)
'''


def _declarations(source, module_name):
    """name -> (declaration, module, function) for a module executed from ``source``."""
    module = types.ModuleType(module_name)
    exec(compile(source, module_name, "exec"), module.__dict__)
    nested = vars(module.get_module()) if hasattr(module, "get_module") else {}
    found = {}
    for declaration in scan.scan_source(source, module_name)[0]:
        name = declaration.name or declaration.function.lstrip("_")
        function = module.__dict__.get(declaration.function) or nested[name]
        found[name] = (declaration, module, function)
    return found


@pytest.fixture(scope="module")
def cases():
    return _declarations(CASES, "flashinfer.example")


def _parameters(function):
    return list(__import__("inspect").signature(function).parameters)


def test_a_function_that_returns_none_needs_no_fake(cases):
    assert fake_for(*cases["writes"]) == (None, None, "none needed (returns None)")


def test_flashinfers_fake_is_used_as_written_when_it_matches_and_by_keyword_when_it_lacks_parameters(cases):
    declaration, module, function = cases["same"]
    assert fake_for(declaration, module, function) == (module._same_fake, None, "FlashInfer's")
    declaration, module, function = cases["fewer"]
    assert fake_for(declaration, module, function) == (module._fewer_fake, ["x"],
                                                          "FlashInfer's, by keyword (it lacks y, z)")


def test_a_fake_naming_parameters_the_function_lacks_is_refused_or_dropped_where_none_is_needed(cases):
    with pytest.raises(NotExpressible) as refused:
        fake_for(*cases["stale"])
    assert str(refused.value) == "FlashInfer's fake names parameters the function lacks (gone, old)"
    assert fake_for(*cases["stale_writes"]) == (
        None, None, "none needed (returns None; FlashInfer's fake names parameters it lacks: gone)")


def test_a_value_without_a_fake_is_refused(cases):
    with pytest.raises(NotExpressible) as refused:
        fake_for(*cases["unfaked"])
    assert str(refused.value) == "returns a value and FlashInfer wrote no fake for it"


def test_a_getters_fake_is_compiled_in_the_module_unless_it_reads_the_getters_locals(cases):
    with pytest.raises(NotExpressible) as refused:
        fake_for(*cases["reads_local"])
    assert str(refused.value) == "FlashInfer's fake reads its getter's locals (offset, scale)"
    fake, keywords, how = fake_for(*cases["nested"])
    assert (fake.__name__, keywords, how) == ("_nested_fake", None, "FlashInfer's")
    x = torch.empty(2, 3, device="meta")
    assert fake(x).shape == (2, 3) and fake.__globals__ is cases["nested"][1].__dict__
    assert fake.__code__.co_filename == "<flashinfer>"  # the stand-in module has no file


def test_a_compiled_fake_names_flashinfers_file_in_its_tracebacks():
    module = types.ModuleType("flashinfer.example")
    module.__file__ = "/site-packages/flashinfer/example.py"
    module.torch = torch
    fake = build._compiled("def _fake(x):\n    return x\n", module, "fake _fake")
    assert fake.__code__.co_filename == "/site-packages/flashinfer/example.py"


def test_a_getters_fake_that_does_not_compile_outside_the_getter_is_refused_by_name():
    """Its names are all the module's, but its default fails when the def runs (the getter is never called:
    the function handed over stands in for what it would return)."""
    source = NO_OP_DECORATORS + '''
def get_module():
    @register_custom_op("flashinfer::bad_default", mutates_args=())
    def _bad_default(x: torch.Tensor) -> torch.Tensor:
        return x

    @register_fake_op("flashinfer::bad_default")
    def _bad_default_fake(x: torch.Tensor, k=torch.no_such_thing) -> torch.Tensor:
        return x
'''
    module = types.ModuleType("flashinfer.example")
    exec(compile(source, "flashinfer.example", "exec"), module.__dict__)
    (declaration,) = scan.scan_source(source, "flashinfer.example")[0]

    def returned(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(NotExpressible) as refused:
        fake_for(declaration, module, returned)
    assert str(refused.value) == ("fake _bad_default_fake does not compile outside its getter (AttributeError: "
                                  "module 'torch' has no attribute 'no_such_thing')")


def test_a_fake_with_the_functions_parameters_in_another_order_is_called_by_keyword(cases):
    declaration, module, function = cases["reordered"]
    assert fake_for(declaration, module, function) == (
        module._reordered_fake, ["y", "x"], "FlashInfer's, by keyword (in another order)")


def test_the_shims_rules_give_the_fake_where_flashinfer_wrote_none_or_a_wrong_one():
    sampling = _declarations(NO_OP_DECORATORS + '''
@register_custom_op("flashinfer::min_p_sampling_from_probs", mutates_args=())
def min_p_sampling_from_probs(probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return probs
''', "flashinfer.sampling")
    declaration, module, function = sampling["min_p_sampling_from_probs"]
    assert fake_for(declaration, module, function) == (
        rules.DERIVED_FAKES[("flashinfer.sampling", "min_p_sampling_from_probs")], ["probs", "indices"],
        "derived by the shim (its DERIVED_FAKES rules)")

    def merge_states(allocates):
        return _declarations(NO_OP_DECORATORS + f'''
@register_custom_op("flashinfer::merge_states", mutates_args=())
def merge_states(v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return v

@register_fake_op("flashinfer::merge_states")
def _merge_states_fake(v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.empty(1{allocates})
''', "flashinfer.cascade")["merge_states"]

    declaration, module, function = merge_states("")
    replaced = rules.REPLACED_FAKES[("flashinfer.cascade", "merge_states")]
    assert fake_for(declaration, module, function) == (
        replaced.fake, ["v", "s"], f"the shim's ({replaced.fault})")
    declaration, module, function = merge_states(", device=v.device")  # FlashInfer mended it: its own again
    assert fake_for(declaration, module, function) == (module._merge_states_fake, None, "FlashInfer's")
