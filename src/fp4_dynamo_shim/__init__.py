"""Make FlashInfer's FP4 quantization traceable by ``torch.compile(fullgraph=True)``.

``import fp4_dynamo_shim`` applies the shim (unless ``FP4_DYNAMO_SHIM_DISABLE=1``):
``flashinfer.fp4_quantize`` and every module global bound to it become a function
with the same signature that calls the ``fp4_dynamo_shim::fp4_quantize`` custom op,
and ``FP4_DYNAMO_SHIM=1`` is exported so that child processes apply it too.
``apply``, ``revert`` and ``status`` are the whole public API; the implementation is
``_fp4_dynamo_shim``, which applies nothing on import.
"""

from _fp4_dynamo_shim import __version__
from _fp4_dynamo_shim.activation import importer

__all__ = ["apply", "revert", "status"]

# `python -m fp4_dynamo_shim[.verify]` imports this package on its way: the command line applies only where a
# command needs it, and loads torch and FlashInfer only then (`--version` does not pay for them).
if not importer.running_the_command_line():
    from _fp4_dynamo_shim import lifecycle
    from _fp4_dynamo_shim.activation import export
    from _fp4_dynamo_shim.lifecycle import apply, revert, status

    # The import adds the export to children, applied only where this import applies the shim: a start-up
    # route or the plugin that applied it first reaches children by itself.
    lifecycle.apply(route="import", layers=(export,))


def __getattr__(name):
    """``apply``/``revert``/``status`` where the command line imported the package (loaded on first use)."""
    if name in __all__:
        from _fp4_dynamo_shim import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
