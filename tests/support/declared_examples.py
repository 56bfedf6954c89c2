"""One valid call of each FlashInfer public function the declared-ops layer is checked through.

Shared by the CPU tests (tensors made under ``FakeTensorMode`` on a "cuda" device: no GPU, no kernel) and the
GPU tests (real CUDA tensors). Each example builds its arguments on a device; ``compare`` names the tensors
whose values a run leaves behind (the result and the arguments the function writes), for eager vs compiled.
A release without the function skips it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable, Optional

import torch

BF16, F32 = torch.bfloat16, torch.float32


@dataclasses.dataclass(frozen=True)
class Example:
    module: str
    function: str
    build: Callable  # device -> (args, kwargs); or (device, function) -> ..., when it reads the signature
    #: Argument positions the function writes in place (compared after the call, like the result).
    writes: tuple = ()
    #: The function draws random numbers: eager and compiled runs start from the same seed.
    random: bool = False

    @property
    def name(self) -> str:
        return f"{self.module.rpartition('.')[2]}.{self.function}"

    def resolve(self) -> Optional[Callable]:
        try:
            return getattr(importlib.import_module(self.module), self.function)
        except (ImportError, AttributeError):
            return None

    def arguments(self, device: str):
        if len(inspect.signature(self.build).parameters) == 2:
            return self.build(device, self.resolve())
        return self.build(device)


def _randn(*shape, device, dtype=BF16, seed=0):
    if device == "cuda" and not torch.cuda.is_available():  # fake tensors: no values, no generator
        return torch.empty(*shape, device=device, dtype=dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, device=device, dtype=F32, generator=generator).to(dtype)


def _probs(device, batch=4, vocab=1024):
    logits = _randn(batch, vocab, device=device, dtype=F32)
    return torch.softmax(logits, dim=-1)


def _norm(x_dtype=BF16):
    def build(device):
        return (_randn(32, 256, device=device, dtype=x_dtype), _randn(256, device=device, seed=1), 1e-6), {}
    return build


def _fused_add(device):
    return (_randn(32, 256, device=device), _randn(32, 256, device=device, seed=2), _randn(256, device=device, seed=1),
            1e-6), {}


def _layernorm(device):  # as SGLang's NSA indexer calls it: bf16 input, float32 weight and bias
    return (_randn(32, 128, device=device), _randn(128, device=device, dtype=F32, seed=1),
            _randn(128, device=device, dtype=F32, seed=2), 1e-6), {}


def _scale(device, function):
    """0.6.x takes the quantization scale as a float, 0.7.x as a float or a one-element tensor."""
    annotation = inspect.signature(function).parameters["scale"].annotation
    return 0.5 if annotation in (float, "float") else torch.full((1,), 0.5, device=device, dtype=F32)


def _rmsnorm_quant(device, function):
    out = torch.empty(32, 256, device=device, dtype=torch.float8_e4m3fn)
    return (out, _randn(32, 256, device=device), _randn(256, device=device, seed=1), _scale(device, function),
            1e-6), {}


def _fused_add_rmsnorm_quant(device, function):
    out = torch.empty(32, 256, device=device, dtype=torch.float8_e4m3fn)
    return (out, _randn(32, 256, device=device), _randn(32, 256, device=device, seed=2),
            _randn(256, device=device, seed=1), _scale(device, function), 1e-6), {}


def _qk(device, tokens=16, heads=4, head_dim=128):
    return _randn(tokens, heads, head_dim, device=device), _randn(tokens, heads, head_dim, device=device, seed=3)


def _rope_pos_ids(device):
    q, k = _qk(device)
    return (q, k, torch.arange(16, device=device, dtype=torch.int32)), {}


def _rope_indptr(device):
    q, k = _qk(device)
    return (q, k, torch.tensor([0, 6, 16], device=device, dtype=torch.int32),
            torch.tensor([0, 3], device=device, dtype=torch.int32)), {}


def _rope_cos_sin(device):
    q, k = _qk(device)
    cache = _randn(64, 128, device=device, dtype=F32, seed=4)
    return (torch.arange(16, device=device, dtype=torch.int64), q.reshape(16, -1), k.reshape(16, -1), 128, cache,
            True), {}


def _gated(device):
    return (_randn(16, 512, device=device),), {}


def _logits(device):
    return (_randn(4, 1024, device=device, dtype=F32),), {}


def _with_probs(*extra):
    def build(device):
        return (_probs(device), *extra), {}
    return build


def _with_logits(*extra):
    def build(device):
        return (_randn(4, 1024, device=device, dtype=F32), *extra), {}
    return build


def _merge_state(device):
    return (_randn(16, 4, 128, device=device), _randn(16, 4, device=device, dtype=F32),
            _randn(16, 4, 128, device=device, seed=1), _randn(16, 4, device=device, dtype=F32, seed=2)), {}


def _merge_states(device):
    return (_randn(16, 3, 4, 128, device=device), _randn(16, 3, 4, device=device, dtype=F32)), {}


def _topk_deepseek(device):
    scores = _randn(16, 256, device=device, dtype=F32)
    bias = _randn(256, device=device, dtype=F32, seed=1)
    values = torch.empty(16, 8, device=device, dtype=F32)
    indices = torch.empty(16, 8, device=device, dtype=torch.int32)
    return (scores, bias, 8, 4, 8, 2.5, values, indices, True), {}


def _attention(query_rows, **keywords):
    """8 query heads over 2 KV heads of 128, 256 keys; ``query_rows`` None: one decode query."""
    def build(device):
        q = _randn(*(() if query_rows is None else (query_rows,)), 8, 128, device=device)
        return (q, _randn(256, 2, 128, device=device, seed=1), _randn(256, 2, 128, device=device, seed=2)), {
            "return_lse": True, **keywords}
    return build


EXAMPLES = (
    Example("flashinfer.norm", "rmsnorm", _norm()),
    Example("flashinfer.norm", "fused_add_rmsnorm", _fused_add, writes=(0, 1)),
    Example("flashinfer.norm", "gemma_rmsnorm", _norm()),
    Example("flashinfer.norm", "gemma_fused_add_rmsnorm", _fused_add, writes=(0, 1)),
    Example("flashinfer.norm", "layernorm", _layernorm),
    Example("flashinfer.norm", "rmsnorm_quant", _rmsnorm_quant, writes=(0,)),
    Example("flashinfer.norm", "fused_add_rmsnorm_quant", _fused_add_rmsnorm_quant, writes=(0, 2)),
    Example("flashinfer.rope", "apply_rope_pos_ids", _rope_pos_ids),
    Example("flashinfer.rope", "apply_rope_pos_ids_inplace", _rope_pos_ids, writes=(0, 1)),
    Example("flashinfer.rope", "apply_rope", _rope_indptr),
    Example("flashinfer.rope", "apply_llama31_rope_pos_ids", _rope_pos_ids),
    Example("flashinfer.rope", "apply_rope_with_cos_sin_cache", _rope_cos_sin),
    Example("flashinfer.activation", "silu_and_mul", _gated),
    Example("flashinfer.activation", "gelu_and_mul", _gated),
    Example("flashinfer.activation", "gelu_tanh_and_mul", _gated),
    Example("flashinfer.sampling", "softmax", _logits),
    Example("flashinfer.sampling", "sampling_from_probs", _with_probs(), random=True),
    Example("flashinfer.sampling", "sampling_from_logits", _with_logits(), random=True),
    Example("flashinfer.sampling", "top_k_sampling_from_probs", _with_probs(16), random=True),
    Example("flashinfer.sampling", "top_p_sampling_from_probs", _with_probs(0.9), random=True),
    Example("flashinfer.sampling", "min_p_sampling_from_probs", _with_probs(0.1), random=True),
    Example("flashinfer.sampling", "top_k_top_p_sampling_from_probs", _with_probs(16, 0.9), random=True),
    Example("flashinfer.sampling", "top_k_renorm_probs", _with_probs(16)),
    Example("flashinfer.sampling", "top_p_renorm_probs", _with_probs(0.9)),
    Example("flashinfer.sampling", "top_k_mask_logits", _with_logits(16)),
    Example("flashinfer.topk", "top_k", _with_logits(8)),
    Example("flashinfer.cascade", "merge_state", _merge_state),
    Example("flashinfer.cascade", "merge_states", _merge_states),
    Example("flashinfer.cascade", "merge_state_in_place", _merge_state, writes=(0, 1)),
    Example("flashinfer.fused_moe", "fused_topk_deepseek", _topk_deepseek, writes=(6, 7)),
    Example("flashinfer.decode", "single_decode_with_kv_cache", _attention(None)),
    # fa2 named: "auto" asks torch.version.cuda, which a CPU-only torch cannot answer (the GPU runs fa3 too)
    Example("flashinfer.prefill", "single_prefill_with_kv_cache", _attention(64, causal=True, backend="fa2")),
)


def by_name(name: str) -> Example:
    return next(example for example in EXAMPLES if example.name == name)
