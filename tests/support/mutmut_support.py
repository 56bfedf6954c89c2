"""What mutmut's run needs from this project's tests (imported by conftest.py only when mutmut runs the
tests: ``MUTANT_UNDER_TEST`` is set). Two concerns: compiled tests must trace through mutmut's trampolines,
and one mutant's tests must not pay seconds of fixed cost.

Tracing. mutmut 3 puts a trampoline in front of every mutated function. In its stats run (which test
reaches which function) the trampoline keeps a ``ContextVar`` call stack and records the hit through its
configuration; Dynamo cannot trace ``ContextVar.get`` (nor the ``os.stat`` behind a first configuration
read), so every ``torch.compile(fullgraph=True)`` test that reaches a mutated function would fail there, and
the run stops. With ``track_dependencies = false`` and no stack-depth limit (pyproject.toml) the trampoline
needs neither: the replacement below records the same hit in eager execution and skips it while Dynamo
traces (a set Dynamo saw change would fail its guards and recompile every frame: test_compile counts
compilations). The functions a compiled test reaches are reached eagerly by the same tests.

Cost. mutmut forks each mutant's pytest session from a fork server that has collected the tests, so torch,
FlashInfer and the test modules are already imported. What was left, measured on the 2-core runner
(tests/lifecycle/test_environment_variables.py's switch test, 0.01 s of its own):

* 1.2 s per session in ``gc.collect()``: pytest's unraisableexception plugin collects five times at the
  end, Hypothesis once before the first example, and each pass walks (and copy-on-write touches) torch's
  whole heap. ``gc.freeze()`` once the tests are collected moves that heap out of the collector's reach
  (frozen objects are never collected; none of them is garbage), and pyproject.toml's
  ``-p no:unraisableexception`` drops the plugin (it only turns unraisable exceptions into warnings).
  1.4 s -> 0.15 s per session.
* The order of a mutant's tests: with ``-x`` a killed mutant costs the tests up to the first failure.
  mutmut's fork runner runs the fastest first, its fork server (needed here: torch is not fork-safe
  once its thread pools exist) in set order; :func:`fastest_first` restores the fork runner's order.
  mutmut times only a test's call phase, so the stats run here also adds each test's setup and teardown
  (the parity tests spend 3 s in their fixture around a 0.01 s call): the order and mutmut's per-mutant
  timeout then come from what a test really costs.
"""

from __future__ import annotations

import gc


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
    assert not settings.track_dependencies and settings.max_stack_depth == -1, "see tests/support/mutmut_support.py"
    import torch

    stats = state()._stats
    is_compiling = torch.compiler.is_compiling

    def record_hit(name, caller=None):
        if not is_compiling():
            stats.add(name)

    trampoline.MutmutCallStack = _NoCallStack
    trampoline.record_trampoline_hit = record_hit


def fastest_first() -> None:
    """A mutant's tests in increasing duration (what mutmut's ForkRunner does, and its ForkServerRunner not)."""
    from mutmut.runners.harness import PytestRunner
    from mutmut.state import state

    run_tests = PytestRunner.run_tests
    if getattr(run_tests, "fastest_first", False):
        return

    def sorted_run_tests(self, *, mutant_name, tests):
        durations = state().duration_by_test
        return run_tests(self, mutant_name=mutant_name, tests=sorted(tests, key=lambda t: (durations.get(t, 0.0), t)))

    sorted_run_tests.fastest_first = True
    PytestRunner.run_tests = sorted_run_tests


def install() -> None:
    make_trampolines_traceable()
    fastest_first()
    gc.freeze()


# --- pytest hooks (conftest.py imports them under mutmut) ---------------------------------------------------

def pytest_collection_finish(session) -> None:
    """In the fork server: the collected test modules join the frozen heap the mutants' sessions inherit."""
    gc.freeze()


def pytest_runtest_logreport(report) -> None:
    """In the stats run: a test's duration includes its setup and teardown (mutmut records the call only)."""
    from mutmut.mutation.trampoline import get_mutant_under_test
    from mutmut.state import state

    if report.when != "call" and get_mutant_under_test() == "stats":
        durations = state().duration_by_test
        if report.nodeid in durations:
            durations[report.nodeid] += report.duration
