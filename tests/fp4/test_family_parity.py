"""The FP4 family's GPU path calls FlashInfer's built module exactly as FlashInfer's own functions do.

On a GPU each family op's kernel hands its arguments to FlashInfer's module (``family_ops``' ``*_flashinfer``
functions), and the public replacement turns the op's outputs into what FlashInfer returns. Here both sides run
on CPU tensors, the way ``tests/fp4/test_parity.py`` runs ``fp4_quantize``: FlashInfer's original function, and
the shim's public function whose op kernel is sent down that GPU path. Everything between is the real code of
both sides, FlashInfer's Python wrappers over its module included.

Stand-ins, because there is no GPU here: the built module (a recorder: each call is recorded with every
argument, then every tensor the caller did not pass in is filled with a byte pattern, so that the outputs and
the views FlashInfer and the shim make of them can be compared); the device queries (an SM100, as in
``stand_in_gpu``); torch's uninitialised memory, filled deterministically (``fill_uninitialized_memory``) so
that two runs' buffers compare; and the op kernel's CPU branch, sent down the GPU branch. Limits: the
recorder computes nothing, so values are the pattern's, not FP4 arithmetic (``test_fp4_family_traces_and_matches_eager.py`` checks that
against the reference); ``mm_fp4``'s GPU path calls FlashInfer's own ``mm_fp4``, whose GEMM backends need CUDA
(``tests/gpu/test_gpu_family.py``).
"""

from __future__ import annotations

import contextlib

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import family_ops

import stand_in_gpu
from nvfp4_inputs import nvfp4_input


class RecordingModule:
    """FlashInfer's built FP4 module: records every call, then fills what the caller did not pass in."""

    def __init__(self):
        self.calls = []
        self.inputs = set()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*arguments):
            self.calls.append((name, tuple(_describe(a) for a in arguments)))
            for argument in arguments:
                if isinstance(argument, torch.Tensor) and argument.data_ptr() not in self.inputs:
                    flat = argument.view(torch.uint8).view(-1) if argument.is_contiguous() else None
                    if flat is not None:
                        flat.copy_(torch.arange(flat.numel()) % 251)

        return call


def _describe(argument):
    if isinstance(argument, torch.Tensor):
        return ("tensor", tuple(argument.shape), argument.stride(), argument.dtype,
                argument.contiguous().view(torch.uint8).flatten().tolist())
    return (type(argument).__name__, argument)


def _calls():
    """name -> (args, kwargs): a valid call of each family function whose op has a FlashInfer path."""
    torch.manual_seed(0)
    x, scale = nvfp4_input(32, 128, seed=0)
    packed, sf = flashinfer.fp4_quantize(x, scale)
    _, sf_linear = flashinfer.fp4_quantize(x, scale, is_sf_swizzled_layout=False)
    mx_packed, mx_sf = flashinfer.fp4_quantize(x, None, 32, True, False)
    experts = torch.randn(2, 40, 64, dtype=torch.bfloat16)
    mask = torch.tensor([40, 17], dtype=torch.int32)
    return {
        "block_scale_interleave": ((sf_linear,), {}),
        "e2m1_and_ufp8sf_scale_to_float": ((packed, sf.reshape(-1), 1.0 / scale), {}),
        "mxfp4_dequantize_host": ((mx_packed, mx_sf), {}),
        "nvfp4_batched_quantize": ((x.view(2, 16, 128), scale), {}),
        "scaled_fp4_grouped_quantize": ((experts, mask, torch.tensor([3.0, 5.0])), {}),
        "silu_and_mul_scaled_nvfp4_experts_quantize": ((experts, mask, torch.tensor([3.0, 5.0])), {}),
    }


@contextlib.contextmanager
def _deterministic_empty():
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.utils.deterministic.fill_uninitialized_memory = previous[2]


@contextlib.contextmanager
def _cpu_takes_the_gpu_path(namespace):
    """Each family op's CPU kernel calls FlashInfer's module as its CUDA kernel does (the ops are frozen
    records read at call time; put back after)."""
    saved = {op: op.reference for op in family_ops.OPS}
    try:
        for op in family_ops.OPS:
            object.__setattr__(op, "reference", lambda *arguments, op=op: op.via_flashinfer(namespace, *arguments))
        yield
    finally:
        for op, reference in saved.items():
            object.__setattr__(op, "reference", reference)


@pytest.fixture
def sm100(unpatched, monkeypatch):
    recorder = RecordingModule()
    stand_in_gpu.install_sm100(monkeypatch.setattr, recorder)
    module = stand_in_gpu.fp4_module()
    activation = getattr(flashinfer, "activation", None)  # where some releases define the silu-and-mul quantizer
    if activation is not None and hasattr(activation, "get_compute_capability"):
        monkeypatch.setattr(activation, "get_compute_capability", lambda device: (10, 0))
    assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    yield module, recorder
    fp4_dynamo_shim.revert()
    module.get_fp4_quantization_module.cache_clear()


NAMES = ("block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float", "mxfp4_dequantize_host", "nvfp4_batched_quantize",
         "scaled_fp4_grouped_quantize", "silu_and_mul_scaled_nvfp4_experts_quantize")


def test_every_family_op_but_mm_fp4_has_a_call_here():
    assert sorted(_calls()) == sorted(NAMES)
    assert {op.name for op in family_ops.OPS} - {"mm_fp4"} == {
        "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float", "mxfp4_dequantize_host", "fp4_batched_quantize",
        "fp4_experts_quantize"}


@pytest.mark.parametrize("name", NAMES)
def test_the_gpu_path_calls_flashinfers_module_as_flashinfer_does(sm100, name):
    module, recorder = sm100
    if not hasattr(flashinfer, name):
        pytest.skip(f"this FlashInfer has no {name}")
    state = fp4_dynamo_shim.status()["family"].get(name, "")
    if not state.startswith("op-backed"):
        pytest.skip(f"{name}: {state}")
    arguments, keywords = _calls()[name]
    recorder.inputs = {a.data_ptr() for a in arguments if isinstance(a, torch.Tensor)}
    with _deterministic_empty():
        recorder.calls.clear()
        want = lifecycle.original_function(name)(*arguments, **keywords)
        flashinfers_calls = list(recorder.calls)
        recorder.calls.clear()
        with _cpu_takes_the_gpu_path(module.get_fp4_quantization_module("100")):
            got = getattr(flashinfer, name)(*arguments, **keywords)
    assert flashinfers_calls, f"{name}: FlashInfer's own function never reached its module"
    assert recorder.calls == flashinfers_calls
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert (tuple(g.shape), g.stride(), g.dtype) == (tuple(w.shape), w.stride(), w.dtype)
        assert torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8))
