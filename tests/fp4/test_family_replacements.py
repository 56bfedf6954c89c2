"""The FP4 family's edges, case by case: what ``build_replacements`` does with each kind of function it meets,
what a compiled call that no op carries says, and what the members hand their ops and ``fp4_quantize``.

``build_replacements`` runs here on a made-up table (``family.MEMBERS`` swapped for hand-written members) over
made-up modules, so every kind of function (absent, already the shim's, unmirrorable, ordinary, outside the
fp4 module) can be met in one run; ``tests/fp4/test_fp4_family_traces_and_matches_eager.py`` shows the real table against the installed
FlashInfer. The members' builders (``_mxfp4_quantize``, ``_experts``, ...) are called afresh in each test, as
``test_family_table.py`` explains: the table built at import never reaches a mutant of a builder.
"""

from __future__ import annotations

import sys
import types

import flashinfer
import pytest
import torch
from packaging.specifiers import SpecifierSet

from _fp4_dynamo_shim.fp4 import family
from _fp4_dynamo_shim.fp4 import replacement

EVERY_RELEASE = SpecifierSet()


class Recorder:
    """Stands in for the family's ops and for the shim's ``fp4_quantize``: records each call, computes nothing."""

    def __init__(self):
        self.calls = []

    def op(self, name):
        def call(*args):
            self.calls.append((name, args))
            return ("values", "scales") if name in ("fp4_experts_quantize", "fp4_batched_quantize") else name
        return call

    def fp4_quantize(self, *args, **kwargs):
        self.calls.append(("fp4_quantize", args, kwargs))
        return "quantized"


def _context(recorder, recipe=None):
    context = family.Context(flashinfer, recorder.fp4_quantize, recipe)
    context.cuda = False  # keep tensors where they are, whatever this machine has
    return context


# --- build_replacements: one report line per function, and only ordinary functions wrapped ----------------------

def _plain(a, b=2):
    return ("FlashInfer's own", a, b)


def _variadic(*tensors):  # no exact parameter list for build_forwarding to reproduce
    return tensors


def _gemm(a):
    return ("FlashInfer's own gemm", a)


def _implement(context, arguments):
    """Hands back what it was given, or refuses ``a="refuse"`` so that an eager call goes to the original."""
    if arguments["a"] == "refuse":
        return family.Unsupported("a='refuse'")
    return ("implemented", context, arguments)


@pytest.fixture
def made_up_release(monkeypatch):
    """A fp4 module and a second module in sys.modules, and a table whose members meet every case in turn.

    Each member that is reported and skipped comes before others, so stopping at it (instead of going on to
    the next member) leaves later members out of the report."""
    fp4 = types.ModuleType("made_up_fp4")
    fp4.SfLayout = flashinfer.SfLayout
    fp4.plain, fp4.variadic = _plain, _variadic
    fp4.already = replacement.build_forwarding(_plain, lambda **arguments: "the shim's")
    gemm = types.ModuleType("made_up_gemm")
    gemm.gemm = _gemm
    monkeypatch.setitem(sys.modules, fp4.__name__, fp4)
    monkeypatch.setitem(sys.modules, gemm.__name__, gemm)
    monkeypatch.setattr(family, "MEMBERS", (
        family.Member("missing", EVERY_RELEASE, _implement),
        family.Member("already", EVERY_RELEASE, _implement),
        family.Member("variadic", EVERY_RELEASE, _implement),
        family.Member("plain", EVERY_RELEASE, _implement),
        family.Member("gemm", EVERY_RELEASE, _implement, module="made_up_gemm"),
    ))
    return fp4, gemm


def test_each_function_is_reported_and_the_walk_goes_on_past_the_ones_it_skips(made_up_release):
    fp4, gemm = made_up_release
    replaced, report = family.build_replacements("0.6.12", fp4, "fp4_quantize replacement", "recipe")
    assert report == {
        "missing": "absent: module 'made_up_fp4' has no attribute 'missing'",
        "already": "already a replacement",  # the shim's own function is never wrapped a second time
        "variadic": "left alone: parameter 'tensors' is variadic positional",
        "plain": "op-backed (made_up_fp4)",
        "gemm": "op-backed (made_up_gemm)",  # looked up in its own module, not in the fp4 module
    }
    assert {name: original for name, (original, _) in replaced.items()} == {"plain": _plain, "gemm": _gemm}
    assert all(replacement.is_shim(function) for _, function in replaced.values())


def test_a_replacement_hands_its_member_the_release_context_and_falls_back_on_the_original(made_up_release):
    fp4, _ = made_up_release
    replaced, _ = family.build_replacements("0.6.12", fp4, "fp4_quantize replacement", "recipe")
    original, forwarding = replaced["plain"]
    said, context, arguments = forwarding(1)
    assert (said, arguments) == ("implemented", {"a": 1, "b": 2})
    assert (context.fp4_quantize, context.SfLayout, context.recipe) == ("fp4_quantize replacement",
                                                                         flashinfer.SfLayout, "recipe")
    # What the member refuses runs as FlashInfer's own function, eagerly.
    assert forwarding("refuse", b=3) == ("FlashInfer's own", "refuse", 3)


# --- make_dispatch: a refused call under torch.compile -----------------------------------------------------------

def test_a_refused_call_runs_the_original_eagerly_and_says_what_to_do_when_compiled():
    member = family.Member("quantize_it", EVERY_RELEASE, lambda context, arguments: family.Unsupported("out=..."))
    dispatch = family.make_dispatch(member, None, lambda x: x + 1)
    assert torch.equal(dispatch(x=torch.ones(2)), torch.full((2,), 2.0))
    compiled = torch.compile(lambda x: dispatch(x=x), fullgraph=True, backend="eager")
    try:
        with pytest.raises(Exception) as refused:
            compiled(torch.ones(2))
    finally:
        torch._dynamo.reset()
    # Dynamo wraps the error; the sentence the user reads is pinned word for word, case included.
    assert ("fp4_dynamo_shim: quantize_it(out=...) cannot run inside torch.compile: no custom op carries it. "
            "Call it outside the compiled region.") in str(refused.value)


# --- what members hand on ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_dead_global_scale", [True, False])
@pytest.mark.parametrize("backend, carried", [(None, True), ("cuda", True), ("auto", True), ("cutlass", False)])
def test_mxfp4_quantize_carries_the_cuda_and_auto_backends_and_refuses_others(with_dead_global_scale, backend,
                                                                            carried):
    # FlashInfer's "cuda" and "auto" backends run the kernel fp4_quantize mirrors; any other backend is
    # FlashInfer's own business (its function eagerly, an error when compiled).
    recorder = Recorder()
    arguments = dict(a=torch.ones(2, 32, dtype=torch.bfloat16), sfLayout=flashinfer.SfLayout.layout_128x4)
    if backend is not None:
        arguments["backend"] = backend
    result = family._mxfp4_quantize(with_dead_global_scale)(_context(recorder), arguments)
    if carried:
        assert result == "quantized" and [call[0] for call in recorder.calls] == ["fp4_quantize"]
    else:
        assert isinstance(result, family.Unsupported) and result.reason == "backend='cutlass'"
        assert recorder.calls == []


@pytest.fixture
def ops(monkeypatch):
    """The family's ops, as the members reach them, stood in by a recorder of each call (no GPU kernels here)."""
    recorder = Recorder()
    monkeypatch.setattr(family, "op", recorder.op)
    return recorder


class RecordingRecipe:
    """Stands in for ``replacement.Recipe``: records the input it is asked about and answers code 7."""

    def __init__(self):
        self.inputs = []

    def code(self, setting, input, sf_vec_size, sf_use_ue8m0, compiling):
        self.inputs.append(input)
        return 7


MASK = {"mask": torch.tensor([4, 2], dtype=torch.int32)}
#: (builder, its flag, the op its member calls, arguments beyond the common ones)
BATCHED_AND_EXPERTS = [
    ("_nvfp4_batched_quantize", False, "fp4_batched_quantize", {}),
    ("_nvfp4_batched_quantize", True, "fp4_batched_quantize", {}),
    ("_experts", False, "fp4_experts_quantize", MASK),
    ("_experts", True, "fp4_experts_quantize", MASK),
]


@pytest.mark.parametrize("builder, flag, op_name, extra", BATCHED_AND_EXPERTS,
                         ids=[f"{b}-{f}" for b, f, _, _ in BATCHED_AND_EXPERTS])
def test_the_batched_and_experts_quantizers_ask_the_recipe_about_their_input(monkeypatch, ops, builder, flag,
                                                                            op_name, extra):
    # The recipe decides from the input (FP8 inputs ignore an environment recipe, as FlashInfer's kernels do),
    # so it must be shown the input being quantized.
    recorder, recipe = ops, RecordingRecipe()
    monkeypatch.setattr(family, "experts_views", lambda values, scales: (values, scales))
    a = torch.ones(2, 4, 32, dtype=torch.bfloat16)
    arguments = dict(a=a, a_global_sf=torch.tensor([2.0]), sf_vec_size=16, nvfp4_4over6=None, **extra)
    getattr(family, builder)(flag)(_context(recorder, recipe), arguments)
    assert len(recipe.inputs) == 1 and recipe.inputs[0] is a
    (name, args), = recorder.calls
    assert name == op_name and args[-1] == 7


def test_mxfp4_dequantize_hands_its_op_host_copies_of_real_tensors_and_meta_ones_as_they_are(monkeypatch, ops):
    """FlashInfer copies both inputs to the host before its CPU kernel; so does the shim.

    Stand-in: there is no GPU here and a CPU tensor's ``cpu()`` is itself, so ``Tensor.cpu`` is replaced by a
    recorder that hands back a fresh copy; the test shows the copy is made and passed on, not that a CUDA
    tensor lands on the host (tests/gpu/test_gpu_family.py calls mxfp4_dequantize with CUDA tensors)."""
    recorder, copies, real_cpu = ops, [], torch.Tensor.cpu

    def cpu(tensor, *args, **kwargs):
        copies.append(real_cpu(tensor, *args, **kwargs).clone())
        return copies[-1]

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    a_fp4, a_sf = torch.zeros(2, 16, dtype=torch.uint8), torch.ones(2, 1, dtype=torch.uint8)
    family._mxfp4_dequantize(_context(recorder), dict(a_fp4=a_fp4, a_sf=a_sf))
    (_, (values, scales, *_)), = recorder.calls
    assert [t.data_ptr() for t in (values, scales)] == [t.data_ptr() for t in copies]
    assert copies[0].data_ptr() != a_fp4.data_ptr() and copies[1].data_ptr() != a_sf.data_ptr()

    copies.clear()  # meta tensors hold nothing to copy: handed on untouched
    meta = dict(a_fp4=a_fp4.to("meta"), a_sf=a_sf.to("meta"))
    family._mxfp4_dequantize(_context(recorder), meta)
    assert copies == [] and all(t.is_meta for t in recorder.calls[-1][1][:3])


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_mxfp4_dequantize_passes_a_float32_global_scale_whatever_the_default_dtype(ops, device):
    # The op's global scale is FlashInfer's float32 one (its kernel reads it through a float pointer); under
    # torch.set_default_dtype(torch.float64) a bare torch.ones would be float64. With ufp8_type 0 the value is
    # not read today, so this holds the call itself, as test_family_table.py's reviewed calls do.
    recorder = ops
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        family._mxfp4_dequantize(_context(recorder), dict(a_fp4=torch.zeros(2, 16, dtype=torch.uint8, device=device),
                                                          a_sf=torch.ones(2, 1, dtype=torch.uint8, device=device)))
    finally:
        torch.set_default_dtype(default)
    (_, (_, _, global_scale, *rest)), = recorder.calls
    assert (global_scale.dtype, global_scale.device.type, global_scale.tolist() if device == "cpu" else None) == \
        (torch.float32, device, [1.0] if device == "cpu" else None)
    assert rest == [32, 0, True, False]


@pytest.mark.parametrize("available", [True, False])
def test_inputs_move_to_the_gpu_exactly_when_torch_sees_one(monkeypatch, available):
    """FlashInfer moves the quantizers' inputs to the current CUDA device; with no GPU the shim leaves them.

    Stand-in: ``torch.cuda.is_available`` answers as told and ``Tensor.cuda`` records the call instead of
    copying, so the test shows the decision and the call made, not a real copy to a device (tests/gpu does)."""
    moved = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: moved.append(tensor) or "on the GPU")
    context = family.Context(flashinfer, None, None)
    assert context.cuda is available
    x = torch.ones(2)
    assert family._to_cuda(context, x) is ("on the GPU" if available else x)
    assert [id(tensor) for tensor in moved] == ([id(x)] if available else [])
