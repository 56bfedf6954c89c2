"""FlashInfer's trtllm fused-MoE ops as the shim's ops under ``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``, on CPU.

0.7.4 builds their namespace from a JIT spec (``_build_trtllm_moe_namespace(module)``); the ops go through the cached
``_get_trtllm_moe_sm100_module_impl(enable_rubin)`` that FlashInfer's own calls use, and they write in place while
returning a list, which torch.compile can only functionalize as a fixed number of tensors.

Stand-ins, because the kernels need a GPU, each named where used: the JIT module FlashInfer builds
(``gen_trtllm_gen_fused_moe_sm100_module`` returns a spec whose ``build_and_load`` gives a CPU module whose
``trtllm_bf16_moe`` returns expert rows computed from the hidden states, unit weights and the token map, and is
opaque to Dynamo as FlashInfer's C++ function is); the device query (``flashinfer.utils.get_device_properties``
answers SM100 eagerly, ``declared_layer.CAPABILITIES`` under tracing) and ``torch.cuda.current_device``. Everything
between is FlashInfer's and the shim's code. ``do_finalize=False``: with ``True`` FlashInfer's public function logs a
deprecation through its own logger, which Dynamo refuses under fullgraph with or without the shim.
"""

from __future__ import annotations

import sys
import types

import flashinfer
import flashinfer.utils
import pytest
import torch
import torch._dynamo

import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from helpers import apply_with
from moe_inputs import EXPERTS, HIDDEN, INTERMEDIATE, TOP_K, bf16_moe_arguments
from stand_in_gpu import RecordingSpec

core = sys.modules["flashinfer.fused_moe.core"]
pytestmark = pytest.mark.skipif(not hasattr(core, "_get_trtllm_moe_sm100_module_impl"),
                                reason="the trtllm MoE getter takes a JIT spec from 0.7.4 on")
TRTLLM = ("trtllm_bf16_moe", "trtllm_fp8_per_tensor_scale_moe", "trtllm_fp8_per_tensor_scale_routed_moe",
          "trtllm_fp8_per_channel_scale_moe", "trtllm_fp8_block_scale_moe", "trtllm_fp4_block_scale_moe",
          "trtllm_mxint4_block_scale_moe")


class StandInMoE:
    """Stands in for the built trtllm MoE module (module docstring); records whether each call came through one of
    the shim's op kernels."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):  # the namespace binds every entry point of the module when it is built
        return lambda *arguments: None

    @torch._dynamo.disable
    def trtllm_bf16_moe(self, mode, logits, bias, topk_ids, weights, hidden, gemm1, gemm2, lora, alpha, beta,
                        clamp, output, num_experts, top_k, *rest):
        frame, through_op = sys._getframe(1), False
        while frame is not None:
            through_op |= frame.f_code.co_name.startswith("_kernel_")
            frame = frame.f_back
        self.calls.append(through_op)
        if output.shape[1]:  # finalized: FlashInfer's op allocated the output and returns it
            output.copy_(hidden * 2)
        rows = hidden.float().repeat_interleave(top_k, 0) @ gemm1[0, :HIDDEN].float().T
        return [rows.to(torch.bfloat16), torch.ones(hidden.shape[0], top_k, dtype=torch.bfloat16),
                torch.arange(hidden.shape[0] * top_k, dtype=torch.int32)]


class Spec(RecordingSpec):
    def get_library_paths(self):
        return []


@pytest.fixture(scope="module")
def moe():
    module = StandInMoE()
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        patch.setattr(core, "gen_trtllm_gen_fused_moe_sm100_module", lambda **_: Spec(module))
        patch.setattr(flashinfer.utils, "get_device_properties", lambda device: types.SimpleNamespace(major=10, minor=0))
        patch.setattr(torch.cuda, "current_device", lambda: 0)
        patch.setitem(declared_layer.CAPABILITIES, 0, (10, 0))
        flashinfer.utils.get_compute_capability.cache_clear()
        core._get_trtllm_moe_sm100_module_impl.cache_clear()
        yield types.SimpleNamespace(module=module, status=status["flashinfer_ops"])
        core._get_trtllm_moe_sm100_module_impl.cache_clear()
        flashinfer.utils.get_compute_capability.cache_clear()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _arguments():
    return bf16_moe_arguments()


def _moe(arguments):
    return flashinfer.fused_moe.trtllm_bf16_moe(**arguments)


def test_trtllm_moe_ops_are_registered_through_the_cached_getter(moe):
    key = "flashinfer.fused_moe.core._build_trtllm_moe_namespace."
    assert {moe.status["registered"].get(f"{key}{name}_op") for name in TRTLLM} == {
        f"fp4_dynamo_shim_flashinfer::{name}" for name in TRTLLM}
    assert not any(k.startswith(key) for k in moe.status["not_registered"])


def test_prims_ts_fp8_moe_ops_are_registered(moe):
    key = "flashinfer.fused_moe.backends.prims_ts.fp8_op."
    names = ("prims_ts_fp8_per_tensor_scale_moe", "prims_ts_fp8_block_scale_moe")
    if not any(k.startswith(key) for k in list(moe.status["registered"]) + list(moe.status["not_registered"])):
        pytest.skip("no prims_ts backend in this release")
    assert {moe.status["registered"].get(key + name) for name in names} == {
        f"fp4_dynamo_shim_flashinfer::{name}" for name in names}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_trtllm_bf16_moe_compiles_to_its_op_equal_to_eager(moe, backend):
    eager = _moe(_arguments())
    del moe.module.calls[:]
    torch._dynamo.reset()
    compiled = torch.compile(_moe, fullgraph=True, backend=backend)(_arguments())
    assert moe.module.calls == [True]  # the kernel ran once, from the op
    assert [(t.shape, t.dtype) for t in compiled] == [(t.shape, t.dtype) for t in eager]
    assert all(torch.equal(c, e) for c, e in zip(compiled, eager))


def test_trtllm_bf16_moe_op_passes_opcheck(moe):
    """Finalized: the unfinalized expert rows have a size only routing decides, which opcheck's static AOT test
    cannot hold (as for FlashInfer's own fake)."""
    arguments = _arguments()
    op = torch.ops.fp4_dynamo_shim_flashinfer.trtllm_bf16_moe.default
    positional = [False, 0, arguments["routing_logits"], None, None, None, arguments["hidden_states"],
                  arguments["gemm1_weights"], arguments["gemm2_weights"], None, EXPERTS, TOP_K, None, None,
                  INTERMEDIATE, 0, EXPERTS, None, 0, True, 2, True, True, 8192, 3, True, None, None, None, None,
                  None, None]
    torch.library.opcheck(op, positional)
