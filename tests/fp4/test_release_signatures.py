"""How ``replacement.build`` turns a release's ``fp4_quantize`` signature into the replacement, case by case.

``apply()`` builds the replacement once, for the installed release, with the recipe and target row it has already
worked out; what ``build`` does for other releases' signatures, without a target row, without a recipe, or with an
older row's direct path is only seen by building it here. The originals are made up with two releases' parameter lists
(0.7.4's and an early one's) and record how they are called; the module
is a made-up one with FlashInfer's two 4over6 functions, recording too. Calls run on CPU tensors through the
reference quantizer; the direct path reaches a recording stand-in for the GPU's JIT entry
(``stand_in_gpu.reference_entry``; its limits: the reference's bytes and layouts, not the kernel's).
"""

from __future__ import annotations

import types

import pytest
import torch

import stand_in_gpu
from _fp4_dynamo_shim.errors import InvalidArgumentError
from _fp4_dynamo_shim.fp4 import quantize_op, fp4_releases
from _fp4_dynamo_shim.fp4 import replacement
from nvfp4_inputs import nvfp4_input

UNSET = object()  # stands in for FlashInfer's "nvfp4_4over6 left out" sentinel


class Original:
    """Records the calls FlashInfer's own function gets (the shim hands it what its op cannot carry)."""

    def __init__(self):
        self.calls = []

    def record(self, **arguments):
        self.calls.append(arguments)
        return "FlashInfer's own outputs"


def release_0_7_4(recorder):
    """An original with 0.7.4's parameter list (0.7.1 has the same names)."""
    def fp4_quantize(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True,
                     is_sf_8x4_layout=False, is_global_scale_inversed=False, enable_pdl=None, backend="auto",
                     nvfp4_4over6=UNSET, *, batch_invariant=False):
        return recorder.record(**{name: value for name, value in locals().items() if name != "recorder"})
    return fp4_quantize


def early_release(recorder):
    """An original with an early release's parameter list: no inversed scale (from 0.6.11), no backend (0.6.3 has
    none), no 4over6 or batch_invariant."""
    def fp4_quantize(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True,
                     is_sf_8x4_layout=False, enable_pdl=None):
        return recorder.record(**{name: value for name, value in locals().items() if name != "recorder"})
    return fp4_quantize


def recording_module():
    """FlashInfer's fp4 module as the 4over6 recipe uses it: its two functions, recording their calls."""
    calls = []

    def resolve_nvfp4_4over6(setting):
        calls.append(("resolve", setting))
        return f"resolved {setting}"

    def nvfp4_4over6_code(resolved):
        calls.append(("code", resolved))
        return 0  # the default recipe, so the reference runs as for nvfp4_4over6=None

    module = types.SimpleNamespace(resolve_nvfp4_4over6=resolve_nvfp4_4over6, nvfp4_4over6_code=nvfp4_4over6_code)
    return module, calls


def reference_bytes(x, scale, sf_vec_size=16, sf_use_ue8m0=False, swizzled=True, is_8x4=False, inversed=False):
    return torch.ops.fp4_dynamo_shim.fp4_quantize(x, scale, sf_vec_size, sf_use_ue8m0, swizzled, is_8x4, inversed,
                                                  None, 0)


def same(got, want):
    return all(g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w) for g, w in zip(got, want))


# --- the signature: only parameters the core knows ------------------------------------------------------------

def test_a_release_with_parameters_the_shim_does_not_know_is_refused_by_name():
    def fp4_quantize(input, global_scale=None, sf_vec_size=16, row_scales=None, cluster=1):
        pass

    with pytest.raises(TypeError) as refused:
        replacement.build(fp4_quantize, recording_module()[0])
    assert str(refused.value) == "fp4_quantize has parameters the shim does not know: row_scales, cluster"


# --- the 4over6 recipe: worked out from the original and its module unless given --------------------------------

def test_without_a_recipe_build_works_out_the_4over6_recipe_from_the_original_and_its_module():
    original, (module, resolved) = Original(), recording_module()
    replaced = replacement.build(release_0_7_4(original), module)
    x, scale = nvfp4_input(3, 64)
    assert same(replaced(x, scale, nvfp4_4over6="a config"), reference_bytes(x, scale))
    assert resolved == [("resolve", "a config"), ("code", "resolved a config")]
    assert original.calls == []


def test_a_recipe_given_to_build_is_the_one_its_calls_use():
    original, (module, from_module) = Original(), recording_module()
    given_module, from_given = recording_module()
    replaced = replacement.build(release_0_7_4(original), module, replacement.Recipe(given_module, UNSET))
    x, scale = nvfp4_input(3, 64)
    replaced(x, scale, nvfp4_4over6="a config")
    assert from_given == [("resolve", "a config"), ("code", "resolved a config")]
    assert from_module == []


# --- what the op cannot carry goes to FlashInfer's own function, eagerly -----------------------------------------

@pytest.mark.parametrize("argument", [{"backend": "cute-dsl"}, {"batch_invariant": True}], ids=lambda a: next(iter(a)))
def test_an_argument_the_op_cannot_carry_reaches_the_original_even_without_4over6(argument):
    # nvfp4_4over6=None is the one value that would otherwise take the direct or general path.
    original = Original()
    replaced = replacement.build(release_0_7_4(original), recording_module()[0])
    x, scale = nvfp4_input(3, 64)
    assert replaced(x, scale, nvfp4_4over6=None, **argument) == "FlashInfer's own outputs"
    assert original.calls == [{**dict(input=x, global_scale=scale, sf_vec_size=16, sf_use_ue8m0=False,
                                      is_sf_swizzled_layout=True, is_sf_8x4_layout=False,
                                      is_global_scale_inversed=False, enable_pdl=None, backend="auto",
                                      nvfp4_4over6=None, batch_invariant=False), **argument}]


# --- a release whose signature lacks parameters (before 0.6.11), built without a target row ---------------------

def test_a_release_without_the_inversed_scale_parameter_quantizes_with_a_plain_scale():
    original = Original()
    replaced = replacement.build(early_release(original), recording_module()[0])  # no target row: no direct path
    x, scale = nvfp4_input(3, 64, seed=5)
    assert same(replaced(x, scale), reference_bytes(x, scale, inversed=False))
    assert same(replaced(x, scale, 32, True, False), reference_bytes(x, scale, 32, True, False))
    assert original.calls == []


def test_a_release_without_a_backend_parameter_compiles_to_the_op():
    # The core gets the value of every parameter the release lacks: backend "cuda", i.e. the op's kernel.
    replaced = replacement.build(early_release(Original()), recording_module()[0])
    x, scale = nvfp4_input(3, 64, seed=6)
    compiled = torch.compile(lambda t, s: replaced(t, s), fullgraph=True, backend="eager")
    assert same(compiled(x, scale), reference_bytes(x, scale))


# --- the general path's own error for a non-tensor input --------------------------------------------------------

@pytest.mark.parametrize("with_target", [False, True], ids=["general path only", "direct path first"])
def test_a_non_tensor_input_on_the_general_path_gets_the_shims_error_and_no_chained_one(with_target):
    # nvfp4_4over6=None keeps the call off the core, whose own check would say the same.
    target = quantize_op.active_target() if with_target else None
    replaced = replacement.build(release_0_7_4(Original()), recording_module()[0], None, target)
    with pytest.raises(InvalidArgumentError) as raised:
        replaced([[1.0] * 64], torch.tensor([1.0]), nvfp4_4over6=None)
    assert str(raised.value) == "fp4_quantize: input must be a torch.Tensor, got list"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


# --- the direct path of releases whose swizzled scale factors are (-1, K/16) (before 0.6.8) ---------------

UNPADDED = next(target for target in fp4_releases.TARGETS if not target.swizzled_sf_padded_columns)


@pytest.fixture
def unpadded_entry(target_row, device_state):
    """The first unpadded row (0.5.3 up to 0.6.7) is the release's; CPU tensors take the direct path to a
    recording reference entry."""
    target_row(UNPADDED)
    calls = []
    device_state(**stand_in_gpu.direct_path_on_cpu(stand_in_gpu.reference_entry(calls)))
    return calls


def unpadded_replacement():
    return replacement.build(early_release(Original()), recording_module()[0], None, UNPADDED)


@pytest.mark.parametrize("columns", [64, 128, 192])
def test_an_unpadded_release_takes_the_direct_path_when_k_over_16_is_a_multiple_of_four(unpadded_entry, columns):
    x, scale = nvfp4_input(3, columns, seed=columns)
    got = unpadded_replacement()(x, scale)
    assert unpadded_entry == [((3, columns), (3, columns // 2), (128, columns // 16))]
    assert same(got, reference_bytes(x, scale))


@pytest.mark.parametrize("columns", [80, 96, 112])  # K/16 % 4 = 1, 2, 3
def test_an_unpadded_release_leaves_other_widths_to_the_general_path_and_its_reshape_error(unpadded_entry, columns):
    # Its (-1, K/16) view of a buffer padded to K/16 rounded up to 4 has a remainder: FlashInfer fails there.
    replaced = unpadded_replacement()
    x, scale = nvfp4_input(3, columns)
    with pytest.raises(RuntimeError, match=rf"shape '\[-1, {columns // 16}\]' is invalid for input of size"):
        replaced(x, scale)
    assert unpadded_entry == []
