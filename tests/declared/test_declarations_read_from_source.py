"""What the source scan (``declared/scan.py``) reads from modules written like FlashInfer's, case by case: each
field of a declaration and which fake it pairs with, the spellings FlashInfer uses for its decorators,
``mutates_args`` and the namespace a getter returns, the blocks a def can sit in, the getters that get a
namespace at all, and the per-file caches, which must read a rewritten file again.

The layer's tests (test_declared_ops_trace_on_cpu.py) reach the scan only through the installed release, whose files happen
to use one spelling of each thing, and through a few fields of one small module; most of the cases below occur
in some release or would go unnoticed there (a stale field is only read when an op fails to build). The
sources are only parsed here, never executed, so the decorators need not exist.
"""

from __future__ import annotations

import os

from _fp4_dynamo_shim.declared import scan
from _fp4_dynamo_shim.declared.scan import Fake, Namespace

MODULE = "flashinfer.example"


def _line(source, text):
    """The 1-based line of the first line of ``source`` that contains ``text``."""
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


def _by_name(declarations):
    return {declaration.name: declaration for declaration in declarations}


def test_a_declaration_records_its_line_signature_return_and_fake_as_written():
    source = '''
import torch

@register_custom_op("flashinfer::rmsnorm", mutates_args=("out",))
def _rmsnorm(out: torch.Tensor, x: torch.Tensor, eps: float = 1e-6) -> None:
    pass

@register_custom_op("flashinfer::scale", mutates_args=())
def _scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor

@register_fake_op("flashinfer::scale")
def _scale_fake(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)

@register_custom_op("flashinfer::unannotated", mutates_args=())
def _unannotated(x):
    return x
'''
    declarations, namespaces = scan.scan_source(source, MODULE)
    # Sorted by line: the order the file declares them in.
    assert [d.name for d in declarations] == ["rmsnorm", "scale", "unannotated"]
    rmsnorm, scale, unannotated = declarations
    assert (rmsnorm.line, rmsnorm.name_source, rmsnorm.mutates, rmsnorm.parameters, rmsnorm.returns) == (
        _line(source, "def _rmsnorm"), "'flashinfer::rmsnorm'", ("out",),
        "out: torch.Tensor, x: torch.Tensor, eps: float=1e-06", "None")
    assert (scale.line, scale.scope, scale.key, scale.returns) == (
        _line(source, "def _scale("), (), "flashinfer.example._scale", "torch.Tensor")
    # The fake keeps its annotations (the build compiles this text) but not its decorator.
    assert scale.fake == Fake("_scale_fake", _line(source, "def _scale_fake"),
                              "def _scale_fake(x: torch.Tensor, factor: float) -> torch.Tensor:\n"
                              "    return torch.empty_like(x)")
    assert (rmsnorm.fake, unannotated.returns, unannotated.fake, unannotated.getter_parameters) == (
        None, None, None, None)
    assert namespaces == []  # module level: no getter


def test_each_fake_pairs_with_the_op_of_its_own_name_wherever_it_stands_in_the_scope():
    """Fakes are matched by the name argument as written, so a computed name pairs too; the order of the
    defs does not matter."""
    source = '''
@register_fake_op(f"flashinfer::{name}_second")
def _second_fake(y):
    return y

@register_custom_op("flashinfer::first", mutates_args=())
def _first(x):
    return x

@register_custom_op(f"flashinfer::{name}_second", mutates_args=())
def _second(y):
    return y

@register_fake_op("flashinfer::first")
def _first_fake(x):
    return x
'''
    first, second = scan.scan_source(source, MODULE)[0]
    assert (first.name, first.name_source, first.fake.function) == ("first", "'flashinfer::first'", "_first_fake")
    assert (second.name, second.name_source, second.fake.function) == (
        None, "f'flashinfer::{name}_second'", "_second_fake")


def test_decorators_reached_through_a_module_are_read_like_bare_ones():
    source = '''
import flashinfer.utils as utils

@utils.register_custom_op("flashinfer::qualified", mutates_args=())
def _qualified(x):
    return x

@utils.register_fake_op("flashinfer::qualified")
def _qualified_fake(x):
    return x
'''
    (declaration,) = scan.scan_source(source, MODULE)[0]
    assert (declaration.name, declaration.fake.function) == ("qualified", "_qualified_fake")


def test_a_decorator_call_that_is_neither_a_name_nor_an_attribute_is_passed_over():
    # A subscripted or called factory has no name to compare; the scan must skip it, not fail on it.
    source = '''
@WRAPPERS["trace"]("x")
@make_wrapper()(1)
@register_custom_op("flashinfer::wrapped", mutates_args=())
def _wrapped(x):
    return x
'''
    (declaration,) = scan.scan_source(source, MODULE)[0]
    assert declaration.name == "wrapped"


def test_a_decorator_without_an_op_name_gives_no_name_and_an_empty_source():
    """FlashInfer's name parameter is positional-only, so this does not import; the scan, which reads every
    file that mentions the decorator, must still not fail on it."""
    source = '''
@register_custom_op(mutates_args=())
def _nameless(x):
    return x

@register_fake_op()
def _nameless_fake(x):
    return x
'''
    (declaration,) = scan.scan_source(source, MODULE)[0]
    assert (declaration.name, declaration.name_source) == (None, "")


def test_mutates_args_as_one_name_an_empty_string_or_a_non_name_literal():
    source = '''
@register_custom_op("flashinfer::one", mutates_args="out")
def _one(out):
    pass

@register_custom_op("flashinfer::empty", mutates_args="")
def _empty(x):
    pass

@register_custom_op("flashinfer::listed", mutates_args=["a", "", "b"])
def _listed(a, b):
    pass

@register_custom_op("flashinfer::mixed", mutates_args=("out", 1))
def _mixed(out):
    pass

@register_custom_op("flashinfer::nothing", mutates_args=None)
def _nothing(out):
    pass

@register_custom_op("flashinfer::computed", mutates_args=WRITTEN)
def _computed(out):
    pass

@register_custom_op("flashinfer::unsaid")
def _unsaid(out):
    pass
'''
    mutates = {d.name: d.mutates for d in scan.scan_source(source, MODULE)[0]}
    # One string is one name, "" is none; a literal that is not names is as unknown as a computed one.
    assert mutates == {"one": ("out",), "empty": (), "listed": ("a", "b"), "mixed": None, "nothing": None,
                       "computed": None, "unsaid": ()}


GETTER = '''
import functools
import types

@functools.cache
def get_module(kind: str, width: int = 4):
    fname = f"{kind}_c"

    @register_custom_op("flashinfer::a", mutates_args=())
    def _a(x):
        return x

    @register_custom_op(f"flashinfer::{kind}_b", mutates_args=())
    def _b(x):
        return x

    @register_custom_op(f"flashinfer::{fname}", mutates_args=())
    def _c(x):
        return x

    def helper():
        return None

    return types.SimpleNamespace(**{"plain": _a, f"{kind}_b": _b, fname: _c}, helper=helper)
'''


def test_a_getters_namespace_holds_literal_keys_as_they_are_and_computed_ones_as_their_expression():
    """``types.SimpleNamespace`` is read like a bare ``SimpleNamespace``; a computed key is written in terms of
    the getter's parameters, its local names replaced by their values and its parameters left as they are."""
    declarations, namespaces = scan.scan_source(GETTER, MODULE)
    (namespace,) = namespaces
    assert (namespace.module, namespace.getter, namespace.problem) == (MODULE, "get_module", None)
    assert namespace.entries == (("plain", "_a"), ("=f'{kind}_b'", "_b"), ("=f'{kind}_c'", "_c"),
                                 ("helper", "helper"))
    assert {d.function: (d.getter, d.getter_parameters) for d in declarations} == {
        function: ("get_module", "kind: str, width: int=4") for function in ("_a", "_b", "_c")}


def test_a_getter_returning_early_on_more_than_its_parameters_cannot_be_rebuilt_and_says_why():
    # The early return stands before the nested defs, under a test on a global the polyfill cannot evaluate; a
    # return inside a nested def is the def's own.
    source = '''
_cached = None

def get_module():
    if _cached is not None:
        return _cached

    @register_custom_op("flashinfer::op", mutates_args=())
    def _op(x):
        def inner():
            return SimpleNamespace()
        return x

    return SimpleNamespace(op=_op)
'''
    (namespace,) = scan.scan_source(source, MODULE)[1]
    assert namespace == Namespace(MODULE, "get_module", (),
                                  "get_module returns under a test on more than its parameters (_cached is not None)")
    assert namespace.keys_of("_op") == ()


def test_a_getter_spreading_a_variable_into_its_namespace_cannot_be_rebuilt_and_says_why():
    source = '''
def get_module():
    @register_custom_op("flashinfer::op", mutates_args=())
    def _op(x):
        return x

    functions = {"op": _op}
    return SimpleNamespace(**functions)
'''
    (namespace,) = scan.scan_source(source, MODULE)[1]
    assert namespace == Namespace(MODULE, "get_module", (), "get_module returns SimpleNamespace(**functions)")
    assert namespace.keys_of("_op") == ()


def test_only_a_getter_that_declares_ops_has_a_namespace():
    source = GETTER + '''

def plain_helper(x):
    return SimpleNamespace(x=x)

def get_other_module():
    def _undeclared(x):
        return x

    return SimpleNamespace(undeclared=_undeclared)
'''
    namespaces = scan.scan_source(source, MODULE)[1]
    assert [(n.module, n.getter) for n in namespaces] == [(MODULE, "get_module")]


def test_an_op_declared_in_a_class_body_has_no_getter_and_its_class_no_namespace():
    source = '''
class Ops:
    @register_custom_op("flashinfer::in_class", mutates_args=())
    def _in_class(x):
        return x
'''
    (declaration,), namespaces = scan.scan_source(source, MODULE)
    assert (declaration.scope, declaration.getter, declaration.getter_parameters, declaration.key) == (
        ("class Ops",), None, None, "flashinfer.example.class Ops._in_class")
    assert namespaces == []


def test_defs_inside_if_else_try_except_finally_and_with_blocks_are_found():
    source = '''
if HAS_CUDA:
    @register_custom_op("flashinfer::in_if", mutates_args=())
    def _in_if(x):
        return x
else:
    @register_custom_op("flashinfer::in_else", mutates_args=())
    def _in_else(x):
        return x

try:
    @register_custom_op("flashinfer::in_try", mutates_args=())
    def _in_try(x):
        return x
except ImportError:
    @register_custom_op("flashinfer::in_except", mutates_args=())
    def _in_except(x):
        return x
else:
    @register_custom_op("flashinfer::in_try_else", mutates_args=())
    def _in_try_else(x):
        return x
finally:
    @register_custom_op("flashinfer::in_finally", mutates_args=())
    def _in_finally(x):
        return x

with LOCK:
    if HAS_CUDA:
        @register_custom_op("flashinfer::in_with_if", mutates_args=())
        def _in_with_if(x):
            return x

        @register_fake_op("flashinfer::in_with_if")
        def _in_with_if_fake(x):
            return x
'''
    declarations = scan.scan_source(source, MODULE)[0]
    assert [(d.name, d.scope) for d in declarations] == [
        (name, ()) for name in ("in_if", "in_else", "in_try", "in_except", "in_try_else", "in_finally",
                                "in_with_if")]
    assert declarations[-1].fake.function == "_in_with_if_fake"


def _op_source(name, padding=0):
    return f'@register_custom_op("flashinfer::{name}", mutates_args=())\ndef _op(x):\n    return x\n' + "#" * padding


def _write(path, text, mtime_ns):
    """Write ``text`` and give the file exactly ``mtime_ns``, so that the test decides what changed."""
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(mtime_ns, mtime_ns))


def _names(package):
    return {d.name for d in scan.scan(package).declarations}


T0 = 1_700_000_000 * 10**9
T1 = T0 + 10**9


def test_a_rewritten_file_is_read_again_when_only_its_mtime_or_only_its_size_changed(tmp_path):
    """The per-file caches are keyed by mtime and size together; each alone must be enough to read a file
    again, both for whether it declares anything and for what it declares."""
    package = tmp_path / "flashinfer"
    package.mkdir()
    _write(package / "__init__.py", "", T0)
    _write(package / "ops.py", _op_source("first"), T0)
    a, b = package / "a.py", package / "b.py"
    _write(a, "#" * len(_op_source("a_op")), T0)  # the size it will have once it declares
    _write(b, "# declares nothing yet\n", T0)
    assert _names(package) == {"first"}

    # Same sizes, a later mtime.
    _write(package / "ops.py", _op_source("other"), T1)
    _write(a, _op_source("a_op"), T1)
    assert _names(package) == {"other", "a_op"}

    # Other sizes, the same mtimes as before (a copy that keeps timestamps, a clock that did not move).
    _write(package / "ops.py", _op_source("another"), T1)
    _write(b, _op_source("b_op"), T0)
    assert _names(package) == {"another", "a_op", "b_op"}


def test_a_reinstalled_package_lists_the_files_it_did_not_have_before(tmp_path):
    # The file list is kept per installation, told apart by the mtime of the package's __init__.py.
    package = tmp_path / "flashinfer"
    package.mkdir()
    _write(package / "__init__.py", "", T0)
    _write(package / "ops.py", _op_source("first"), T0)
    assert _names(package) == {"first"}
    _write(package / "added.py", _op_source("added"), T1)
    _write(package / "__init__.py", "", T1)
    assert _names(package) == {"first", "added"}
