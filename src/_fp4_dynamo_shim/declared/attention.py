"""What FlashInfer's attention declarations do not say plainly, from the per-release table (``attention_table``,
generated from each release's Python and C++ sources by ``tools/attention_table.py``).

The attention getters take ``*args`` (``get_single_decode_module(*args)``) or leave ``backend`` unannotated
(``get_single_prefill_module(backend, *args)``), so their nested run functions cannot become ops from the
declarations alone: the table gives each getter's real parameters (those of the ``gen_*`` function it forwards
them to). And single decode's ``mutates_args=("tmp", "o")`` leaves out ``maybe_lse``, which its C++ run function
writes: the table's written tensors are added to what FlashInfer declared, so compiled code keeps the write.
"""

from __future__ import annotations

import inspect
from typing import Optional, Tuple

from . import attention_table

#: The entry points whose public function calls its getter itself, inside the region a user compiles: the
#: getter's polyfill reaches their run there. The wrappers call theirs in ``plan()``, outside it, and their
#: ``run`` reaches the module ``plan()`` cached: a getter polyfill never sees it.
TRACED = ("single_decode", "single_prefill")


def _row(release: Optional[str], getter: str, run: str) -> Optional[dict]:
    for key in attention_table.RELEASES.get(release, ()):
        row = attention_table.ROWS[key]
        if row["getter"] == getter and row["run"] == run and set(row["entry_points"]) & set(TRACED):
            return row
    return None


def getter_signature(release: Optional[str], module, getter: str, run: str) -> Optional[inspect.Signature]:
    """The parameters ``getter`` of ``module`` really takes (for ``run``), or None where the table has no row:
    compiled from the table's text in the module's globals, where FlashInfer's annotations resolve."""
    row = _row(release, getter, run)
    if row is None:
        return None
    local: dict = {}
    exec(compile(f"def {getter}({row['getter_parameters']}): pass", f"<attention_table {release}>", "exec"),
         module.__dict__, local)
    return inspect.signature(local[getter], eval_str=True)


def written(release: Optional[str], getter: str, run: str) -> Tuple[str, ...]:
    """The tensors ``run`` writes in place, per the table (FlashInfer's ``mutates_args`` and the C++ writes)."""
    row = _row(release, getter, run)
    return () if row is None else tuple(p[:-2] for p in row["parameters"].split() if p.endswith(":w"))
