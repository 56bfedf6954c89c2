"""Start-up half of fp4_dynamo_shim's import hook.

Three start-up routes import this module: ``fp4_dynamo_shim.pth`` (from the package, only when
``FP4_DYNAMO_SHIM=1``), the unconditional ``.pth`` that ``fp4-dynamo-shim install-hook`` writes, and the
sitecustomize block it writes where ``.pth`` files are not processed. It makes the shim follow SGLang into
every spawned worker: as soon as ``flashinfer`` is imported, the shim applies.

Start-up cost matters (every process pays it), so at start-up this only puts a tiny finder on
``sys.meta_path``; it imports nothing. wrapt is imported, and its post-import hook registered, when
``flashinfer`` itself is first imported: wrapt 2.x imports asyncio and importlib.metadata, about 45 ms
per process start, which is noise next to importing flashinfer but not next to ``python -c pass``.
Nothing here may stop the program, so every failure becomes one warning.

It is also where the project's on/off switches are parsed (stdlib only, so that start-up code can use it),
where verify's worker probe lives (a spawned child must be able to import it without the shim), and where
the package learns why it is being imported (:func:`import_route`): by a start-up route, by the
project's own command line (which applies only for the commands that need it), or by the user.
"""

import os
import sys

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")
HOOK_VARIABLE = "FP4_DYNAMO_SHIM"
DISABLE_VARIABLE = "FP4_DYNAMO_SHIM_DISABLE"

#: The start-up route that installed the hook in this process ("pth", "install-hook" or "sitecustomize").
route = None
#: Set while a route here imports the package (a start-up route's name, "plugin" or :data:`CLI`).
activating = None
#: What :func:`import_route` answers for the command line: the package's import then applies nothing.
CLI = "cli"
#: The modules ``python -m`` runs as the command line (their package is imported on the way).
CLI_MODULES = ("fp4_dynamo_shim", "fp4_dynamo_shim.__main__", "fp4_dynamo_shim.verify")
_installed = False
#: The warnings printed in this process (the package's own warnings skip these: one warning per message).
warned = set()


def switch(name, environ=None):
    """(value, problem) of an on/off variable: unset or a false word is off, a true word is on, anything else
    is off with a problem naming the variable and the accepted values."""
    raw = (os.environ if environ is None else environ).get(name, "")
    value = raw.strip().lower()
    if value in TRUE:
        return True, None
    if value in FALSE:
        return False, None
    return False, (f"{name}={raw!r} is not understood; use 1, true, yes or on to switch it on, or 0, false, "
                   "no, off or unset for off (treated as off)")


def warn(message):
    """One warning per message and process, on stderr, where a start-up failure has to be seen."""
    if message in warned:
        return
    warned.add(message)
    import logging

    logger = logging.getLogger("fp4_dynamo_shim.hook")
    if logger.hasHandlers():
        logger.warning("fp4_dynamo_shim: %s", message)
    else:
        sys.stderr.write(f"fp4_dynamo_shim: {message}\n")


def _warn_failure(stage, error):
    warn(f"import hook: {stage} failed ({type(error).__name__}: {error}); continuing without the shim")


def enabled_by_environment():
    """Whether ``FP4_DYNAMO_SHIM`` asks for the hook (and ``FP4_DYNAMO_SHIM_DISABLE`` does not veto it)."""
    enabled, problem = switch(HOOK_VARIABLE)
    if problem:
        warn(problem)
    disabled, problem = switch(DISABLE_VARIABLE)
    if problem:
        warn(problem)
    return enabled and not disabled


class _importing_as:  # noqa: N801  (used as a context manager; contextlib would cost every interpreter start)
    """Mark the package's import inside the with-block as ``name``'s (see :func:`import_route`)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        global activating
        activating = self.name

    def __exit__(self, *exception):
        global activating
        activating = None


def import_route():
    """Why the package is being imported, asked by its ``__init__``: the route's name while a route here
    imports it (the hook, the plugin), :data:`CLI` for the command line (``fp4-dynamo-shim``, ``python -m
    fp4_dynamo_shim``, ``python -m fp4_dynamo_shim.verify``), else "import" (the user's own import)."""
    if activating is not None:
        return activating
    # While ``python -m X`` locates X, sys.argv[0] is "-m" and X's packages are imported; X itself is only in
    # the original command line.
    if sys.argv[:1] == ["-m"] and _module_after_m(getattr(sys, "orig_argv", ())[1:]) in CLI_MODULES:
        return CLI
    return "import"


def _module_after_m(arguments):
    """The module name ``python -m`` was given in ``arguments`` (the interpreter's options onwards), or None."""
    arguments = list(arguments)
    while arguments:
        argument = arguments.pop(0)
        if argument == "--" or not argument.startswith("-") or argument == "-":
            return None
        if argument.startswith("--"):
            continue
        for position, flag in enumerate(argument[1:], 1):
            rest = argument[position + 1:]
            if flag == "m":
                return rest or (arguments[0] if arguments else None)
            if flag == "c":
                return None
            if flag in "XW":  # an option with a value: the rest of this argument or the next one
                if not rest and arguments:
                    arguments.pop(0)
                break
    return None


def _on_flashinfer_imported(module):
    try:
        with _importing_as(route):
            import fp4_dynamo_shim  # noqa: F401  (importing applies the shim)
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
        disabled, problem = switch(DISABLE_VARIABLE)
        if problem:
            warn(problem)
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


def sglang_plugin():
    """SGLang's ``sglang.srt.plugins`` entry point (loaded in the launcher and in every scheduler process).

    It lives here, outside the package, so that importing it does not count as ``import fp4_dynamo_shim``:
    the package's import route would export FP4_DYNAMO_SHIM=1 and hand every child to the import hook,
    and the plugin route could never be seen on its own."""
    with _importing_as("plugin"):
        import fp4_dynamo_shim  # noqa: F401  (the package's import, as the plugin's route)
        from _fp4_dynamo_shim.entry import sglang_plugin as sglang
    sglang.plugin()


def cli():
    """The ``fp4-dynamo-shim`` console script. It lives here, outside the package, for the same reason as
    the plugin: the package's import must not apply the shim for ``--version``, ``status`` or the hook
    commands (``verify`` applies it itself)."""
    with _importing_as(CLI):
        import fp4_dynamo_shim  # noqa: F401  (the package's import, as the command line's: applies nothing)
        from _fp4_dynamo_shim.cli import main
    return main()


def probe_worker(queue, run_sglang_plugins=False):
    """Body of verify's worker-activation check, run in a child started the way SGLang starts its schedulers
    (multiprocessing spawn): import flashinfer as a scheduler does, optionally load SGLang's plugins as its
    scheduler does, and report whether the shim became active and through which route. Lives here because
    the child must not import the shim to find this function."""
    report = {"hook_route": route, "shim_imported_at_start": "fp4_dynamo_shim" in sys.modules}
    try:
        import flashinfer

        patched = getattr(flashinfer.fp4_quantize, "__fp4_dynamo_shim__", False) is True
        report["plugin_ran"] = False
        if run_sglang_plugins and not patched:
            from sglang.srt.plugins import load_plugins

            load_plugins()
            report["plugin_ran"] = True
            patched = getattr(flashinfer.fp4_quantize, "__fp4_dynamo_shim__", False) is True
        report["active"] = patched
        shim = sys.modules.get("fp4_dynamo_shim")
        report["activated_by"] = shim.status()["activated_by"] if shim is not None else None
    except Exception as error:  # the report carries the failure to the parent
        report.update(active=False, error=f"{type(error).__name__}: {error}")
    queue.put(report)
