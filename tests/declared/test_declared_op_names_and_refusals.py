"""Building one declared op (``declared/build.py``), case by case: the op's name (FlashInfer's, a repeat's
suffix, a computed name's function), the refusal for a declared name that is not that function at import, the
fake the op gets (FlashInfer's by keyword, under meta tensors), the caller's refusal of a torch.Generator, the
stub compiled for a getter's nested def (no return annotation, a default naming the getter's locals), a
getter whose wrapper presents its own signature, members a getter's loop passes over, an undeclared entry's
name, which module imports, and which name FlashInfer already registered as an op.

The layer's tests reach these only through the installed release, where one op name is never repeated, every
declared name is its function, no getter wrapper sets ``__signature__`` and no member is passed over before
another builds. Stand-ins, each named where used: modules executed from source text with FlashInfer's no-op
decorators (as its modules are when its custom ops are off), a module file written to a temporary directory
(for the import), an op defined in a ``flashinfer`` fragment (FlashInfer's own), and a failing ``register``
(a registration that goes wrong). The ops are real, in a fragment of the shim's namespace that each test
destroys; names carry a suffix of their own, since ops are process-wide.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import sys
import types

import pytest
import torch

from _fp4_dynamo_shim.declared import build
from _fp4_dynamo_shim.declared.codegen import NotExpressible, NotExpressibleError

import flashinfer_like
from flashinfer_like import NO_OP_DECORATORS

_numbers = itertools.count()

MODULE_LEVEL = NO_OP_DECORATORS + '''
@register_custom_op("flashinfer::PREFIX_scale", mutates_args=())
def _scale(x: torch.Tensor, factor: float, offset: float) -> torch.Tensor:
    return x * factor + offset

@register_fake_op("flashinfer::PREFIX_scale")
def _scale_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)

@register_custom_op("flashinfer::PREFIX_scale", mutates_args=())
def _scale_again(x: torch.Tensor) -> torch.Tensor:
    return x

@register_fake_op("flashinfer::PREFIX_scale")
def _scale_again_fake(x: torch.Tensor) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::PREFIX_scale", mutates_args=())
def _scale_third(x: torch.Tensor) -> torch.Tensor:
    return x

@register_fake_op("flashinfer::PREFIX_scale")
def _scale_third_fake(x: torch.Tensor) -> torch.Tensor:
    return x

@register_custom_op("flashinfer::PREFIX_sample", mutates_args=())
def _sample(x: torch.Tensor, generator: typing.Optional[torch.Generator] = None) -> torch.Tensor:
    return x + 1

@register_fake_op("flashinfer::PREFIX_sample")
def _sample_fake(x: torch.Tensor, generator: typing.Optional[torch.Generator] = None) -> torch.Tensor:
    return torch.empty_like(x)
'''

GETTER = NO_OP_DECORATORS + '''
@functools.cache
def get_module(kind: str = "silu"):
    scale = 3

    @register_custom_op(f"flashinfer::{kind}_PREFIX", mutates_args=())
    def _Xform(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @register_fake_op(f"flashinfer::{kind}_PREFIX")
    def _Xform_fake(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @register_custom_op("flashinfer::PREFIX_double", mutates_args=())
    def _double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @register_fake_op("flashinfer::PREFIX_double")
    def _double_fake(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @register_custom_op("flashinfer::PREFIX_unannotated", mutates_args=("x",))
    def _unannotated(x: torch.Tensor):
        x.zero_()

    @register_custom_op("flashinfer::PREFIX_local_default", mutates_args=("x",))
    def _local_default(x: torch.Tensor, k: int = scale) -> None:
        x.mul_(k)

    def Xhelper(x):
        return x

    return SimpleNamespace(Xform=_Xform, double=_double, unannotated=_unannotated, local_default=_local_default,
                           Xhelper=Xhelper)
'''


def _load(template: str, stem: str):
    """flashinfer_like.load, with the declarations by function."""
    module, declarations, namespaces, prefix = flashinfer_like.load(template, stem)
    return module, {d.function: d for d in declarations}, namespaces, prefix


@pytest.fixture
def layer():
    """A layer and its registrar; undone afterwards, which destroys the fragment."""
    layer = build.Layer("all", "a test")
    yield layer, build.Registrar(layer)
    layer.undo.undo_all()


def _outcome(declaration):
    return build.Outcome(declaration.key, declaration.module, declaration.name_source, "all")


def _module_level(layer, registrar, declaration, module):
    """The outcome of building one module-level declaration and the traceable that stands in for it."""
    outcome = _outcome(declaration)
    build.module_level(layer, registrar, declaration, module, outcome)
    return outcome, layer.pending[-1][1]


# --- module level ------------------------------------------------------------------------------------------


def test_an_op_takes_flashinfers_name_and_each_repeat_the_next_free_suffix(layer):
    layer, registrar = layer
    module, declarations, _, prefix = _load(MODULE_LEVEL, "build_names")
    ops = [_module_level(layer, registrar, declarations[function], module)[0].op
           for function in ("_scale", "_scale_again", "_scale_third")]
    # FlashInfer's literal name, not the def's; one registrar builds them all, each under a name of its own.
    assert ops == [f"fp4_dynamo_shim_flashinfer::{prefix}_scale", f"fp4_dynamo_shim_flashinfer::{prefix}_scale_2",
                   f"fp4_dynamo_shim_flashinfer::{prefix}_scale_3"]
    # Each repeat is its own op, calling its own function.
    third = layer.pending[-1][1]
    assert torch.equal(third(torch.ones(2)), torch.ones(2))


def test_a_fake_lacking_parameters_is_called_by_keyword_when_the_op_runs_on_meta_tensors(layer):
    layer, registrar = layer
    module, declarations, _, _ = _load(MODULE_LEVEL, "build_fake")
    outcome, traceable = _module_level(layer, registrar, declarations["_scale"], module)
    assert outcome.fake == "FlashInfer's, by keyword (it lacks factor, offset)"
    assert torch.equal(traceable(torch.ones(3), 2.0, 1.0), torch.full((3,), 3.0))  # the kernel: FlashInfer's
    # Meta tensors reach the fake (as tracing does): FlashInfer's, given only the parameters it names.
    result = traceable(torch.empty(2, 5, device="meta"), 2.0, 1.0)
    assert result.shape == (2, 5) and result.device.type == "meta"


def test_the_traceable_refuses_a_generator_by_name_and_runs_without_one(layer):
    layer, registrar = layer
    module, declarations, _, _ = _load(MODULE_LEVEL, "build_generator")
    outcome, traceable = _module_level(layer, registrar, declarations["_sample"], module)
    assert outcome.op is not None
    assert torch.equal(traceable(torch.zeros(2)), torch.ones(2))
    with pytest.raises(NotExpressibleError) as refused:  # raised by the generated caller's check
        traceable(torch.zeros(2), torch.Generator())
    assert str(refused.value).startswith("_sample: a torch.Generator cannot cross a custom op")


def _not_callable_but_wrapping(function):
    return types.SimpleNamespace(__wrapped__=function)  # unwraps to the function, yet cannot be called


@pytest.mark.parametrize("rebind", [
    pytest.param(None, id="gone"),
    pytest.param(lambda function: 3, id="a-constant"),
    pytest.param(lambda function: functools.partial(function), id="a-callable-without-code"),
    pytest.param(lambda function: (lambda x: x), id="another-function"),
    pytest.param(_not_callable_but_wrapping, id="not-callable-but-wrapping-it"),
])
def test_a_declared_name_that_is_not_its_function_at_import_is_refused_by_name(layer, rebind):
    layer, registrar = layer
    module, declarations, _, _ = _load(MODULE_LEVEL, "build_rebound")
    if rebind is None:
        del module.__dict__["_sample"]
    else:
        module._sample = rebind(module._sample)
    # NotExpressible (a fact of the release, listed) and not another error (a failure, which STRICT raises).
    with pytest.raises(NotExpressible) as refused:
        _module_level(layer, registrar, declarations["_sample"], module)
    assert str(refused.value) == f"{module.__name__}._sample is not that function at import time"
    assert not layer.pending


# --- getters -----------------------------------------------------------------------------------------------


def _build_getter(layer, registrar, module, facts, declarations, functions, decided=()):
    """The outcomes of ``functions`` (in that order) after the getter's polyfill is built; those in
    ``decided`` were refused before building, as the layer refuses a gated-off one."""
    members = [(declarations[f], _outcome(declarations[f])) for f in functions]
    for declaration, outcome in members:
        if declaration.function in decided:
            outcome.refuse("off under a test's gate")
    build.getter(layer, registrar, members, module, facts)
    return {declaration.function: outcome for declaration, outcome in members}


def test_a_nested_def_without_a_return_annotation_is_refused_as_such(layer):
    """Its stub must carry no return annotation either: read as ``-> None`` it would become an op that returns
    nothing, and the op would hand back None where FlashInfer's function returns whatever it does."""
    layer, registrar = layer
    module, declarations, namespaces, _ = _load(GETTER, "build_stub")
    outcomes = _build_getter(layer, registrar, module, namespaces[0], declarations, ["_unannotated"])
    assert (outcomes["_unannotated"].op, outcomes["_unannotated"].reason) == (
        None, "_unannotated has no return annotation")


def test_a_nested_def_whose_default_names_a_getter_local_is_refused_by_its_name(layer):
    layer, registrar = layer
    module, declarations, namespaces, _ = _load(GETTER, "build_local")
    outcomes = _build_getter(layer, registrar, module, namespaces[0], declarations, ["_local_default"])
    assert outcomes["_local_default"].reason == (
        "_local_default does not compile outside its getter (NameError: name 'scale' is not defined)")


def test_a_computed_name_is_the_functions_less_its_underscores_and_other_entries_refuse_by_their_own_names(layer):
    layer, registrar = layer
    module, declarations, namespaces, prefix = _load(GETTER, "build_computed")
    outcomes = _build_getter(layer, registrar, module, namespaces[0], declarations, ["_Xform", "_double"])
    # Only leading underscores go: the name's own first letters stay, whatever they are.
    assert outcomes["_Xform"].op == "fp4_dynamo_shim_flashinfer::Xform"
    assert outcomes["_double"].op == f"fp4_dynamo_shim_flashinfer::{prefix}_double"
    ((_, traceable, served, _),) = layer.pending
    namespace = traceable("gelu")
    assert torch.equal(namespace.Xform(torch.zeros(2)), torch.ones(2))
    assert torch.equal(namespace.double(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(NotExpressibleError) as refused:
        namespace.Xhelper(torch.zeros(2))
    assert str(refused.value).startswith(
        f"fp4_dynamo_shim: {module.__name__}.get_module().Xhelper is not behind a custom op")


@pytest.mark.parametrize("passed_over", ["decided before building", "not in the namespace", "failing to register"])
def test_a_member_the_getter_passes_over_does_not_stop_the_members_after_it(layer, monkeypatch, passed_over):
    layer, registrar = layer
    module, declarations, namespaces, prefix = _load(GETTER, "build_loop")
    facts, decided = namespaces[0], ()
    if passed_over == "decided before building":
        decided = ("_Xform",)
    elif passed_over == "not in the namespace":
        # The namespace holds another value under _Xform's key (its entries stay numbered as its returns read them).
        facts = dataclasses.replace(facts, entries=tuple((k, "helper" if v == "_Xform" else v) for k, v in facts.entries))
    else:
        register = registrar.register

        def failing_for_xform(op, kernel, fake):  # a registration that goes wrong, for the first member only
            if op.name == "Xform":
                raise RuntimeError("the fragment refused it")
            return register(op, kernel, fake)

        monkeypatch.setattr(registrar, "register", failing_for_xform)
    outcomes = _build_getter(layer, registrar, module, facts, declarations, ["_Xform", "_double"], decided)
    assert outcomes["_Xform"].op is None and outcomes["_Xform"].reason is not None
    assert outcomes["_double"].op == f"fp4_dynamo_shim_flashinfer::{prefix}_double"
    ((_, traceable, served, _),) = layer.pending
    assert served == [outcomes["_double"]]
    assert torch.equal(traceable().double(torch.ones(2)), torch.full((2,), 2.0))


def test_an_op_is_planned_from_the_getter_dynamo_traces_not_the_signature_its_wrapper_presents(layer):
    """A decorator may set ``__signature__`` on its wrapper (here ``(*args, **kwargs)``, which no op can carry);
    Dynamo traces the wrapper's ``__wrapped__``, whose parameters the op takes."""
    layer, registrar = layer
    module, declarations, namespaces, _ = _load(GETTER, "build_wrapped")
    inner = module.get_module.__wrapped__

    @functools.wraps(inner)
    def presenting(*args, **kwargs):
        return inner(*args, **kwargs)

    presenting.__signature__ = inspect.Signature([
        inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
        inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    module.get_module = presenting
    outcomes = _build_getter(layer, registrar, module, namespaces[0], declarations, ["_Xform"])
    assert outcomes["_Xform"].op == "fp4_dynamo_shim_flashinfer::Xform", outcomes["_Xform"].reason
    ((original, traceable, _, _),) = layer.pending
    assert original is inner
    assert torch.equal(traceable("gelu").Xform(torch.zeros(2)), torch.ones(2))


# --- which module, which op --------------------------------------------------------------------------------


def test_a_module_not_yet_imported_is_imported_and_one_that_fails_says_how(tmp_path, monkeypatch):
    stem = f"fp4_shim_build_case_{next(_numbers)}"
    (tmp_path / f"{stem}_fine.py").write_text("VALUE = 7\n")
    (tmp_path / f"{stem}_broken.py").write_text("raise ValueError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert f"{stem}_fine" not in sys.modules
        assert build.module_named(f"{stem}_fine").VALUE == 7
        with pytest.raises(NotExpressible) as refused:
            build.module_named(f"{stem}_broken")
        assert str(refused.value) == f"{stem}_broken does not import here (ValueError: no GPU here)"
        with pytest.raises(NotExpressible) as refused:
            build.module_named(f"{stem}_absent")
        assert str(refused.value) == (f"{stem}_absent does not import here "
                                      f"(ModuleNotFoundError: No module named '{stem}_absent')")
    finally:
        for name in [n for n in sys.modules if n.startswith(stem)]:
            del sys.modules[name]


def test_only_a_name_flashinfer_registered_itself_is_already_an_op():
    name = f"build_case_own_{next(_numbers)}"
    own = torch.library.Library("flashinfer", "FRAGMENT")  # stands in for FlashInfer's own registration
    try:
        own.define(f"{name}(Tensor x) -> Tensor")
        assert build.already_an_op(name)
        assert not build.already_an_op(f"{name}_not_registered")
        assert not build.already_an_op(None)  # a name computed at run time is nobody's op yet
    finally:
        own._destroy()


UNDECLARED_WRITE = NO_OP_DECORATORS + '''
@register_custom_op("flashinfer::PREFIX_gemm", mutates_args=(""))
def _gemm(a: torch.Tensor, out: torch.Tensor):
    out.copy_(a)
'''


def test_a_function_that_returns_nothing_and_declares_nothing_written_is_refused_for_its_undeclared_write(layer):
    """As an op it would be dead code, and whatever it writes (0.5.3's FP4 GEMMs hand ``out`` to their module) would
    be undeclared: refused for that, not for its missing return annotation."""
    layer, registrar = layer
    module, declarations, _, _ = _load(UNDECLARED_WRITE, "undeclared_write")
    outcome = _outcome(declarations["_gemm"])
    with pytest.raises(NotExpressible, match="returns nothing and declares nothing written") as refused:
        build.module_level(layer, registrar, declarations["_gemm"], module, outcome)
    assert "what it writes through its arguments is undeclared" in str(refused.value)


def test_parameters_typed_any_that_take_tvm_ffi_tensors_are_refused_for_that(unpatched):
    """0.7.4's MiniMax SM120 varlen attentions: their callers pass ``tvm_ffi.from_dlpack`` views, read from the text."""
    import fp4_dynamo_shim
    from helpers import apply_with

    with pytest.MonkeyPatch.context() as patch:
        ops = apply_with(patch, FLASHINFER_OPS="all")["flashinfer_ops"]
    fp4_dynamo_shim.revert()
    listed = {key: entry["reason"] for key, entry in ops["not_registered"].items() if "_minimax_h3_sm120_varlen" in key}
    if not listed:
        pytest.skip("no MiniMax SM120 varlen attention in this release")
    assert all("take what its caller passes, tvm-ffi tensors (tvm_ffi.from_dlpack" in r for r in listed.values())
