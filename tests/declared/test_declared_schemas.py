"""What each declared op's schema says it writes is what compiled code acts on: executed on CPU, not read.

AOTAutograd and Inductor take an op's schema at its word: a write the schema leaves out is lost (functionalization
keeps the caller's tensor unchanged) or the call is dropped as dead code, and the compiled result is silently
wrong where the GPU runs it. Dynamo alone (``backend="eager"``) calls the op as traced, writes and all. So each
public function of ``declared_examples`` is compiled with ``eager``, ``aot_eager`` and ``inductor`` on CPU
tensors and all three must leave every tensor, arguments and results, with the same bytes.

Stand-ins, because FlashInfer's kernels need a GPU: each registered op gets a CPU kernel that writes a fixed
pattern into every argument its schema marks as written (``Tensor(a!)``) and into each output, which it allocates
with the op's own fake. Limits, named: the stand-ins check the schema's write claims and that compiled code keeps
and orders the calls; they cannot check that a fake's shapes, strides and dtypes are the kernel's (the outputs are
the fake's by construction): the GPU tests do that against the real kernels (tests/gpu/test_gpu_declared.py).
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch._dynamo
import torch._inductor.config
import torch.utils._pytree as pytree

import declared_examples
import fp4_dynamo_shim
from _fp4_dynamo_shim.declared import declared_layer
from helpers import apply_with

NO_CPU_ANSWER = ("_cuda_isCurrentStreamCapturing", "is_current_stream_capturing", "Torch not compiled with CUDA",
                 "must be a CUDA tensor", "must be a cuda device")
BACKENDS = ("eager", "aot_eager", "inductor")


def _pattern(tensor: torch.Tensor, salt: int) -> None:
    values = (torch.arange(tensor.numel()) * 7 + salt) % 13
    tensor.copy_(values.reshape(tensor.shape).to(tensor.dtype))


def _stand_in(op, name: str, calls: collections.Counter):
    schema = op._schema
    written = [index for index, argument in enumerate(schema.arguments)
               if argument.alias_info is not None and argument.alias_info.is_write]
    fake = torch._library.simple_registry.singleton.find(f"{declared_layer.NAMESPACE}::{name}").fake_impl.kernel

    def kernel(*args, **kwargs):
        calls[name] += 1
        for index in written:
            value = args[index] if index < len(args) else kwargs.get(schema.arguments[index].name)
            if isinstance(value, torch.Tensor):
                _pattern(value, index)
        if not schema.returns:
            return None
        outputs = fake(*args, **kwargs)
        for index, value in enumerate(pytree.tree_leaves(outputs)):
            if isinstance(value, torch.Tensor):
                _pattern(value, 100 + index)
        return outputs

    return kernel


@pytest.fixture(scope="module")
def stand_in_kernels():
    """Every declared op registered (gate ``all``), each with a CPU stand-in kernel for the module."""
    with pytest.MonkeyPatch.context() as patch:
        status = apply_with(patch, FLASHINFER_OPS="all")
        assert status["applied"], status["problem"]
        patch.setitem(declared_layer.CAPABILITIES, 0, (9, 0))  # no GPU to ask: what test_declared_ops_trace_on_cpu.py stands in too
        library = torch.library.Library(declared_layer.NAMESPACE, "IMPL")
        calls = collections.Counter()
        namespace = getattr(torch.ops, declared_layer.NAMESPACE)
        for qualified in status["flashinfer_ops"]["registered"].values():
            name = qualified.split("::")[1]
            library.impl(name, _stand_in(getattr(namespace, name).default, name, calls), "CPU")
        # Inductor draws random numbers as eager does (config.patch: monkeypatch would delete the config entry).
        with torch._inductor.config.patch(fallback_random=True):
            yield calls
        library._destroy()
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply()


def _bytes(value):
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.contiguous().view(torch.uint8).tolist() if value.numel() else [])
    return value


@pytest.mark.parametrize("example", declared_examples.EXAMPLES, ids=lambda e: e.name)
def test_compiled_code_keeps_every_write_the_schema_declares(stand_in_kernels, example):
    function = example.resolve()
    if function is None:
        pytest.skip(f"this FlashInfer has no {example.module}.{example.function}")
    args, kwargs = example.arguments("cpu")
    seen = {}
    for backend in BACKENDS:
        torch._dynamo.reset()
        call_args, call_kwargs = pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
        before = sum(stand_in_kernels.values())
        torch.manual_seed(0)
        try:
            result = torch.compile(function, backend=backend, fullgraph=True)(*call_args, **call_kwargs)
        except Exception as error:
            if any(text in str(error) for text in NO_CPU_ANSWER):
                pytest.skip(f"{example.name} asks CUDA something on the way to its op; GPU test")
            raise
        assert sum(stand_in_kernels.values()) > before, f"{backend}: no declared op ran"
        seen[backend] = pytree.tree_map(_bytes, (result, call_args, call_kwargs))
    assert seen["aot_eager"] == seen["eager"], "AOTAutograd lost or moved a write the op makes"
    assert seen["inductor"] == seen["eager"], "Inductor lost or moved a write the op makes"
