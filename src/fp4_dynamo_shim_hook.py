"""Start-up half of fp4_dynamo_shim's import hook.

``fp4_dynamo_shim.pth`` imports this module only when ``FP4_DYNAMO_SHIM=1``;
a sitecustomize block written by ``fp4-dynamo-shim install-hook`` imports it
unconditionally. It must stay tiny and must never import torch or flashinfer:
it only asks wrapt to apply the shim once ``flashinfer`` is imported, which
makes the shim follow SGLang into every spawned worker process. Nothing here
may stop the interpreter, so every failure becomes one logged warning.
"""

import logging
import os

_logger = logging.getLogger("fp4_dynamo_shim.hook")


def _warn(stage, error):
    _logger.warning("fp4_dynamo_shim import hook: %s failed (%s: %s); continuing without the shim",
                    stage, type(error).__name__, error)


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def enabled_by_environment():
    return _flag("FP4_DYNAMO_SHIM") and not _flag("FP4_DYNAMO_SHIM_DISABLE")


def _on_flashinfer_imported(module):
    try:
        import fp4_dynamo_shim  # noqa: F401  (importing applies the shim)
    except Exception as error:
        if type(error).__name__ == "ApplyError":  # FP4_DYNAMO_SHIM_STRICT=1 asked for this to be loud
            raise
        _warn("applying the shim", error)


_installed = False


def install():
    """Apply fp4_dynamo_shim as soon as flashinfer is imported in this process. Never raises.

    Runs once per process: CPython 3.11's site.py processes a venv's .pth files twice.
    """
    global _installed
    if _installed:
        return
    _installed = True
    try:
        if _flag("FP4_DYNAMO_SHIM_DISABLE"):
            return
        import wrapt

        wrapt.register_post_import_hook(_on_flashinfer_imported, "flashinfer")
    except Exception as error:
        _warn("installing the post-import hook", error)


def install_if_enabled():
    """What the .pth line runs: nothing at all unless FP4_DYNAMO_SHIM=1."""
    if enabled_by_environment():
        install()
