"""Helpers shared by the tests (conftest.py holds only fixtures: two conftest modules cannot both be imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fp4_dynamo_shim
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.fp4 import fp4_releases

SRC = str(Path(fp4_dynamo_shim.__file__).resolve().parent.parent)


def run_python(code: str | None, env: dict | None = None, timeout: float = 300, extra_path: str | None = None,
               args: tuple = ()) -> subprocess.CompletedProcess:
    """Run ``python *args -c code`` (or ``python *args`` when code is None) in a fresh interpreter with the
    source tree importable."""
    environment = dict(os.environ)
    environment.pop("FP4_DYNAMO_SHIM", None)
    environment.update(env or {})
    path = [SRC] + ([extra_path] if extra_path else []) + [environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return subprocess.run(
        [sys.executable, *args, *(("-c", code) if code is not None else ())], capture_output=True, text=True,
        timeout=timeout, env=environment
    )


def installed_target() -> fp4_releases.Target:
    return fp4_releases.target_for(lifecycle.flashinfer_version())


def apply_with(monkeypatch, **environment) -> dict:
    """Re-apply the shim under these variables (short names get the ``FP4_DYNAMO_SHIM_`` prefix; None unsets),
    with an empty Dynamo cache; returns ``status()``. Does not assert that it applied: callers check that."""
    import torch

    for name, value in environment.items():
        name = name if name.startswith("FP4_DYNAMO_SHIM") else f"FP4_DYNAMO_SHIM_{name}"
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    fp4_dynamo_shim.apply()
    return fp4_dynamo_shim.status()


def describe(argument):
    """One argument of a kernel call as a comparable value: a tensor by shape, strides, dtype, storage size and
    (for all but large byte tensors) its values; anything else by type and value."""
    import torch

    if isinstance(argument, torch.Tensor):
        data = argument.tolist() if argument.dtype != torch.uint8 or argument.numel() < 4096 else None
        return ("tensor", tuple(argument.shape), argument.stride(), argument.dtype,
                argument.untyped_storage().nbytes(), data if argument.dtype != torch.uint8 else None)
    return (type(argument).__name__, argument)


#: The namespace of the ops the shim declares for FlashInfer (what ``torch.ops`` shows to a user).
DECLARED_NAMESPACE = "fp4_dynamo_shim_flashinfer"


def torch_refuses_declared_ops(monkeypatch, ops=None, error=RuntimeError("injected define failure")) -> None:
    """Fault at torch's side of the seam: ``torch.library`` refuses the shim's declared-op namespace, either
    making its fragment at all (``ops`` None) or defining the ops named in ``ops``. Everything of the shim
    runs as it would when torch refuses for real (a name taken, a schema this torch cannot parse)."""
    import torch.library

    library, define = torch.library.Library, torch.library.Library.define

    class Refusing(library):
        def __init__(self, ns, kind, *args, **kwargs):
            if ops is None and ns == DECLARED_NAMESPACE:
                raise error
            super().__init__(ns, kind, *args, **kwargs)

        def define(self, schema, *args, **kwargs):
            if ops is not None and self.ns == DECLARED_NAMESPACE and schema.split("(", 1)[0] in ops:
                raise error
            return define(self, schema, *args, **kwargs)

    monkeypatch.setattr(torch.library, "Library", Refusing)


def eager_then_compiled(call, backend: str, prepare, record) -> None:
    """Call ``call`` eagerly, then compiled with ``fullgraph=True`` and ``backend``, on fresh arguments each time
    (``prepare()`` resets what the call writes and returns its arguments), then compare what ``record(compiled,
    returned, arguments)`` kept of each run: the same shapes, strides, dtypes and bits."""
    import torch
    import torch._dynamo

    results = []
    for compiled in (False, True):
        arguments = prepare()
        torch._dynamo.reset()
        function = torch.compile(call, fullgraph=True, backend=backend) if compiled else call
        results.append(record(compiled, function(*arguments), arguments))
    for eager, compiled in zip(*results):
        assert (compiled.shape, compiled.stride(), compiled.dtype) == (eager.shape, eager.stride(), eager.dtype)
        assert torch.equal(compiled, eager)


class Compiles:
    """``with Compiles() as compiles:``: how many graphs Dynamo compiled in the block (``compiles.count``; a compile
    counts once however often Dynamo restarts its analysis, where a compile counter counts each restart) and the
    guard failures that made it recompile (``compiles.recompiled_for``; Dynamo lists one per cache entry it
    tried). ``torch._dynamo.utils`` holds Dynamo's only record of either."""

    def __enter__(self):
        import torch._dynamo.utils

        self._utils = torch._dynamo.utils
        self._before = self._utils.counters["stats"]["unique_graphs"]
        self._failures = sum(len(reasons) for reasons in self._utils.guard_failures.values())
        self.count, self.recompiled_for = 0, []
        return self

    def __exit__(self, *exc) -> None:
        self.count = self._utils.counters["stats"]["unique_graphs"] - self._before
        reasons = [str(reason) for reasons in self._utils.guard_failures.values() for reason in reasons]
        self.recompiled_for = reasons[self._failures:]


def names_a_test(test_id: str, root: Path) -> bool:
    """Whether a pytest id (``tests/x.py``, ``tests/x.py::test_f[param]``) names a file under ``root`` that has that
    test function: what a tool's list of tests must still hold after a rename."""
    path, _, name = test_id.partition("::")
    function = name.split("[")[0].split("::")[-1]
    source = root / path
    return source.exists() and (not function or f"def {function}(" in source.read_text())
