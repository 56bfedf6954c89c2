"""FlashInfer's ``SegmentGEMMWrapper.run`` under tracing: the whole run is one op, ``segment_gemm_run``.

Its two declarations (``get_gemm_module().cutlass_segment_gemm``, ``get_gemm_sm90_module().cutlass_segment_gemm_sm90``)
cannot be ops of their own (``rules.WRITES_THROUGH_ADDRESSES``): run() computes device pointer tables from ``out``'s
address (a triton kernel, ``launch_compute_sm80_group_gemm_args`` or its sm90 twin) and the GEMM writes through them;
it is handed ``out`` only for torch.compile's ``mutates_args`` and never writes it. An op around the whole run
computes the tables from the very tensor it is given to write, so its schema can say the truth: ``out`` and both
workspaces written. Its kernel is FlashInfer's own run, on an object holding what run reads from ``self``.

* **The output.** An op's output cannot alias its input: the traced run allocates ``out`` where the caller passed
  None, as FlashInfer's run does (``torch.zeros``, x's dtype, bfloat16 for FP8 inputs), has the op write it and
  returns it. It also does FlashInfer's checks first and turns ``seg_lens`` into ``seg_indptr`` with FlashInfer's
  ``get_indptr``, so the op takes one form. Both are FlashInfer's run read as it is: a release whose body differs
  from the one read here (``RUN_BODY``) is not covered, and its declarations stay listed as not expressible.
* **How Dynamo reaches it.** ``substitute_in_graph`` is not honoured for a method called as ``wrapper.run(...)``.
  While the layer is applied the class attribute is a thin function that calls FlashInfer's run; Dynamo inlines it
  and meets FlashInfer's function as a plain call, where its polyfill (the traced run) is honoured. Eager calls pay
  that one frame (``benchmarks/p1_wrappers_cpu.py``; P1's ``segment_gemm_run`` on a GPU); ``revert()`` puts
  FlashInfer's attribute back.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types
from typing import Optional

import torch

from .. import sources
from . import build
from . import rules
from .build import NAMESPACE
from .codegen import NotExpressible

OP = "segment_gemm_run"
SCHEMA = ("(Tensor(a!) float_workspace, Tensor(b!) int_workspace, Tensor x, Tensor weights, int batch_size, "
          "bool weight_column_major, Tensor(c!) out, Tensor seg_indptr, Tensor? weight_indices, str backend) -> ()")
#: FlashInfer's run body (docstring and decorators aside) that the traced run reproduces before its op: the same in
#: every release 0.5.3-0.7.4 (``body_digest``).
RUN_BODY = "334df23b26d3cbc3"


#: The op while the layer is applied; None once reverted. The traced run reads it as a global, so a function compiled
#: before ``revert()`` is re-checked on its next call (and then traces FlashInfer's run again).
_op = None


def body_digest(function) -> str:
    """A digest of ``function``'s parameters and body as written (FlashInfer's logging decorator changed between
    releases, the body did not)."""
    return sources.function_digest(ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(function)))).body[0])


def _kernel(original):
    """The op's kernel: FlashInfer's run writing ``out``, on an object holding all that run reads from ``self`` (the
    two workspaces and the backend, in every body ``RUN_BODY`` matches)."""

    def segment_gemm_run(float_workspace, int_workspace, x, weights, batch_size, weight_column_major, out, seg_indptr,
                         weight_indices, backend) -> None:
        wrapper = types.SimpleNamespace(_float_workspace_buffer=float_workspace, _int_workspace_buffer=int_workspace,
                                        backend=backend)
        original(wrapper, x, weights, batch_size, weight_column_major, out=out, seg_indptr=seg_indptr,
                 weight_indices=weight_indices)

    return segment_gemm_run


def _fake(*arguments) -> None:
    """The op returns nothing: it writes ``out`` and the workspaces, which the schema says."""


def _traced(module):
    """What Dynamo traces for FlashInfer's run: its checks and output, then the op (module docstring)."""
    get_indptr, is_float8 = module.get_indptr, module.is_float8

    def run(self, x, weights, batch_size, weight_column_major, out=None, seg_lens=None, seg_indptr=None,
            weight_indices=None):
        if seg_lens is None and seg_indptr is None:
            raise ValueError("Either seg_lens or seg_indptr should be provided.")
        if seg_indptr is None:
            seg_indptr = get_indptr(seg_lens.to(x))
        cumulative_batch_size = x.size(0)
        d_out = weights.size(1) if weight_column_major else weights.size(2)
        if out is None:
            out_dtype = torch.bfloat16 if is_float8(x) else x.dtype
            out = torch.zeros((cumulative_batch_size, d_out), dtype=out_dtype, device=x.device)
        elif out.shape != (cumulative_batch_size, d_out):
            raise ValueError(
                f"Output tensor shape mismatch, expected {cumulative_batch_size, d_out}, got {out.shape}")
        _op(self._float_workspace_buffer, self._int_workspace_buffer, x, weights, batch_size, weight_column_major,
           out, seg_indptr, weight_indices, self.backend)
        return out

    return run


def _not_covered(module, cls) -> Optional[str]:
    """Why this release's run is not the one the traced run reproduces, or None."""
    if cls is None:
        return f"{module.__name__} has no {rules.SEGMENT_GEMM_WRAPPER}"
    try:
        digest = body_digest(cls.__dict__["run"])
    except (KeyError, OSError, TypeError, SyntaxError) as error:  # no run, or no source to read
        return f"{rules.SEGMENT_GEMM_WRAPPER}.run cannot be read ({type(error).__name__}: {error})"
    if digest != RUN_BODY:
        return (f"{rules.SEGMENT_GEMM_WRAPPER}.run differs from the body the shim's traced run reproduces "
                f"(FlashInfer 0.5.3-0.7.4's; digest {digest})")
    return None


def install(layer, registrar) -> None:
    """Make ``SegmentGEMMWrapper.run`` one op where the gate selected its declarations; they then say which op
    covers them. Where it cannot, they keep the rule's reason (not expressible); a registration that goes wrong
    fails them (one warning; STRICT refuses the shim), as an op's would."""
    covered = [o for o in layer.outcomes if o.kind == rules.NOT_EXPRESSIBLE
               and (o.module, o.key.rsplit(".", 1)[-1]) in rules.WRITES_THROUGH_ADDRESSES]
    if not covered:
        return
    try:
        module = build.module_named(covered[0].module)
        cls = getattr(module, rules.SEGMENT_GEMM_WRAPPER, None)
        problem = _not_covered(module, cls)
    except NotExpressible as fact:
        problem = str(fact)
    if problem is not None:
        for outcome in covered:
            outcome.refuse(f"{outcome.reason}; the wrapper's run is not one op either: {problem}")
        return
    try:
        name, original = _rebind(layer, registrar, module, cls)
    except Exception as error:  # registration itself went wrong: listed, STRICT raises
        for outcome in covered:
            outcome.fail(error, f"{rules.SEGMENT_GEMM_WRAPPER}.run's op: ")
        return
    layer.pending.append((original, _traced(module), covered, f"{rules.SEGMENT_GEMM_WRAPPER}.run"))
    for outcome in covered:
        outcome.refuse(f"{rules.SEGMENT_GEMM_WRAPPER}.run is one op, {NAMESPACE}::{name}, which computes the "
                       "addresses from the output it writes", rules.WRAPPER_OP)


def _rebind(layer, registrar, module, cls) -> tuple:
    """Register the op and put the thin method on the class (both undone by ``revert()``): (the op's name,
    FlashInfer's run)."""
    global _op
    original = cls.__dict__["run"]
    name = registrar.unique(OP)
    _op = registrar.define(name, SCHEMA, _kernel(original), _fake)
    layer.undo.push(_forget)

    @functools.wraps(original)
    def run(self, *arguments, **keywords):
        # Dynamo meets ``original`` here as a plain call, where its polyfill is honoured (module docstring).
        return original(self, *arguments, **keywords)

    cls.run = run
    layer.undo.push(lambda: setattr(cls, "run", original))
    layer.helpers.append(f"{module.__name__}.{rules.SEGMENT_GEMM_WRAPPER}.run (one op: {NAMESPACE}::{name})")
    return name, original


def _forget() -> None:
    global _op
    _op = None
