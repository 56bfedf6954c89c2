"""What ``declared/codegen.py`` generates for one declared function, case by case: the op's schema for each
kind of parameter and return the adapters carry, what the generated kernel hands FlashInfer's function (or its
fake, by keyword where the fake's parameters differ), what the generated caller gives back and refuses, and
the words of each refusal that status()["flashinfer_ops"] lists.

The layer's tests reach codegen only through the installed release's declarations, where most of these
cases do not occur in every release (no union return, no generator, no two getters' defaults of one name) and
the refusals' words are not compared. Here the "FlashInfer functions" are plain Python functions of this file
that record what they were called with, and no op is registered: the caller's ``_op_<index>`` is bound to the
generated kernel itself, which is what the registered op dispatches to on CPU, so one call runs caller, kernel
and target end to end without touching the shim's op namespace.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import types
from typing import Optional, Tuple, Union

import pytest
import torch

from _fp4_dynamo_shim.declared import build, codegen
from _fp4_dynamo_shim.declared.codegen import NotExpressible
from _fp4_dynamo_shim.errors import NotExpressibleError


def _signature(function):
    # As the layer reads a declaration's signature: this file's annotations are strings (the __future__ import).
    return inspect.signature(function, eval_str=True)


def _generate(function, mutates=(), fake=None, fake_keywords=None, index=1):
    """(Op, kernel, fake, caller) for a module-level ``function``, generated as the layer generates them."""
    op = codegen.plan("op", function.__name__, _signature(function), mutates)
    target = codegen.target_expression(index, None, None)
    kernel, fake_function = codegen.kernel_and_fake(op, index, {f"_target_{index}": function}, target, fake,
                                                    "<test>", fake_keywords)
    namespace = {**build._caller_namespace(), f"_op_{index}": kernel}  # the kernel stands in for the op
    exec(compile(codegen.caller_source(op, index, namespace), "<test>", "exec"), namespace)
    return op, kernel, fake_function, namespace[f"_caller_{index}"]


def _refusal(function, mutates=(), getter=None) -> str:
    with pytest.raises(NotExpressible) as refused:
        codegen.plan("op", function.__name__, _signature(function), mutates,
                     None if getter is None else _signature(getter))
    return str(refused.value)


# --- returns: a union FlashInfer's sampling functions return crosses the op as a tensor list -----------------

def sample(probs: torch.Tensor, return_valid: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    return (probs + 1, probs > 0) if return_valid else probs + 1


def sample_fake(probs: torch.Tensor, return_valid: bool = False
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    return (torch.empty_like(probs), torch.empty_like(probs, dtype=torch.bool)) if return_valid else probs


def test_a_union_return_crosses_the_op_as_a_tensor_list_and_the_caller_gives_back_flashinfer_s_shape():
    op, kernel, fake, caller = _generate(sample, fake=sample_fake)
    assert op.schema == "(Tensor probs, bool return_valid) -> Tensor[]"
    probs = torch.tensor([0.5, -1.0])
    # The kernel and the fake return what the schema says: a list, whichever of FlashInfer's shapes came back.
    one = kernel(probs, False)
    assert isinstance(one, list) and len(one) == 1 and torch.equal(one[0], probs + 1)
    two = kernel(probs, True)
    assert isinstance(two, list) and [t.dtype for t in two] == [torch.float32, torch.bool]
    faked = fake(probs, True)
    assert isinstance(faked, list) and [t.dtype for t in faked] == [torch.float32, torch.bool]
    # The traced code sees FlashInfer's own return: a tensor, or a tuple with return_valid=True.
    single = caller(probs)
    assert isinstance(single, torch.Tensor) and torch.equal(single, probs + 1)
    pair = caller(probs, return_valid=True)
    assert isinstance(pair, tuple) and torch.equal(pair[1], torch.tensor([True, False]))


# --- parameters the schema cannot hold ------------------------------------------------------------------------

def scale(x: torch.Tensor, factor: Union[float, torch.Tensor]) -> torch.Tensor:
    return x * factor


def test_a_tensor_or_number_parameter_reaches_flashinfer_as_whichever_was_passed():
    op, kernel, _, caller = _generate(scale, fake=scale)
    assert op.schema == "(Tensor x, Tensor? factor, float? factor__number) -> Tensor"
    x = torch.ones(2)
    assert torch.equal(caller(x, 3.0), torch.full((2,), 3.0))
    assert torch.equal(caller(x, torch.tensor([2.0, 4.0])), torch.tensor([2.0, 4.0]))


class Activation(enum.IntEnum):  # as FlashInfer's ActivationType, SfLayout, Fp8QuantizationType
    Gelu = 0
    Swiglu = 3


seen_activations = []


def activate(x: torch.Tensor, activation: Activation, fallback: Optional[Activation] = None) -> torch.Tensor:
    seen_activations.append((activation, fallback))
    return x + int(activation)


def test_an_int_enum_crosses_the_op_as_its_int_and_reaches_flashinfer_as_its_member():
    # On every torch: torch 2.11's infer_schema refuses an enum type (the GPU machine's cutlass_fused_moe was
    # listed "not expressible" for it), later ones would pass the member itself.
    op, _, _, caller = _generate(activate, fake=activate)
    assert op.schema == "(Tensor x, SymInt activation, SymInt? fallback) -> Tensor"
    seen_activations.clear()
    assert torch.equal(caller(torch.zeros(2), Activation.Swiglu), torch.full((2,), 3.0))
    caller(torch.zeros(2), Activation.Gelu, Activation.Swiglu)
    assert seen_activations == [(Activation.Swiglu, None), (Activation.Gelu, Activation.Swiglu)]
    assert [type(a) for pair in seen_activations for a in pair if a is not None] == [Activation] * 3


seen_generators = []


def draw(probs: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    seen_generators.append(generator)
    return probs


def test_a_generator_is_refused_by_the_caller_in_the_function_s_name_and_none_reaches_flashinfer():
    op, _, _, caller = _generate(draw, fake=draw)
    assert op.schema == "(Tensor probs) -> Tensor"  # no part carries a generator
    seen_generators.clear()
    probs = torch.ones(2)
    assert caller(probs) is probs and seen_generators == [None]
    with pytest.raises(NotExpressibleError) as refused:
        caller(probs, generator=torch.Generator())
    assert str(refused.value) == ("draw: a torch.Generator cannot cross a custom op; under torch.compile pass "
                                  "seed/offset (or nothing) instead")
    assert seen_generators == [None]  # refused before the op is reached


# --- fakes ----------------------------------------------------------------------------------------------------

def shifted(x: torch.Tensor, y: int, z: int) -> torch.Tensor:
    return x + y + z


def shifted_fake(z: int, x: torch.Tensor) -> torch.Tensor:  # fewer parameters, in another order
    return x.new_full(x.shape, float(z))


def test_a_fake_whose_parameters_differ_is_called_by_keyword_with_its_own():
    _, kernel, fake, _ = _generate(shifted, fake=shifted_fake, fake_keywords=["z", "x"])
    x = torch.zeros(2)
    assert torch.equal(fake(x, 1, 5), torch.full((2,), 5.0))
    assert torch.equal(kernel(x, 1, 5), torch.full((2,), 6.0))  # the kernel still calls the function in full


def test_a_function_without_a_fake_gets_one_that_returns_none():
    def write(out: torch.Tensor) -> None:
        out.fill_(1.0)

    out = torch.zeros(2)
    _, kernel, fake, _ = _generate(write, mutates=("out",))
    assert fake(out) is None and kernel(out) is None and torch.equal(out, torch.ones(2))


# --- callers --------------------------------------------------------------------------------------------------

def add_one(x: torch.Tensor, offset: float = 1.0) -> torch.Tensor:
    return x + offset


def add_two(x: torch.Tensor, offset: float = 2.0) -> torch.Tensor:
    return x + offset


def test_callers_sharing_a_namespace_keep_each_function_s_own_defaults():
    """A getter's callers are compiled together in one namespace (build.getter): two functions with a
    parameter of one name and different defaults must each keep theirs."""
    namespace = build._caller_namespace()
    source = []
    for index, function in ((1, add_one), (2, add_two)):
        op = codegen.plan("op", function.__name__, _signature(function), ())
        kernel, _ = codegen.kernel_and_fake(op, index, {f"_target_{index}": function},
                                            codegen.target_expression(index, None, None), function, "<test>")
        namespace[f"_op_{index}"] = kernel
        source.append(codegen.caller_source(op, index, namespace))
    exec(compile("".join(source), "<test>", "exec"), namespace)
    x = torch.zeros(1)
    assert torch.equal(namespace["_caller_1"](x), torch.ones(1))
    assert torch.equal(namespace["_caller_2"](x), torch.full((1,), 2.0))


builds = []


@functools.cache
def get_module(kind: str) -> types.SimpleNamespace:
    builds.append(kind)

    def act(x: torch.Tensor) -> torch.Tensor:
        return x + len(kind)

    return types.SimpleNamespace(act=act)


def test_the_kernel_reaches_a_cached_getter_s_module_as_an_eager_call_does():
    """FlashInfer's getters are functools.cache'd, which keys ``get_module("ab")`` and
    ``get_module(kind="ab")`` apart: the kernel passes the getter's arguments as FlashInfer's callers do,
    positionally, so it reuses the module an eager call built rather than building (JIT-compiling) another."""
    get_module.cache_clear()
    builds.clear()
    x = torch.zeros(1)
    eager = get_module("ab").act(x)
    getter_signature = _signature(get_module.__wrapped__)  # as build._build reads a cached getter's
    op = codegen.plan("op", "act", _signature(get_module("ab").act), (), getter_signature)
    assert op.schema == "(str getter_kind, Tensor x) -> Tensor"
    target = codegen.target_expression(1, getter_signature, "act")
    kernel, _ = codegen.kernel_and_fake(op, 1, {"_getter_1": get_module}, target, None, "<test>")
    assert torch.equal(kernel("ab", x), eager)
    assert builds == ["ab"]


# --- refusals, in the words status() lists --------------------------------------------------------------------

def variadic(*args: torch.Tensor) -> torch.Tensor:
    pass


def unannotated(x) -> torch.Tensor:
    pass


def plain(x: torch.Tensor) -> torch.Tensor:
    pass


def variadic_getter(*rest: int):
    pass


def unannotated_getter(k):
    pass


def writes_a_number(out: Union[float, torch.Tensor]) -> None:
    pass


def two_getter(a: int, b: int):
    pass


def clashes(x: torch.Tensor, getter_b: int, getter_a: int) -> torch.Tensor:
    pass


def no_return(x: torch.Tensor):
    pass


def returns_none(x: torch.Tensor) -> None:
    pass


def takes_a_dict(x: dict) -> torch.Tensor:
    pass


def returns_a_dict(x: torch.Tensor) -> dict:
    pass


@pytest.mark.parametrize("function, mutates, getter, words", [
    (variadic, (), None, "variadic has a variadic positional parameter (args)"),
    (unannotated, (), None, "unannotated: parameter x has no type annotation"),
    (plain, (), variadic_getter, "its getter has a variadic positional parameter (rest)"),
    (plain, (), unannotated_getter, "its getter: parameter k has no type annotation"),
    (writes_a_number, ("out",), None, "writes_a_number: mutated parameter out has type tensor or number"),
    (clashes, (), two_getter, "clashes: op parameter names collide (getter_a, getter_b)"),
    (no_return, (), None, "no_return has no return annotation"),
    (returns_none, (), None, "returns_none returns None and declares no mutated argument"),
    # infer_schema's first line, less its prefix and its list of valid types
    (takes_a_dict, (), None, "schema: Parameter x has unsupported type <class 'dict'>"),
    (returns_a_dict, (), None, "schema: Return has unsupported type <class 'dict'>"),
], ids=lambda value: getattr(value, "__name__", None))
def test_a_declaration_no_op_can_carry_is_refused_with_the_reason(function, mutates, getter, words):
    assert _refusal(function, mutates, getter) == words


def test_a_schema_refusal_is_cut_to_a_line_status_can_show():
    name = "x" * 300
    function = types.FunctionType(takes_a_dict.__code__, globals(), "long")
    function.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dict)],
        return_annotation=torch.Tensor)
    words = _refusal(function)
    assert words == "schema: " + f"Parameter {name} has unsupported type <class 'dict'>"[:240]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_schema_refusal_logs_none_of_torch_s_warnings_and_leaves_its_logging_as_it_was():
    """infer_schema warns once per type it does not know (torch._library.opaque_object) before it raises;
    the refusal is the answer, so those warnings would only be noise on the user's stderr."""
    torch_logger = logging.getLogger("torch")
    handler, before = _Records(), logging.getLogger("torch._library.opaque_object").level
    torch_logger.addHandler(handler)
    try:
        def odd(x: Union[str, torch.Tensor]) -> torch.Tensor:
            pass

        odd.__signature__ = inspect.Signature(
            [inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Union[str, torch.Tensor])],
            return_annotation=torch.Tensor)
        with pytest.raises(NotExpressible) as refused:
            codegen.plan("op", "odd", odd.__signature__, ())
    finally:
        torch_logger.removeHandler(handler)
    assert str(refused.value).startswith("schema: Parameter x has unsupported type")
    assert [r.getMessage() for r in handler.records] == []
    assert logging.getLogger("torch._library.opaque_object").level == before


def test_an_entry_no_op_carries_refuses_in_full_words():
    refuse = codegen.unavailable("flashinfer.sampling.get_module().helper")
    with pytest.raises(NotExpressibleError) as refused:
        refuse(torch.zeros(1), k=2)
    assert str(refused.value) == (
        "fp4_dynamo_shim: flashinfer.sampling.get_module().helper is not behind a custom op, so it cannot run "
        "inside torch.compile; call it outside the compiled region (see status()['flashinfer_ops'] for why)")
