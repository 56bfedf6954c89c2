"""prims_ts' BF16 MoE (0.7.4) as the shim's op under ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on CPU.

Its declaration takes the weights as one tensor or a sequence of shards, an optional string out of two and an optional
handle of caller-owned CUDA streams and events (``MoePartitionResources``), which no op carries: the public
``prims_ts_bf16_moe`` passes none, so the op is exact for None and refuses a handle under tracing.

Stand-ins, because the kernels need a GPU, each named where used: the Prims-TS runner FlashInfer's function builds
(``PrimsTsBf16MoERunner``: its ``forward`` returns the launcher's three tensors computed from the hidden states, and
writes the routing replay), the support check and the autotuner FlashInfer's function asks first, and the trtllm
launcher getter. Everything between, the function itself, its result unpacking and the public function, is
FlashInfer's.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import types

import flashinfer.fused_moe
import pytest
import torch
import torch._dynamo

import fp4_dynamo_shim
from _fp4_dynamo_shim.errors import NotExpressibleError
from helpers import apply_with
from moe_inputs import EXPERTS, HIDDEN, INTERMEDIATE, TOKENS, TOP_K, bf16_moe_arguments

NAME = "flashinfer.fused_moe.backends.prims_ts.bf16_op"
if importlib.util.find_spec("flashinfer.fused_moe.backends.prims_ts") is None:
    pytest.skip("prims_ts' BF16 MoE is in 0.7.4 on", allow_module_level=True)
bf16_op = importlib.import_module(NAME)
KEY = f"{NAME}.prims_ts_bf16_moe_op"


class Runner:
    """Stands in for ``PrimsTsBf16MoERunner`` (module docstring); counts its forward calls."""

    calls = 0

    def __init__(self, moe_op, **_):
        pass

    def _make_tuning_config(self, *_, **__):
        return None

    def set_cache_key_static_extras(self, **_):
        pass

    @torch._dynamo.disable
    def forward(self, inputs, tactic, **keywords):
        Runner.calls += 1
        output, hidden, gemm1 = inputs[0], inputs[4], keywords["gemm1_weights"]
        if keywords["routing_replay_out"] is not None:
            keywords["routing_replay_out"].fill_(3)
        if output.shape[1]:
            output.copy_(hidden * 2)
        rows = hidden.float().repeat_interleave(TOP_K, 0) @ gemm1[0, :HIDDEN].float().T
        return [rows.to(torch.bfloat16), torch.ones(hidden.shape[0], TOP_K, dtype=torch.bfloat16),
                torch.arange(hidden.shape[0] * TOP_K, dtype=torch.int32)]


@pytest.fixture(scope="module")
def prims_ts():
    tuner = types.SimpleNamespace(choose_one=lambda *_, **__: (None, -1))
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        patch.setattr(bf16_op, "PrimsTsBf16MoERunner", Runner)
        patch.setattr(bf16_op, "is_prims_ts_bf16_supported", lambda *_, **__: (True, None))
        patch.setattr(bf16_op, "AutoTuner", types.SimpleNamespace(get=lambda: tuner))
        patch.setattr(bf16_op, "_get_moe_op", lambda: None)
        yield status["flashinfer_ops"]
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _arguments(do_finalize):
    return bf16_moe_arguments(do_finalize=do_finalize, enable_pdl=False,
                              routing_replay_out=torch.zeros(TOKENS, TOP_K, dtype=torch.int32))


def _moe(arguments):
    return flashinfer.fused_moe.prims_ts_bf16_moe(**arguments)


def test_prims_ts_bf16_moe_is_registered(prims_ts):
    assert prims_ts["registered"][KEY] == "fp4_dynamo_shim_flashinfer::prims_ts_bf16_moe"


@pytest.mark.parametrize("do_finalize", [True, False])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_prims_ts_bf16_moe_compiles_to_its_op_equal_to_eager(prims_ts, backend, do_finalize):
    """Finalized it returns one tensor, else the launcher's three (rows whose count routing decides); the routing
    replay is written in place either way."""
    eager_arguments, compiled_arguments = _arguments(do_finalize), _arguments(do_finalize)
    eager = _moe(eager_arguments)
    torch._dynamo.reset()
    Runner.calls = 0
    compiled = torch.compile(_moe, fullgraph=True, backend=backend)(compiled_arguments)
    assert Runner.calls == 1
    assert type(compiled) is type(eager)
    pairs = [(compiled, eager)] if isinstance(eager, torch.Tensor) else list(zip(compiled, eager, strict=True))
    assert all(c.dtype == e.dtype and c.stride() == e.stride() and torch.equal(c, e) for c, e in pairs)
    assert torch.equal(compiled_arguments["routing_replay_out"], eager_arguments["routing_replay_out"])
    assert eager_arguments["routing_replay_out"].eq(3).all()


def test_prims_ts_bf16_moe_refuses_partition_resources_under_tracing(prims_ts):
    """The handle is FlashInfer's to use eagerly; inside a compiled region it would have to cross the op."""
    def partitioned(arguments, resources):
        return bf16_op.prims_ts_bf16_moe_op(**arguments, topk_ids=None, expert_weights=None, gemm1_lora_delta=None,
                                            routed_scaling_factor=None, routing_method_type=0,
                                            use_shuffled_weight=True, weight_layout=0,
                                            partition_resources=resources, partition_strategy="tp_n_tp_n")

    torch._dynamo.reset()
    said = ("prims_ts_bf16_moe_op: partition_resources holds caller-owned CUDA streams and events (the two-way "
            "green-context partition), which cannot cross a custom op; under "
            "torch.compile pass None (or call it outside the compiled region)")
    with pytest.raises(Exception, match=re.escape(said)) as raised:
        torch.compile(partitioned, fullgraph=True, backend="aot_eager")(_arguments(True), types.SimpleNamespace())
    assert NotExpressibleError.__name__ in str(raised.value) or isinstance(raised.value, NotExpressibleError)


@pytest.mark.parametrize("do_finalize", [True])
def test_prims_ts_bf16_moe_op_passes_opcheck(prims_ts, do_finalize):
    """Finalized: the unfinalized rows have a size only routing decides, which opcheck's static AOT test cannot
    hold."""
    a = _arguments(do_finalize)
    op = torch.ops.fp4_dynamo_shim_flashinfer.prims_ts_bf16_moe.default
    positional = [a["routing_logits"], None, None, None, a["hidden_states"], [a["gemm1_weights"]], True,
                  [a["gemm2_weights"]], True, None, EXPERTS, TOP_K, None, None, INTERMEDIATE, 0, EXPERTS, None, 0,
                  True, 0, do_finalize, False, 8192, 3, True, a["routing_replay_out"], None, None, None, None, None]
    torch.library.opcheck(op, positional)
