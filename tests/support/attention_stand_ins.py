"""Stand-ins for FlashInfer's built batch attention JIT modules on CPU (the kernels need a GPU): ``plan`` returns a
plan vector holding the batch size and the row or page count; each run computes paged (or ragged) attention with the
default scale, reads its batch size from the plan vector it is given (a plan baked into a graph would fail there),
writes ``o``, ``lse`` and both workspaces, and is opaque to Dynamo as FlashInfer's C++ function is. They read none of
the scalars (soft cap, scales, window): the GPU run (tests/gpu/test_gpu_attention.py) holds the values.
"""

from __future__ import annotations

import math
import sys

import flashinfer.decode
import flashinfer.prefill
import torch
import torch._dynamo

from stand_in_gpu import RecordingSpec


def _checked(plan_info, calls) -> list:
    """The plan vector as FlashInfer's C++ binding takes it (ints, not a tensor), recorded with whether the call came
    through one of the shim's op kernels."""
    if not all(type(value) is int for value in plan_info):
        raise TypeError(f"plan_info_vec must hold ints, got {plan_info!r}")
    frame, through_op = sys._getframe(2), False
    while frame is not None:
        through_op |= frame.f_code.co_name.startswith("_kernel_")
        frame = frame.f_back
    calls.append((through_op, list(plan_info)))
    return list(plan_info)


def _attend(q, keys, values, o, lse, row):
    """Rows ``row`` of ``o``/``lse``: softmax(q k^T / sqrt(d)) v over all of the request's keys (no mask)."""
    keys, values = (t.float().repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (keys, values))
    scores = torch.einsum("nhd,khd->nhk", q[row].float(), keys) / math.sqrt(q.shape[-1])
    o[row] = torch.einsum("nhk,khd->nhd", scores.softmax(-1), values).to(o.dtype)
    if lse is not None:
        lse[row] = scores.logsumexp(-1)


def _pages(cache, indices, indptr, last, b):
    pages = indices[indptr[b]:indptr[b + 1]]
    length = (len(pages) - 1) * cache.shape[1] + int(last[b])
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


class StandInModule:
    """Stands in for a built batch attention JIT module (module docstring): ``plan`` returns [batch, rows, ...]
    (prefill: then the KV total); each run checks that q holds the planned rows, attends, and writes both
    workspaces."""

    def __init__(self, calls: list):
        self.calls = calls

    def plan(self, float_workspace, int_workspace, pinned, indptr_host, *rest):
        if isinstance(rest[0], int):  # batch decode: (indptr, batch_size, ...)
            return [rest[0], int(indptr_host[-1]), 3, 0, 1]
        return [int(rest[3]), int(rest[2]), 5, int(rest[0][-1])]  # prefill: (qo, kv_indptr, kv_lens, rows, batch, ...)

    def _workspaces(self, plan, float_workspace, int_workspace):
        int_workspace[:8].fill_(plan[0])
        float_workspace[:8].fill_(plan[1])

    @torch._dynamo.disable  # FlashInfer's C++ run: Dynamo cannot trace it
    def run(self, float_workspace, int_workspace, plan_info, q, k, v, indptr, indices, last, o, lse, *scalars):
        plan = _checked(plan_info, self.calls)
        if q.shape[0] != plan[0]:
            raise RuntimeError(f"plan for {plan[0]} requests, q holds {q.shape[0]}")
        for b in range(plan[0]):
            keys, values = (_pages(cache, indices, indptr, last, b) for cache in (k, v))
            _attend(q, keys, values, o, lse, slice(b, b + 1))
        self._workspaces(plan, float_workspace, int_workspace)

    @torch._dynamo.disable
    def paged_run(self, float_workspace, int_workspace, plan_info, q, k, v, qo_indptr, indptr, indices, last, o,
                  lse, *scalars):
        plan = _checked(plan_info, self.calls)
        if q.shape[0] != plan[1]:
            raise RuntimeError(f"plan for {plan[1]} rows, q holds {q.shape[0]}")
        for b in range(plan[0]):
            _attend(q, _pages(k, indices, indptr, last, b), _pages(v, indices, indptr, last, b), o, lse,
                    slice(int(qo_indptr[b]), int(qo_indptr[b + 1])))
        self._workspaces(plan, float_workspace, int_workspace)

    @torch._dynamo.disable
    def ragged_run(self, float_workspace, int_workspace, plan_info, q, k, v, qo_indptr, kv_indptr, o, lse, *scalars):
        plan = _checked(plan_info, self.calls)
        if q.shape[0] != plan[1]:
            raise RuntimeError(f"plan for {plan[1]} rows, q holds {q.shape[0]}")
        for b in range(plan[0]):
            keys = slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
            _attend(q, k[keys], v[keys], o, lse, slice(int(qo_indptr[b]), int(qo_indptr[b + 1])))
        self._workspaces(plan, float_workspace, int_workspace)


def clear_getters():
    flashinfer.decode.get_batch_decode_module.cache_clear()
    flashinfer.prefill.get_batch_prefill_module.cache_clear()


def stand_in_modules(patch, calls: list) -> None:
    """FlashInfer's batch attention module builders give :class:`StandInModule` (``calls`` records each run's plan
    and whether it came through one of the shim's op kernels); the getters' caches are cleared."""
    spec = lambda *a: RecordingSpec(StandInModule(calls))  # noqa: E731
    patch.setattr(flashinfer.decode, "gen_batch_decode_module", spec)
    for name in ("_gen_batch_prefill_primary_module", "_gen_batch_prefill_independent_paged_module",
                 "gen_batch_prefill_module"):  # the first two are 0.7.x's
        if hasattr(flashinfer.prefill, name):
            patch.setattr(flashinfer.prefill, name, spec)
    clear_getters()
