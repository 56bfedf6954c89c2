"""What each family member makes of FlashInfer's arguments, pinned per argument set in a reviewed file, for the
table as imported and for the table built afresh.

``family.MEMBERS`` is built once, when the module is imported, by the builders ``_nvfp4_quantize``,
``_mxfp4_quantize``, ``_block_scale_interleave``, ``_nvfp4_batched_quantize`` and ``_experts``; a generated
mutant of a builder exists only when the module's source runs again (mutmut's run of the family group left
hundreds of them unreached). This test runs the source again (``runpy.run_module``) and feeds each member,
fresh and installed, the same arguments with a recording context and a recording ``op``: the calls they make
(which op or ``fp4_quantize``, with what), what they refuse (``Unsupported`` and its reason) and what they
raise must equal ``tests/data/family_calls.json`` (rewrite it with ``python tests/fp4/test_family_table.py``
and review the diff). The recorders stand in for the ops themselves, which the family tests run.
"""

from __future__ import annotations

import enum
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from _fp4_dynamo_shim.errors import InvalidArgumentError
from _fp4_dynamo_shim.fp4 import family


class SfLayout(enum.IntEnum):  # FlashInfer's values (tllm_enums.SfLayout)
    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


GOLDEN = Path(__file__).resolve().parents[1] / "data" / "family_calls.json"


def _canonical(value):
    """JSON-ready: tensors as shape, dtype, device and their bytes in hex (NaN-safe)."""
    if isinstance(value, torch.Tensor):
        data = None if value.is_meta else bytes(value.reshape(-1).contiguous().view(torch.uint8).tolist()).hex()
        return ["tensor", list(value.shape), str(value.dtype), str(value.device), data]
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return [[k, _canonical(v)] for k, v in sorted(value.items())]
    if isinstance(value, enum.Enum):
        return ["enum", int(value)]
    if isinstance(value, torch.dtype):
        return str(value)
    return value


class Recorder:
    def __init__(self):
        self.calls = []

    def op(self, name):
        def call(*args, **kwargs):
            self.calls.append(["op", name, _canonical(args), _canonical(kwargs)])
            return ("values", "scales") if name == "fp4_experts_quantize" else ("op result", name)
        return call

    def fp4_quantize(self, *args, **kwargs):
        self.calls.append(["fp4_quantize", _canonical(args), _canonical(kwargs)])
        return "quantized"


class Recipe:
    def code(self, *args):
        return ["recipe", _canonical(args[:1]), list(args[2:])]


def _context(recorder, with_recipe):
    context = family.Context(None, recorder.fp4_quantize, Recipe() if with_recipe else None)
    context.SfLayout, context.cuda = SfLayout, False
    return context


def _x(*shape, dtype=torch.bfloat16):
    return (torch.arange(torch.tensor(shape).prod().item(), dtype=torch.float32).reshape(shape) / 7 - 3).to(dtype)


NVFP4 = dict(a=_x(4, 32), a_global_sf=torch.tensor([2.0]), sfLayout=SfLayout.layout_128x4, sf_vec_size=16,
             enable_pdl=None)
ARGUMENTS = {
    "nvfp4_quantize": [NVFP4, {**NVFP4, "sfLayout": SfLayout.layout_8x4}, {**NVFP4, "sfLayout": SfLayout.layout_linear},
                       {**NVFP4, "backend": "cuda"}, {**NVFP4, "backend": "auto"}, {**NVFP4, "backend": "cute-dsl"},
                       {**NVFP4, "do_shuffle": True}, {**NVFP4, "do_shuffle": False}, {**NVFP4, "per_token_activation": True},
                       {**NVFP4, "batch_invariant": True}, {**NVFP4, "out_scale": torch.ones(1)},
                       {**NVFP4, "expanded_idx_to_permuted_idx": torch.zeros(4, dtype=torch.int32)},
                       {**NVFP4, "nvfp4_4over6": True}, {**NVFP4, "enable_pdl": True}],
    "mxfp4_quantize": [dict(a=_x(4, 64), sfLayout=SfLayout.layout_linear),
                       dict(a=_x(4, 64), sfLayout=SfLayout.layout_8x4), dict(a=_x(4, 64), sfLayout=SfLayout.layout_128x4),
                       dict(a=_x(4, 64), backend="cutlass", sfLayout=0), dict(a=_x(4, 64), backend="auto", sfLayout=0),
                       dict(a=_x(4, 64), batch_invariant=True, sfLayout=0),
                       dict(a=torch.tensor([[float("nan")] * 32 + [2.0] * 32]), sfLayout=0)],
    "block_scale_interleave": [dict(unswizzled_sf=torch.arange(8, dtype=torch.uint8).reshape(2, 4)),
                               dict(unswizzled_sf=_x(2, 4)), dict(unswizzled_sf=_x(2, 4, dtype=torch.float32)),
                               dict(unswizzled_sf=torch.zeros(2, 4, dtype=torch.uint8), out=torch.zeros(1))],
    "e2m1_and_ufp8sf_scale_to_float": [
        dict(e2m1_tensor=torch.zeros(2, 8, dtype=torch.uint8), ufp8_scale_tensor=torch.ones(4, dtype=torch.uint8),
             global_scale_tensor=torch.ones(1), sf_vec_size=16, ufp8_type=1, is_sf_swizzled_layout=True),
        dict(e2m1_tensor=torch.zeros(2, 8, dtype=torch.uint8), ufp8_scale_tensor=torch.ones(4, dtype=torch.uint8),
             global_scale_tensor=None, sf_vec_size=16, ufp8_type=1, is_sf_swizzled_layout=False),
        dict(e2m1_tensor=torch.zeros(2, 8, dtype=torch.uint8), ufp8_scale_tensor=torch.ones(4, dtype=torch.uint8),
             global_scale_tensor=torch.ones(1), sf_vec_size=32, ufp8_type=0, is_sf_swizzled_layout=True,
             is_sf_8x4_layout=True)],
    "mxfp4_dequantize": [dict(a_fp4=torch.zeros(2, 16, dtype=torch.uint8), a_sf=torch.ones(2, 1, dtype=torch.uint8)),
                         *[dict(a_fp4=torch.zeros(2, 16, dtype=torch.uint8), a_sf=torch.ones(2, 1, dtype=torch.uint8),
                                sfLayout=layout) for layout in SfLayout],
                         dict(a_fp4=torch.zeros(2, 16, dtype=torch.uint8, device="meta"),
                              a_sf=torch.ones(2, 1, dtype=torch.uint8, device="meta"))],
    "mxfp4_dequantize_host": [dict(weight=torch.zeros(2, 16, dtype=torch.uint8), scale=torch.ones(2, 1, dtype=torch.uint8),
                                   group_size=32)],
    "nvfp4_batched_quantize": [dict(a=_x(2, 4, 32), a_global_sf=torch.tensor([2.0]), sf_vec_size=16),
                               dict(a=_x(2, 4, 32), a_global_sf=torch.tensor([2.0, 3.0]), sf_vec_size=16),
                               dict(a=_x(2, 4, 32), a_global_sf=torch.tensor([2.0]), sf_vec_size=16, nvfp4_4over6=True)],
    "scaled_fp4_grouped_quantize": [dict(a=_x(2, 4, 32), a_global_sf=torch.tensor([2.0, 3.0]),
                                         mask=torch.tensor([4, 2], dtype=torch.int32)),
                                    dict(a=_x(2, 4, 32), a_global_sf=torch.tensor([2.0, 3.0]),
                                         mask=torch.tensor([4, 2], dtype=torch.int32), nvfp4_4over6=False)],
    "silu_and_mul_scaled_nvfp4_experts_quantize": [dict(a=_x(2, 4, 64), a_global_sf=torch.tensor([2.0, 3.0]),
                                                        mask=torch.tensor([4, 2], dtype=torch.int32))],
    "mm_fp4": [dict(a=1, b=2, a_descale=3, b_descale=4, alpha=5, out_dtype=torch.bfloat16, block_size=16,
                    use_8x4_sf_layout=False, backend="auto", use_nvfp4=True),
               dict(a=1, b=2, a_descale=3, b_descale=4, alpha=5, out_dtype=torch.bfloat16, block_size=16,
                    use_8x4_sf_layout=True, backend="cudnn", use_nvfp4=True, enable_pdl=True),
               dict(a=1, b=2, a_descale=3, b_descale=4, alpha=5, out_dtype=torch.bfloat16, block_size=16,
                    use_8x4_sf_layout=False, backend="auto", use_nvfp4=True, batch_invariant=True),
               dict(a=1, b=2, a_descale=3, b_descale=4, alpha=5, out_dtype=torch.bfloat16, block_size=16,
                    use_8x4_sf_layout=False, backend="auto", use_nvfp4=True, out=torch.zeros(1))],
}


def _outcome(namespace, member, arguments, with_recipe, monkeypatch):
    recorder = Recorder()
    monkeypatch.setitem(namespace, "op", recorder.op)
    monkeypatch.setitem(namespace, "experts_views", lambda values, scales: ("views", values, scales))
    try:
        result = member.implement(_context(recorder, with_recipe), dict(arguments))
    except InvalidArgumentError as error:
        result = ("raised", str(error))
    if isinstance(result, family.Unsupported) or type(result).__name__ == "Unsupported":
        result = ("unsupported", result.reason)
    return [recorder.calls, _canonical(result)]


def outcomes(namespace, members, monkeypatch) -> dict:
    """"<name> <versions> #<argument set> recipe=<bool>" -> [calls, result], for every member and argument set."""
    table = {}
    for member in members:
        for index, arguments in enumerate(ARGUMENTS[member.name]):
            for with_recipe in (False, True):
                table[f"{member.name} {member.versions} #{index} recipe={with_recipe}"] = _outcome(
                    namespace, member, arguments, with_recipe, monkeypatch)
    return table


def test_every_member_calls_refuses_and_raises_as_reviewed_as_imported_and_built_afresh(monkeypatch):
    assert {m.name for m in family.MEMBERS} == set(ARGUMENTS), "every member needs argument sets here"
    reviewed = json.loads(GOLDEN.read_text())
    installed = outcomes(vars(family), family.MEMBERS, monkeypatch)
    assert set(installed) == set(reviewed) and len(installed) > 100
    for key, outcome in installed.items():
        assert outcome == reviewed[key], key
    fresh = runpy.run_module(family.__name__, run_name=family.__name__)
    for key, outcome in outcomes(fresh, fresh["MEMBERS"], monkeypatch).items():
        assert outcome == reviewed[key], key


if __name__ == "__main__":  # rewrite the reviewed file: python tests/fp4/test_family_table.py
    with pytest.MonkeyPatch.context() as patch:
        GOLDEN.write_text(json.dumps(outcomes(vars(family), family.MEMBERS, patch), indent=0) + "\n")
    print(f"wrote {GOLDEN}; review the diff before committing it", file=sys.stderr)
