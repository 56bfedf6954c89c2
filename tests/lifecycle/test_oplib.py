"""The one way the project defines an op (``oplib.define``), called at test time on a fragment of its own.

Every real op is defined when its module is imported, once per process, so the tests that use those ops never
see ``define`` run again (nor does mutmut, which switches mutants after the import): this defines fresh ops
with the same function and checks what it returns, its kernels per dispatch key and its fake.
"""

from __future__ import annotations

import torch

from _fp4_dynamo_shim import oplib

def test_define_registers_the_schema_its_kernels_and_its_fake_and_returns_the_default_overload():
    fragment = torch.library.Library("fp4_dynamo_shim_test_oplib", "FRAGMENT")
    name = "scaled"
    op = oplib.define(fragment, f"{name}(Tensor x, float factor) -> Tensor",
                      {"CPU": lambda x, factor: x * factor}, lambda x, factor: torch.empty_like(x))
    assert op is getattr(torch.ops.fp4_dynamo_shim_test_oplib, name).default
    x = torch.arange(4.0)
    assert torch.equal(op(x, 2.0), x * 2.0)
    assert torch.equal(getattr(torch.ops.fp4_dynamo_shim_test_oplib, name)(x, 3.0), x * 3.0)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = op(mode.from_tensor(x), 2.0)
    assert type(fake).__name__ == "FakeTensor" and fake.shape == (4,)
    compiled = torch.compile(lambda t: op(t, 5.0), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), x * 5.0)
