"""The declared layer on a stand-in release: each case a FlashInfer release may declare (a computed module-level
name, a non-literal ``mutates_args``, an op FlashInfer registered itself, a getter whose polyfill fails, ...), most of
which the installed release does not hold. The stand-in is a FlashInfer-like package written to a temporary directory,
its modules executed with no-op decorators, as FlashInfer's are when its custom ops are off.
"""

from __future__ import annotations

import builtins
import sys
import types

import pytest
import torch

import flashinfer
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.declared import declared_layer

from flashinfer_like import NO_OP_DECORATORS

WARNED = "fp4_dynamo_shim"  # the one warn-once logs under the package's logger


CASES = NO_OP_DECORATORS + '''
NAME = "PREFIX_computed"
WRITES = ("out",)

@register_custom_op("flashinfer::PREFIX_plain", mutates_args=())
def _plain(x: torch.Tensor) -> torch.Tensor:
    return x + 1

@register_fake_op("flashinfer::PREFIX_plain")
def _plain_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)

@register_custom_op("flashinfer::PREFIX_own", mutates_args=())
def _own(x: torch.Tensor) -> None:
    pass

@register_custom_op("flashinfer::PREFIX_untyped", mutates_args=("out",))
def _untyped(out: torch.Tensor, x: typing.Any) -> None:
    pass

@register_custom_op(f"flashinfer::{NAME}", mutates_args=())
def _computed(x: torch.Tensor) -> None:
    pass

_JOINED = "flashinfer::PREFIX_joined_"

@register_custom_op(_JOINED + "fwd", mutates_args=("out",))
def _joined(out: torch.Tensor) -> None:
    pass

@register_custom_op("flashinfer::PREFIX_listed", mutates_args=("out",))
def _listed(out: torch.Tensor, x: torch.Tensor, bare: bool) -> typing.Union[typing.List[torch.Tensor], torch.Tensor]:
    out.copy_(x * 3)
    return x + 1 if bare else [x + 1, x * 2]

@register_fake_op("flashinfer::PREFIX_listed")
def _listed_fake(out: torch.Tensor, x: torch.Tensor, bare: bool) -> typing.Union[typing.List[torch.Tensor], torch.Tensor]:
    return torch.empty_like(x) if bare else [torch.empty_like(x), torch.empty_like(x)]

@register_custom_op("flashinfer::PREFIX_written", mutates_args=WRITES)
def _written(out: torch.Tensor) -> None:
    pass

def outer():
    def inner():
        @register_custom_op("flashinfer::PREFIX_deep", mutates_args=())
        def _deep(x: torch.Tensor) -> None:
            pass
        return _deep
    return inner

@functools.cache
def get_module(kind: str = "silu"):
    fname = f"{kind}_PREFIX"

    @register_custom_op(f"flashinfer::{fname}", mutates_args=())
    def _op(x: torch.Tensor) -> torch.Tensor:
        return x

    @register_fake_op(f"flashinfer::{fname}")
    def _fake_op(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    return SimpleNamespace(**{fname: _op})

@functools.cache
def get_fp4_quantization_module(backend: str = "100"):
    @register_custom_op("flashinfer::fp4_quantize_sm100", mutates_args=())
    def fp4_quantize_sm100(x: torch.Tensor) -> None:
        pass

    @register_custom_op("flashinfer::PREFIX_fp4_other", mutates_args=())
    def fp4_other(x: torch.Tensor) -> None:
        pass

    return SimpleNamespace(fp4_quantize_sm100=fp4_quantize_sm100, fp4_other=fp4_other)

@functools.cache
def get_broken_module():
    @register_custom_op("flashinfer::PREFIX_first", mutates_args=("x",))
    def _first(x: torch.Tensor) -> None:
        pass

    @register_custom_op("flashinfer::PREFIX_second", mutates_args=("x",))
    def _second(x: torch.Tensor) -> None:
        pass

    @register_custom_op("flashinfer::PREFIX_unfaked", mutates_args=())
    def _unfaked(x: torch.Tensor) -> torch.Tensor:
        return x

    return SimpleNamespace(first=_first, second=_second, unfaked=_unfaked)
'''

COMM = NO_OP_DECORATORS + '''
@register_custom_op("flashinfer::PREFIX_all_reduce", mutates_args=("x",))
def _all_reduce(x: torch.Tensor) -> None:
    pass
'''

PREFIX = "layer_cases"
MODULE, COMM_MODULE = f"flashinfer.{PREFIX}", f"flashinfer.comm.{PREFIX}"


@pytest.fixture
def stand_in_release(own_layers, tmp_path, monkeypatch):
    """``apply(gate)``: the layer applied to a FlashInfer-like package in tmp_path (its ``__init__.py`` is what
    ``flashinfer.__file__`` names while the layer reads), whose ``layer_cases`` module is imported (executed
    here) and whose ``comm/layer_cases.py`` is not; ``flashinfer::layer_cases_own`` is an op FlashInfer
    registered itself."""
    package = tmp_path / "flashinfer"
    (package / "comm").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = CASES.replace("PREFIX", PREFIX)
    (package / f"{PREFIX}.py").write_text(source)
    (package / "comm" / f"{PREFIX}.py").write_text(COMM.replace("PREFIX", PREFIX))
    module = types.ModuleType(MODULE)
    module.__file__ = str(package / f"{PREFIX}.py")
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    own = torch.library.Library("flashinfer", "FRAGMENT")
    own.define(f"{PREFIX}_own(Tensor x) -> ()")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, MODULE, module)
        patch.setattr(flashinfer, "__file__", str(package / "__init__.py"))
        try:
            yield lambda gate="all": own_layers(gate)
        finally:
            own._destroy()


def _key(name, scope=()):
    return ".".join((MODULE, *scope, name))


def _failing_broken_getter(monkeypatch):
    """get_broken_module's polyfill is built, then its generated namespace does not compile (stand-in: Python's
    ``compile`` refuses that one source): the members it had built must not stay registered, the one it had
    refused keeps its reason."""
    compile_source = builtins.compile

    def refusing(source, filename, *args, **kwargs):
        if filename.endswith(f"{MODULE}.get_broken_module>"):
            raise SyntaxError("injected: the polyfill did not compile")
        return compile_source(source, filename, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", refusing)


def test_each_case_a_release_may_declare_is_registered_or_refused_with_its_reason(stand_in_release, monkeypatch):
    _failing_broken_getter(monkeypatch)
    layer = declared_layer.describe(stand_in_release())
    assert (layer["state"], layer["scanned"]) == ("registered", "every file of the package")
    refused = {key: (entry["kind"], entry["reason"]) for key, entry in layer["not_registered"].items()}
    assert refused[_key("_own")] == (
        "FlashInfer's own op", f"flashinfer::{PREFIX}_own is already a registered op in this process (FlashInfer's own)")
    assert refused[_key("_untyped")] == ("not expressible", "schema: Parameter x has unsupported type typing.Any")
    assert refused[_key("_computed")] == ("not expressible", "op name computed at run time (f'flashinfer::{NAME}')")
    assert refused[_key("_written")] == ("not expressible", "mutates_args is not a literal")
    assert refused[_key("_deep", ("outer", "inner"))] == (
        "not expressible", "declared inside outer.inner, which no module-level getter returns")
    fp4 = ("get_fp4_quantization_module",)
    assert refused[_key("fp4_quantize_sm100", fp4)] == (
        "covered by the FP4 layer", "covered by the FP4 layer, which makes each FP4 family function one op of its own")
    assert refused[_key("fp4_other", fp4)][0] == "covered by the FP4 layer"
    assert refused[_key("fp4_other", fp4)][1].startswith("in get_fp4_quantization_module, the JIT module the FP4 layer builds")
    assert refused[f"{COMM_MODULE}._all_reduce"] == (
        "out of scope", "distributed communication (process groups, IPC handles, shared workspaces): outside a "
                        "single-GPU traced region; out of scope")
    # A getter's computed name is the getter's business: the op is named after the function. A name joined from the
    # module's string constants is in the text.
    assert layer["registered"] == {_key("_plain"): f"{declared_layer.NAMESPACE}::{PREFIX}_plain",
                                   _key("_joined"): f"{declared_layer.NAMESPACE}::{PREFIX}_joined_fwd",
                                   _key("_listed"): f"{declared_layer.NAMESPACE}::{PREFIX}_listed",
                                   _key("_op", ("get_module",)): f"{declared_layer.NAMESPACE}::op"}
    assert sorted(layer["by_module"]) == [COMM_MODULE, MODULE]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("bare", [True, False], ids=["one tensor", "a list"])
def test_an_op_that_writes_in_place_returns_a_list_or_one_tensor_as_the_function_did(stand_in_release, bare, backend):
    """torch.compile cannot functionalize an op that writes in place and returns ``Tensor[]``: such an op carries its
    list padded to a fixed width, with a marker saying its length or that one tensor came back bare (prims_ts' fp8
    MoE returns ``out if do_finalize else [out, ...]``). Compiled code gets back what eager got, type included."""
    layer = declared_layer.describe(stand_in_release())
    assert layer["registered"][_key("_listed")] == f"{declared_layer.NAMESPACE}::{PREFIX}_listed"
    listed = sys.modules[MODULE]._listed
    x = torch.arange(6.0).reshape(2, 3)
    eager_out, compiled_out = torch.zeros(2, 3), torch.zeros(2, 3)
    eager = listed(eager_out, x, bare)
    torch._dynamo.reset()
    compiled = torch.compile(listed, fullgraph=True, backend=backend)(compiled_out, x, bare)
    assert type(compiled) is type(eager)
    for got, want in zip(*(([r] if bare else r) for r in (compiled, eager))):
        assert (got.shape, got.dtype) == (want.shape, want.dtype) and torch.equal(got, want)
    assert len([compiled] if bare else compiled) == len([eager] if bare else eager)
    assert torch.equal(compiled_out, eager_out) and torch.equal(compiled_out, x * 3)


def test_a_getter_whose_polyfill_fails_lists_the_members_it_had_built_as_failed(stand_in_release, monkeypatch,
                                                                               caplog):
    """Not STRICT (the layer's default): listed and warned once, the layer stays registered."""
    _failing_broken_getter(monkeypatch)
    switches.warned.clear()  # said once per process: the same failure may have been said by another test
    with caplog.at_level("WARNING", logger=WARNED):
        layer = declared_layer.describe(stand_in_release())
    broken = ("get_broken_module",)
    first, second = _key("_first", broken), _key("_second", broken)
    reason = "get_broken_module's polyfill: SyntaxError: injected: the polyfill did not compile"
    assert layer["state"] == "registered" and layer["failed"] == [first, second]
    assert layer["not_registered"][first] == layer["not_registered"][second] == {"kind": "failed", "reason": reason}
    assert layer["not_registered"][_key("_unfaked", broken)] == {
        "kind": "not expressible", "reason": "returns a value and FlashInfer wrote no fake for it"}
    assert [r.getMessage() for r in caplog.records if r.name == WARNED] == [
        "fp4_dynamo_shim: 2 of FlashInfer's declared ops failed to register and stay untraceable "
        f"(status()['flashinfer_ops']['failed']): {first}: {reason}; {second}: {reason}"]
