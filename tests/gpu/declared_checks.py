"""What the GPU checks measure for one public FlashInfer function (one ``declared_examples`` call).

Shared by ``test_gpu_declared.py`` (asserts) and ``declared_report.py`` (the per-module JSON table):

* ``traced``: ``torch._dynamo.explain`` finds 1 graph, 0 graph breaks, and the graph calls a shim op;
* ``bit_exact``: ``torch.compile(fullgraph=True, backend="inductor")`` leaves the same bytes as eager in the
  result and in every argument the function writes;
* ``graph``: the compiled function captured in a CUDA graph and replayed on fresh values in the captured
  inputs equals eager on those values (random functions: the replay ran; FlashInfer draws its seed on the
  host, so a replay repeats the captured draw);
* ``opcheck``: ``torch.library.opcheck`` on every shim op the call reaches, with the arguments it passed.
"""

from __future__ import annotations

import contextlib
import traceback

import torch

from _fp4_dynamo_shim.declared import declared_layer


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _run(function, example, args, kwargs):
    """Call on clones of ``args``; returns the tensors the call leaves behind (result, then written args)."""
    args = _clone(args)
    if example.random:
        torch.manual_seed(0)
    result = function(*args, **kwargs)
    torch.cuda.synchronize()
    return _tensors(result) + [args[i] for i in example.writes]


def _bytes(tensor):
    return tensor.contiguous().view(torch.uint8) if tensor.numel() else tensor


def _same(left, right, unordered: bool = False) -> bool:
    """Bit for bit (NaNs included): same shapes, dtypes and bytes; ``unordered``: each tensor's last dimension
    compared as a sorted set of values (for a function whose own eager runs vary the order, as top-k's)."""
    if unordered:
        left, right = _sorted(left), _sorted(right)
    return len(left) == len(right) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b)) for a, b in zip(left, right))


def _sorted(tensors):
    return [torch.sort(t, dim=-1).values if t.dim() and t.dtype != torch.bool else t for t in tensors]


class _OpCalls(torch.fx.Interpreter):
    """Runs a Dynamo graph node by node, keeping the arguments of the first call of each shim op."""

    def __init__(self, graph_module, calls):
        super().__init__(graph_module)
        self.calls = calls

    def call_function(self, target, args, kwargs):
        if declared_layer.NAMESPACE in str(target) and str(target) not in self.calls:
            self.calls[str(target)] = (target, _clone(args), dict(kwargs))
        return super().call_function(target, args, kwargs)


def _error(error: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()[0][:300]


def check(example) -> dict:
    """Every measure for one example; each is True/False, or a string saying why it was not measured."""
    function = example.resolve()
    if function is None:
        return {"name": example.name, "present": False}
    args, kwargs = example.arguments("cuda")

    def call(*a, **given):  # the example's keywords, unless the caller passes them again (_run, _graph do)
        return function(*a, **{**kwargs, **given})

    report = {"name": example.name, "present": True}
    eager = _run(function, example, args, kwargs)
    # Does FlashInfer's own eager call repeat its bytes? topk.top_k's does not (found on the H200, 0.6.12: its
    # radix kernel returns the k largest in an order that varies run to run); where the second run equals the
    # first as a set per row, every comparison below is made that way, and the report says so.
    again = _run(function, example, args, kwargs)
    unordered = not example.random and not _same(again, eager) and _same(again, eager, unordered=True)
    report["eager_repeats"] = True if example.random or not unordered and _same(again, eager) else (
        "as a set per row" if unordered else False)
    torch._dynamo.reset()
    try:
        explanation = torch._dynamo.explain(call)(*_clone(args))
        ops = sorted({str(node.target) for graph in explanation.graphs for node in graph.graph.nodes
                      if declared_layer.NAMESPACE in str(node.target)})
        report.update(graphs=explanation.graph_count, graph_breaks=explanation.graph_break_count, ops=ops,
                      break_reasons=[str(reason.reason)[:200] for reason in explanation.break_reasons])
        report["traced"] = explanation.graph_count == 1 and explanation.graph_break_count == 0 and bool(ops)
    except Exception as error:  # recorded: the report says what stopped the trace
        report.update(traced=False, trace_error=_error(error))
        return report
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="inductor")
    try:
        report["bit_exact"] = _same(_run(compiled, example, args, kwargs), eager, unordered)
    except Exception as error:
        report.update(bit_exact=False, compile_error=_error(error))
        return report
    report["graph"] = _graph(compiled, function, example, args, kwargs, unordered)
    report["opcheck"] = _opcheck(call, args, unordered)
    return report


def _graph(compiled, function, example, args, kwargs, unordered=False):
    static = _clone(args)
    stream = torch.cuda.Stream()
    try:
        with torch.cuda.stream(stream):
            for _ in range(3):
                compiled(*static, **kwargs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = compiled(*static, **kwargs)
    except Exception as error:  # is FlashInfer's own function capturable? then this is the shim's fault
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                function(*_clone(args), **kwargs)
        except Exception:
            return f"not capturable, FlashInfer's own function neither: {_error(error)}"
        return f"capture failed: {_error(error)}"
    # New values of the same kind: each floating input's rows rolled by one (probabilities stay valid rows).
    fresh = tuple(a.roll(1, 0) if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype.itemsize > 1
                  and a.dim() and a.shape[0] > 1 else a for a in args)
    for target, value in zip(static, fresh):
        if isinstance(target, torch.Tensor):
            target.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    if example.random:
        return True  # replayed; a replay repeats the draw captured on the host (see module docstring)
    replayed = _tensors(captured) + [static[i] for i in example.writes]
    return _same(replayed, _run(function, example, fresh, kwargs), unordered)


def _opcheck(call, args, unordered=False):
    graphs = []

    def keep(graph_module, example_inputs):
        # A size compiled code takes as a symbol (the wrappers' DynamicInt) is a SymInt here: its value is the hint.
        graphs.append((graph_module, [t.clone() if isinstance(t, torch.Tensor) else
                                      t.node.hint if isinstance(t, torch.SymInt) else t for t in example_inputs]))
        return graph_module.forward

    torch._dynamo.reset()
    torch.compile(call, fullgraph=True, backend=keep)(*_clone(args))
    calls = {}
    for graph_module, inputs in graphs:
        _OpCalls(graph_module, calls).run(*inputs)
    results = {}
    for name, (op, op_args, op_kwargs) in calls.items():
        try:
            results[name] = _opcheck_one(op, op_args, op_kwargs, unordered)
        except Exception as error:  # each op's verdict, with what opcheck said
            results[name] = _error(error)
    return results or "no shim op ran"


#: What opcheck's test_schema raises on an op that writes FP8 (it does arithmetic on every tensor it compares).
FP8_SCHEMA_LIMIT = "not implemented for 'Float8_e4m3fn'"


def _opcheck_one(op, op_args, op_kwargs, unordered=False):
    """True when opcheck passes. test_schema cannot compare FP8 tensors (found with rmsnorm_quant on the H200:
    "mul_cuda" not implemented for Float8_e4m3fn); there the other tests run, and what test_schema would
    have checked, that only the arguments the schema marks as written change, is checked on the bytes.
    test_aot_dispatch_dynamic compares two runs' outputs in order, which an op whose own eager runs vary the
    order of (``unordered``) cannot pass; there the other tests run, and bit_exact compared the sets."""
    if unordered:
        torch.library.opcheck(op, op_args, op_kwargs,
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        return True
    try:
        torch.library.opcheck(op, op_args, op_kwargs)
        return True
    except Exception as error:
        if "test_schema" not in str(error) or FP8_SCHEMA_LIMIT not in str(error):
            raise
    torch.library.opcheck(op, op_args, op_kwargs, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    arguments = _clone(op_args)
    before = [_bytes(a).clone() if isinstance(a, torch.Tensor) else None for a in arguments]
    op(*arguments, **op_kwargs)
    torch.cuda.synchronize()
    written = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    for argument, old, new in zip(op._schema.arguments, before, arguments):
        if old is not None and argument.name not in written and not torch.equal(old, _bytes(new)):
            raise AssertionError(f"{op}: {argument.name} changed, but the schema does not mark it as written")
    return True


@contextlib.contextmanager
def every_op_on():
    """Re-apply the shim with FP4_DYNAMO_SHIM_FLASHINFER_OPS=all for the block."""
    import os

    import torch._dynamo  # noqa: F401  (the layer registers when it is imported: the counts below are then real)

    import fp4_dynamo_shim

    previous = os.environ.get("FP4_DYNAMO_SHIM_FLASHINFER_OPS")
    os.environ["FP4_DYNAMO_SHIM_FLASHINFER_OPS"] = "all"
    fp4_dynamo_shim.revert()
    try:
        assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
        yield fp4_dynamo_shim.status()["flashinfer_ops"]
    finally:
        if previous is None:
            os.environ.pop("FP4_DYNAMO_SHIM_FLASHINFER_OPS", None)
        else:
            os.environ["FP4_DYNAMO_SHIM_FLASHINFER_OPS"] = previous
        fp4_dynamo_shim.revert()
        fp4_dynamo_shim.apply()
