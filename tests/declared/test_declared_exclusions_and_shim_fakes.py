"""The declared-ops layer's rules (``declared/rules.py``) one by one: the fakes the shim writes where FlashInfer
wrote none or a wrong one, which declarations are left alone and why, and the types carried across an op.

The layer's tests (test_declared_ops_trace_on_cpu.py) reach these only through the installed FlashInfer's declarations: on
0.7.4 the derived sampling fake is never used (0.7.4 wrote its own), and a rule's words or a case no release's
declaration hits can change unseen (the generated mutants of rules.py: 45 % killed before this file). Tensors
are on the meta device: a fake must allocate where its inputs are.
"""

from __future__ import annotations

import inspect
import typing

import pytest
import torch

from _fp4_dynamo_shim.declared import adapters
from _fp4_dynamo_shim.declared import rules


def _described(tensors):
    return [(tuple(t.shape), t.dtype, t.device.type) for t in tensors]


def test_the_sampling_fake_gives_one_index_per_row_or_per_index_in_the_indices_dtype():
    """FlashInfer 0.6.7+ wrote this fake itself (sampling.py, _fake_min_p_sampling_from_probs without
    return_valid); 0.5.3-0.6.3 declared min_p_sampling_from_probs with none, and the shim's is that one."""
    samples = rules.DERIVED_FAKES[("flashinfer.sampling", "min_p_sampling_from_probs")]
    probs = torch.empty(4, 100, device="meta")
    assert _described([samples(probs)]) == [((4,), torch.int32, "meta")]
    indices = torch.empty(6, dtype=torch.int64, device="meta")
    assert _described([samples(probs, indices, min_p_val=0.1, deterministic=True)]) == [((6,), torch.int64, "meta")]
    assert _described([samples(probs=probs, indices=None)]) == [((4,), torch.int32, "meta")]


def test_the_merge_states_fake_replaces_flashinfers_and_allocates_on_the_inputs_device():
    import flashinfer.cascade

    replaced = rules.REPLACED_FAKES[("flashinfer.cascade", "merge_states")]
    v = torch.empty(5, 3, 8, 64, dtype=torch.bfloat16, device="meta")
    s = torch.empty(5, 3, 8, device="meta")
    assert _described(replaced.fake(v, s)) == [((5, 8, 64), torch.bfloat16, "meta"), ((5, 8), torch.float32, "meta")]
    flashinfers = flashinfer.cascade._fake_merge_states(v, s)
    assert _described(flashinfers) == [((5, 8, 64), torch.bfloat16, "cpu"), ((5, 8), torch.float32, "cpu")]
    assert replaced.still_wrong(inspect.getsource(flashinfer.cascade._fake_merge_states))
    assert not replaced.still_wrong("torch.empty(seq_len, num_heads, head_dim, dtype=v.dtype, device=v.device)")
    assert replaced.fault == "FlashInfer's allocates on the default device"


@pytest.mark.parametrize("module, getter, name, kind, reason", [
    ("flashinfer.fp4_quantization", rules.FP4_GETTER, "fp4_quantize_sm100", rules.FP4_LAYER,
     "covered by the FP4 layer, which makes each FP4 family function one op of its own"),
    ("flashinfer.fp4_quantization", rules.FP4_GETTER, "e2m1_and_ufp8sf_scale_to_float_sm100", rules.FP4_LAYER,
     "covered by the FP4 layer, which makes each FP4 family function one op of its own"),
    ("flashinfer.fp4_quantization", rules.FP4_GETTER, "something_else_sm100", rules.FP4_LAYER,
     "in get_fp4_quantization_module, the JIT module the FP4 layer builds: not registered twice; "
     "not part of the FP4 family either"),
    ("flashinfer.comm", None, "x", rules.OUT_OF_SCOPE, rules.EXCLUSIONS[0].reason),
    ("flashinfer.comm.trtllm_ar", "get_module", "x", rules.OUT_OF_SCOPE, rules.EXCLUSIONS[0].reason),
])
def test_what_is_left_alone_by_rule_says_why(module, getter, name, kind, reason):
    assert rules.excluded(module, getter, name) == (kind, reason)


@pytest.mark.parametrize("module, getter", [
    ("flashinfer.communication", None),  # a module whose name only starts like flashinfer.comm
    ("flashinfer.norm", None), ("flashinfer.sampling", "get_sampling_module"),
    ("flashinfer.fp4_quantization", "get_other_module"),
])
def test_everything_else_is_left_to_the_gate(module, getter):
    assert rules.excluded(module, getter, "fp4_quantize_sm100") is None


def test_an_exclusion_inside_a_getter_matches_only_that_getter():
    inside = rules.Exclusion("flashinfer.x", "why", getter="get_x")
    assert inside.matches("flashinfer.x", "get_x") and inside.matches("flashinfer.x.y", "get_x")
    assert not inside.matches("flashinfer.x", "get_y") and not inside.matches("flashinfer.x", None)
    assert not inside.matches("flashinfer.xy", "get_x")


@pytest.mark.parametrize("annotation, adapter", [
    (typing.Union[float, torch.Tensor], "tensor or number"), (typing.Union[torch.Tensor, float], "tensor or number"),
    (typing.Optional[typing.Union[float, torch.Tensor]], "tensor or number"),
    (typing.Union[int, torch.Tensor], "tensor or number"), (typing.Optional[torch.Generator], "torch.Generator (must be None)"),
    (torch.Generator, "torch.Generator (must be None)"), (torch.Tensor, None), (typing.List[int], None),
])
def test_each_type_the_schema_cannot_hold_has_its_adapter(annotation, adapter):
    found = adapters.adapter_for(annotation)
    assert (found.name if found else None) == adapter


def test_integers_travel_as_integers_and_floats_as_floats():
    assert adapters.adapter_for(typing.Union[int, torch.Tensor]).parts == (("", typing.Optional[torch.Tensor]),
                                                                         ("__number", typing.Optional[int]))
    assert adapters.adapter_for(typing.Union[float, torch.Tensor]).parts == (("", typing.Optional[torch.Tensor]),
                                                                           ("__number", typing.Optional[float]))


def test_an_annotation_that_cannot_be_compared_has_no_adapter():
    class Uncomparable:
        def __eq__(self, other):
            raise TypeError("no")

        __hash__ = object.__hash__

    assert adapters.adapter_for(Uncomparable()) is None


def test_a_sampling_result_crosses_the_op_as_a_list_and_comes_back_as_it_was():
    adapter = adapters.return_adapter_for(typing.Union[torch.Tensor, typing.Tuple[torch.Tensor, torch.Tensor]])
    assert adapter.schema_type == typing.List[torch.Tensor]
    one, two = torch.zeros(2), torch.ones(2)
    assert adapter.to_op(one) == [one] and adapter.to_op((one, two)) == [one, two]
    back = eval(adapter.from_op, {}, {"r": [one]})
    assert back is one
    assert eval(adapter.from_op, {}, {"r": [one, two]}) == (one, two)
    assert adapters.return_adapter_for(torch.Tensor) is None
