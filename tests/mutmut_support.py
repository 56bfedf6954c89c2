"""What mutmut's run needs to trace through this project's compiled tests (imported by conftest.py only
when mutmut runs the tests: ``MUTANT_UNDER_TEST`` is set).

mutmut 3 puts a trampoline in front of every mutated function. In its stats run (which test reaches which
function) the trampoline keeps a ``ContextVar`` call stack and records the hit through its configuration;
Dynamo cannot trace ``ContextVar.get`` (nor the ``os.stat`` behind a first configuration read), so every
``torch.compile(fullgraph=True)`` test that reaches a mutated function would fail there, and the run stops.
With ``track_dependencies = false`` and no stack-depth limit (pyproject.toml) the trampoline needs neither:
the replacement below records the same hit in eager execution and skips it while Dynamo traces (a set
Dynamo saw change would fail its guards and recompile every frame: test_compile counts compilations).
The functions a compiled test reaches are reached eagerly by the same tests (they compare with eager).
"""

from __future__ import annotations


class _NoCallStack:
    """MutmutCallStack without the ContextVar (dependency tracking is off, so the caller is never read)."""

    @classmethod
    def get(cls):
        return (None, 0)

    @classmethod
    def set(cls, value):
        return None

    @classmethod
    def reset(cls, token):
        return None


def make_trampolines_traceable() -> None:
    from mutmut.configuration import config
    from mutmut.mutation import trampoline
    from mutmut.state import state

    settings = config()
    assert not settings.track_dependencies and settings.max_stack_depth == -1, "see tests/mutmut_support.py"
    import torch

    stats = state()._stats
    is_compiling = torch.compiler.is_compiling

    def record_hit(name, caller=None):
        if not is_compiling():
            stats.add(name)

    trampoline.MutmutCallStack = _NoCallStack
    trampoline.record_trampoline_hit = record_hit
