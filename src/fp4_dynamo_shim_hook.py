"""Start-up half of fp4_dynamo_shim's import hook.

``fp4_dynamo_shim.pth`` imports this module only when ``FP4_DYNAMO_SHIM=1``; a sitecustomize block
written by ``fp4-dynamo-shim install-hook`` imports it unconditionally. It makes the shim follow SGLang
into every spawned worker: as soon as ``flashinfer`` is imported, the shim applies.

Start-up cost matters (every process pays it), so at start-up this only puts a tiny finder on
``sys.meta_path``; it imports nothing. wrapt is imported, and its post-import hook registered, when
``flashinfer`` itself is first imported: wrapt 2.x imports asyncio and importlib.metadata, about 45 ms
per process start, which is noise next to importing flashinfer but not next to ``python -c pass``.
Nothing here may stop the program, so every failure becomes one logged warning.
"""

import os
import sys

_installed = False


def _warn(stage, error):
    import logging

    logging.getLogger("fp4_dynamo_shim.hook").warning(
        "fp4_dynamo_shim import hook: %s failed (%s: %s); continuing without the shim",
        stage, type(error).__name__, error,
    )


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


class _AwaitFlashinfer:
    """Meta-path finder that wakes once, when ``flashinfer`` is first imported, and hands over to wrapt."""

    def find_spec(self, name, path=None, target=None):
        if name != "flashinfer":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import importlib.util

            import wrapt

            wrapt.register_post_import_hook(_on_flashinfer_imported, "flashinfer")
            # Find it again, now through wrapt's finder, so that this very import fires the hook.
            return importlib.util.find_spec(name)
        except Exception as error:
            _warn("installing the post-import hook", error)
            return None


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
        if "flashinfer" in sys.modules:
            _on_flashinfer_imported(sys.modules["flashinfer"])
        else:
            sys.meta_path.insert(0, _AwaitFlashinfer())
    except Exception as error:
        _warn("installing the import hook", error)


def install_if_enabled():
    """What the .pth line runs: nothing at all unless FP4_DYNAMO_SHIM=1."""
    if enabled_by_environment():
        install()
