"""SGLang's ``sglang.srt.plugins`` entry point.

SGLang runs the model in ``multiprocessing`` children started with *spawn*;
from 0.5.11 each scheduler process loads the ``sglang.srt.plugins`` entry points
first thing, after its modules are imported. :func:`plugin` applies the shim
there and rebinds the ``fp4_quantize`` globals those modules already bound.
What differs between SGLang releases is in ``sglang_releases``.
"""

from __future__ import annotations

from .. import switches


def plugin() -> None:
    """SGLang general plugin (entry point group ``sglang.srt.plugins``), run in every scheduler process.

    Says in the scheduler's log whether the shim is active there (on stderr, the scheduler's log, when SGLang
    has not set up its logging yet: plugins load first thing).
    """
    from .. import lifecycle

    if lifecycle.apply(route="plugin"):
        rebound = lifecycle.rebind_modules()
        state = lifecycle.status()
        switches.say(f"fp4_dynamo_shim is active in this SGLang process (activated by {state['activated_by']}; "
                     f"flashinfer {state['flashinfer']['version']}; {len(rebound)} more bindings rebound now)", "info")
    else:
        state = lifecycle.status()
        switches.say(f"fp4_dynamo_shim is NOT active in this SGLang process: {state['problem']}",
                     "info" if state["disabled"] else "warning")
