"""SGLang's ``sglang.srt.plugins`` entry point.

SGLang runs the model in ``multiprocessing`` children started with *spawn*;
from 0.5.11 each scheduler process loads the ``sglang.srt.plugins`` entry points
first thing, after its modules are imported. :func:`plugin` applies the shim
there and rebinds the ``fp4_quantize`` globals those modules already bound.
What differs between SGLang releases is in ``sglang_releases``.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__.lstrip("_"))  # users configure the "fp4_dynamo_shim" logger tree


def _say(level: int, message: str) -> None:
    """Log ``message``; before SGLang has set up its logging (plugins load first thing in a scheduler), write
    it to stderr, which is the scheduler's log, so that the line is never lost."""
    if logging.getLogger().hasHandlers():
        logger.log(level, message)
    else:
        sys.stderr.write(f"fp4_dynamo_shim: {message}\n")


def plugin() -> None:
    """SGLang general plugin (entry point group ``sglang.srt.plugins``), run in every scheduler process.

    Says in the scheduler's log whether the shim is active there.
    """
    from .. import lifecycle as patching

    if patching.apply(route="plugin"):
        rebound = patching.rebind_modules()
        state = patching.status()
        _say(logging.INFO, f"fp4_dynamo_shim is active in this SGLang process (activated by {state['activated_by']}; "
                           f"flashinfer {state['flashinfer']}; {len(rebound)} more bindings rebound now)")
    else:
        state = patching.status()
        _say(logging.INFO if state["disabled"] else logging.WARNING,
             f"fp4_dynamo_shim is NOT active in this SGLang process: {state['problem']}")
