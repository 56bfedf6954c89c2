"""Make FlashInfer's FP4 quantization traceable by ``torch.compile(fullgraph=True)``.

``import fp4_dynamo_shim`` applies the shim (unless ``FP4_DYNAMO_SHIM_DISABLE=1``):
``flashinfer.fp4_quantize`` and every module global bound to it become a function
with the same signature that calls the ``fp4_dynamo_shim::fp4_quantize`` custom op,
and ``FP4_DYNAMO_SHIM=1`` is exported so that child processes apply it too.
``apply``, ``revert`` and ``status`` are the whole public API.
"""

import fp4_dynamo_shim_hook as _startup

__all__ = ["apply", "revert", "status"]
__version__ = "0.1.0"

# The start-up module says who imports the package: a start-up route or the plugin (the route is recorded;
# those reach children by themselves), the command line (which applies only where a command needs it), or
# the user, whose import alone exports FP4_DYNAMO_SHIM=1 for children.
_route = _startup.import_route()
if _route != _startup.CLI:
    from _fp4_dynamo_shim import lifecycle as patching
    from _fp4_dynamo_shim.lifecycle import apply, revert, status

    if patching.apply(route=_route) and _route == "import":
        patching.export_for_children()


def __getattr__(name):
    """``apply``/``revert``/``status`` where the command line imported the package: patching (torch, FlashInfer)
    loads on first use, so that ``fp4-dynamo-shim --version`` does not pay for it."""
    if name in __all__:
        from _fp4_dynamo_shim import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
