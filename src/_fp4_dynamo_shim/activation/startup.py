"""Start-up route: apply the shim in every process that imports flashinfer.

Three files start it when an interpreter starts (``activation.site_files`` writes them, ``startup_files`` finds them): the package's
``fp4_dynamo_shim.pth`` (only with ``FP4_DYNAMO_SHIM=1``), the ``.pth`` that ``install-hook`` writes, and the
sitecustomize block it writes where ``.pth`` files are not processed. They call ``fp4_dynamo_shim_hook``,
which forwards here. It makes the shim follow SGLang into every spawned worker: as soon as ``flashinfer`` is
imported, the shim applies.

Start-up cost matters (every process pays it), so at start-up this only puts a tiny finder on
``sys.meta_path``; it imports nothing but :mod:`.switches`. wrapt is imported, and its post-import hook
registered, when ``flashinfer`` itself is first imported: wrapt 2.x imports asyncio and importlib.metadata,
about 45 ms per process start, which is noise next to importing flashinfer but not next to ``python -c pass``.
Nothing here may stop the program, so every failure becomes one warning (strict mode's ApplyError excepted).
"""

import sys

from .. import switches

#: The start-up route that installed the hook in this process ("pth", "install-hook" or "sitecustomize").
route = None
_installed = False


def _warn_failure(stage, error):
    switches.warn(f"import hook: {stage} failed ({type(error).__name__}: {error}); continuing without the shim")


def enabled_by_environment():
    """Whether ``FP4_DYNAMO_SHIM`` asks for the hook (and ``FP4_DYNAMO_SHIM_DISABLE`` does not veto it)."""
    enabled, problem = switches.read(switches.HOOK)
    if problem:
        switches.warn(problem)
    disabled, problem = switches.read(switches.DISABLE)
    if problem:
        switches.warn(problem)
    return enabled and not disabled


def _on_flashinfer_imported(module):
    try:
        from .. import lifecycle

        lifecycle.apply(route=route)
    except Exception as error:
        if type(error).__name__ == "ApplyError":  # FP4_DYNAMO_SHIM_STRICT=1 asked for this to be loud
            raise
        _warn_failure("applying the shim", error)


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
            _warn_failure("installing the post-import hook", error)
            return None


def install(installed_by="sitecustomize"):
    """Apply fp4_dynamo_shim as soon as flashinfer is imported in this process. Never raises.

    Runs once per process: CPython 3.11's site.py processes a venv's .pth files twice.
    """
    global _installed, route
    if _installed:
        return
    _installed = True
    try:
        disabled, problem = switches.read(switches.DISABLE)
        if problem:
            switches.warn(problem)
        if disabled:
            return
        route = installed_by
        if "flashinfer" in sys.modules:
            _on_flashinfer_imported(sys.modules["flashinfer"])
        else:
            sys.meta_path.insert(0, _AwaitFlashinfer())
    except Exception as error:
        _warn_failure("installing the import hook", error)


def install_if_enabled():
    """What the package's .pth line runs: nothing at all unless FP4_DYNAMO_SHIM=1."""
    if enabled_by_environment():
        install("pth")
