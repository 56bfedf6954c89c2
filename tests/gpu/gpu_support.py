"""Helpers for the GPU tests (imported by name; tests/gpu is on sys.path when they run).

Two device modes, and every GPU test that computes FP4 runs in both (the ``device_mode`` fixture):

* ``kernel``: the branch Blackwell takes. On SM100+ that is the default (FlashInfer's kernel computes);
  below SM100 ``FP4_DYNAMO_SHIM_FALLBACK=launch`` takes the same branch (the direct eager path, the JIT
  entry, the op's kernels, the family closures), but the kernel there has no body and writes nothing, so
  a test asserts what that branch can show: tracing, fake = real shapes/strides/dtypes, capture, replay.
* ``reference``: ``FP4_DYNAMO_SHIM_FALLBACK=reference``, the shim's reference quantizer on the GPU: real
  values, another branch.

:class:`Branches` counts, while a test runs, which of them reached what: FlashInfer's JIT entries
(``jit``, split into ``direct`` for the replacement's direct eager path, ``general`` for ``ops.quantize``'s
launcher, which the op's CUDA kernel also uses, and ``family`` for the FP4 family's closures) or the
reference (``reference``). A kernel-mode test asserts jit > 0 and reference == 0, so it fails if its call
quietly took the reference's branch.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os

import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.fp4 import devices
from _fp4_dynamo_shim.fp4 import reference

GPU = torch.cuda.is_available()
SM = torch.cuda.get_device_capability(0) if GPU else None


def has_fp4_kernel() -> bool:
    return bool(SM) and SM[0] >= 10


MODES = ("kernel", "reference")
#: The FP4_DYNAMO_SHIM_FALLBACK value under which this GPU takes Blackwell's branch.
KERNEL_FALLBACK = "error" if has_fp4_kernel() else "launch"


@contextlib.contextmanager
def using_fallback(mode: str):
    """Re-apply the shim with FP4_DYNAMO_SHIM_FALLBACK=mode for the duration of the block."""
    previous = os.environ.get("FP4_DYNAMO_SHIM_FALLBACK")
    os.environ["FP4_DYNAMO_SHIM_FALLBACK"] = mode
    fp4_dynamo_shim.revert()
    torch._dynamo.reset()
    try:
        assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
        yield
    finally:
        if previous is None:
            os.environ.pop("FP4_DYNAMO_SHIM_FALLBACK", None)
        else:
            os.environ["FP4_DYNAMO_SHIM_FALLBACK"] = previous
        fp4_dynamo_shim.revert()
        torch._dynamo.reset()
        fp4_dynamo_shim.apply()


class Branches:
    """Counts of what was reached since the last :meth:`reset` (see the module docstring)."""

    def __init__(self):
        self.counts = collections.Counter()

    def reset(self) -> None:
        self.counts.clear()

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def counted(self, function, *names):
        @functools.wraps(function)  # inspect.signature sees the original (family_ops asks closures what they take)
        def call(*arguments, **keywords):
            for name in names:
                self.counts[name] += 1
            return function(*arguments, **keywords)

        return call


class _CountingNamespace:
    """FlashInfer's FP4 module namespace with every closure counted as a JIT-entry call."""

    def __init__(self, namespace, branches: Branches):
        self._namespace, self._branches = namespace, branches

    def __getattr__(self, name):
        value = getattr(self._namespace, name)
        return self._branches.counted(value, "jit", "family", f"family:{name}") if callable(value) else value


@contextlib.contextmanager
def recording_branches():
    """Count the branches taken (see :class:`Branches`) for as long as the block runs."""
    branches = Branches()
    state = devices.STATE
    saved_reference = {name: getattr(reference, name) for name in ("quantize", "mm_fp4")}
    try:
        counting = devices.overridden(
            # A GPU with a direct kernel has a launcher that calls that kernel: count the launcher as the JIT path.
            launchers={index: branches.counted(launch, "jit", "general") if index in state.direct_kernels else launch
                       for index, launch in state.launchers.items()},
            direct_kernels={index: (branches.counted(kernel, "jit", "direct"), enable_pdl)
                            for index, (kernel, enable_pdl) in state.direct_kernels.items()},
            family_modules={index: (namespace if namespace is None else _CountingNamespace(namespace, branches), mode)
                            for index, (namespace, mode) in state.family_modules.items()},
        )
        for name, function in saved_reference.items():
            setattr(reference, name, branches.counted(function, "reference", f"reference:{name}"))
        with counting:
            yield branches
    finally:
        for name, function in saved_reference.items():
            setattr(reference, name, function)


@dataclasses.dataclass
class DeviceMode:
    name: str  # "kernel" or "reference"
    branches: Branches

    @property
    def computes_values(self) -> bool:
        """Whether FP4 outputs hold real values in this mode on this GPU."""
        return self.name == "reference" or has_fp4_kernel()

    @contextlib.contextmanager
    def recording(self):
        """Count afresh for the block: a test that reverts and re-applies the shim gets new launchers, which
        the recorder the fixture started does not see."""
        previous = self.branches
        with recording_branches() as branches:
            self.branches = branches
            try:
                yield branches
            finally:
                self.branches = previous

    def assert_branch(self, family: bool = False) -> None:
        """The calls since the last reset took this mode's branch (and reached something at all)."""
        counts = dict(self.branches.counts)
        if self.name == "kernel":
            assert self.branches["jit"] > 0 and self.branches["reference"] == 0, counts
            if family:
                assert self.branches["family"] > 0, counts
        else:
            assert self.branches["reference"] > 0 and self.branches["jit"] == 0, counts


@contextlib.contextmanager
def using_mode(name: str):
    """Apply the shim in device mode ``name`` and record its branches."""
    with using_fallback(KERNEL_FALLBACK if name == "kernel" else "reference"):
        expected = "kernel" if has_fp4_kernel() and name == "kernel" else (
            "launch" if name == "kernel" else "reference")
        assert {d["mode"] for d in fp4_dynamo_shim.status()["devices"]} == {expected}, fp4_dynamo_shim.status()
        with recording_branches() as branches:
            yield DeviceMode(name, branches)


@contextlib.contextmanager
def no_host_sync():
    """Fail on any operation that synchronises the host with the GPU (as SGLang's capture would)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def capture_and_replay(function, *static_inputs, warmups: int = 2, replays: int = 3):
    """Warm ``function`` up on a side stream, capture one call into a CUDA graph, replay it; returns the
    captured outputs (static buffers) and the graph. No host sync may happen in the captured call or the
    replays (capture itself fails on one; the replays are checked)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            function(*static_inputs)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = function(*static_inputs)
    with no_host_sync():
        for _ in range(replays):
            graph.replay()
    torch.cuda.synchronize()
    return outputs, graph


def meta(result):
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    return [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in items]


def no_breaks(function, *args) -> bool:
    explanation = torch._dynamo.explain(function)(*args)
    torch._dynamo.reset()
    return (explanation.graph_count, explanation.graph_break_count) == (1, 0)
