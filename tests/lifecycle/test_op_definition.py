"""The one way the project defines an op (``oplib.define``), called at test time on a fragment of its own.

Every real op is defined when its module is imported, once per process, so the tests that use those ops never
see ``define`` run again (nor does mutmut, which switches mutants after the import): this defines fresh ops
with the same function and checks what it returns, its kernels per dispatch key and its fake.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from _fp4_dynamo_shim import oplib


def test_define_registers_the_schema_its_kernels_and_its_fake_and_returns_the_default_overload():
    fragment = torch.library.Library("fp4_dynamo_shim_test_oplib", "FRAGMENT")
    name = "scaled"
    op = oplib.define(fragment, f"{name}(Tensor x, float factor) -> Tensor",
                      {"CPU": lambda x, factor: x * factor}, lambda x, factor: torch.empty_like(x))
    assert op is getattr(torch.ops.fp4_dynamo_shim_test_oplib, name).default
    x = torch.arange(4.0)
    assert torch.equal(op(x, 2.0), x * 2.0)
    assert torch.equal(getattr(torch.ops.fp4_dynamo_shim_test_oplib, name)(x, 3.0), x * 3.0)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = op(mode.from_tensor(x), 2.0)
    assert type(fake).__name__ == "FakeTensor" and fake.shape == (4,)
    compiled = torch.compile(lambda t: op(t, 5.0), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), x * 5.0)


def _fake_shape(op):
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        return tuple(op(mode.from_tensor(torch.zeros(3))).shape)


@pytest.mark.parametrize("override", [False, True])
def test_implement_puts_a_fake_over_another_librarys_until_its_fragment_goes(override):
    """FlashInfer's op already has FlashInfer's fake; the shim's fragment lays its own over it (``override`` is
    how the repair asks, for torch releases that refuse a second fake otherwise), and destroying the fragment,
    as revert() does, gives FlashInfer's back."""
    namespace = f"fp4_dynamo_shim_test_implement_{int(override)}"
    theirs = torch.library.Library(namespace, "DEF")
    theirs.define("twice(Tensor x) -> Tensor")
    torch.library.register_fake(f"{namespace}::twice", lambda x: torch.empty_like(x), lib=theirs)
    op = getattr(torch.ops, namespace).twice.default
    mine = torch.library.Library(namespace, "FRAGMENT")
    oplib.implement(mine, "twice", {"CPU": lambda x: x * 2}, lambda x: torch.empty(7, dtype=x.dtype), override)
    assert _fake_shape(op) == (7,) and torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))
    del mine
    assert _fake_shape(op) == (3,)


def _signature(function):
    return inspect.signature(function)


def test_declare_reproduces_a_signature_with_each_default_bound_by_name():
    def function(a, b=1, *, c, d="x", e=None):
        pass

    namespace = {}
    assert oplib.declare(_signature(function), namespace) == "a, b=_default_b, *, c, d=_default_d, e=_default_e"
    assert namespace == {"_default_b": 1, "_default_d": "x", "_default_e": None}
    prefixed = {}
    assert oplib.declare(_signature(function), prefixed, "nvfp4") == (
        "a, b=_nvfp4_default_b, *, c, d=_nvfp4_default_d, e=_nvfp4_default_e")
    assert set(prefixed) == {"_nvfp4_default_b", "_nvfp4_default_d", "_nvfp4_default_e"}

    def positional(a, b):
        pass

    assert oplib.declare(_signature(positional), {}) == "a, b"


@pytest.mark.parametrize("function, refused", [
    (lambda a, *rest: None, "parameter 'rest' is variadic positional"),
    (lambda a, **options: None, "parameter 'options' is variadic keyword"),
    (lambda a, /, b: None, "parameter 'a' is positional-only"),
])
def test_declare_refuses_what_has_no_exact_parameter_list(function, refused):
    with pytest.raises(TypeError, match=f"^{refused}$"):
        oplib.declare(_signature(function), {})


def test_keywords_passes_every_parameter_or_the_ones_named_by_name():
    def function(a, b=1, *, c):
        pass

    assert oplib.keywords(_signature(function)) == "a=a, b=b, c=c"
    assert oplib.keywords(_signature(function), ["c", "a"]) == "c=c, a=a"
    assert oplib.keywords(_signature(function), []) == ""


def test_an_op_that_writes_its_input_is_named_by_what_comes_before_its_first_parenthesis():
    """Schemas with alias annotations carry more parentheses: ``Tensor(a!)`` marks an argument written."""
    def scale_in_place(x, factor):
        x.mul_(factor)

    fragment = torch.library.Library("fp4_dynamo_shim_test_oplib_alias", "FRAGMENT")
    op = oplib.define(fragment, "scale_(Tensor(a!) x, float factor) -> ()", {"CPU": scale_in_place},
                      lambda x, factor: None)
    assert op is torch.ops.fp4_dynamo_shim_test_oplib_alias.scale_.default
    x = torch.ones(3)
    op(x, 4.0)
    assert torch.equal(x, torch.full((3,), 4.0))
