"""verify's worker check: what a plain launch's spawned workers get (SGLang starts its schedulers with
multiprocessing spawn, which runs no code of the parent's). :func:`probe_worker` is the child's body; the
child imports this module only, which applies nothing."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import List, Optional

from .. import lifecycle, switches
from ..activation import export
from ..sglang import sglang_releases
from .checks import Skip


@contextlib.contextmanager
def _main_module_hidden():
    """multiprocessing's spawn re-imports the parent's main module in the child (here verify itself, which
    imports the shim). SGLang's launcher does not import the shim, so the probe child must not either."""
    import types

    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


#: How a spawned worker came to apply the shim (its ``status()["activated_by"]``), in words.
ACTIVATED_BY = {
    "pth": "the package's .pth hook",
    "install-hook": "install-hook's always-on .pth",
    "sitecustomize": "the sitecustomize hook",
    "plugin": "the SGLang plugin",
}


@contextlib.contextmanager
def _environment(variables: dict):
    """``os.environ`` is ``variables`` inside the block: a spawned child copies the environment when it starts."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _start_probe(context, variables: dict, run_plugins: bool):
    queue = context.Queue()
    process = context.Process(target=probe_worker, args=(queue, run_plugins))
    with _main_module_hidden(), _environment(variables):
        process.start()
    return process, queue


def _probe_report(process, queue) -> dict:
    try:
        return queue.get(timeout=600)
    finally:
        process.join(timeout=60)


def _outcome(report: dict) -> str:
    if report.get("active"):
        return "applied by " + ACTIVATED_BY.get(report["activated_by"], str(report["activated_by"]))
    return "NOT applied" + (f" ({report['error']})" if report.get("error") else "")


def check_worker_activation(device: str) -> str:
    """What the user's own launch gets in its workers. Two children are started the way SGLang starts its
    schedulers (multiprocessing spawn, no import of the shim there, SGLang's plugins loaded where the installed
    release loads them): one with this environment minus what verify or ``import fp4_dynamo_shim`` set here,
    as a plain ``python -m sglang.launch_server`` starts, and one with FP4_DYNAMO_SHIM=1 added. The verdict is
    :func:`worker_verdict`'s."""
    import multiprocessing

    state = lifecycle.status()
    if state["disabled"]:
        raise Skip("FP4_DYNAMO_SHIM_DISABLE=1: workers do not apply the shim, as asked")
    variable = switches.HOOK
    version = sglang_releases.installed_version()
    release = sglang_releases.release_for(version)
    run_plugins = bool(state["routes"]["plugin"]) and release is not None and release.loads_plugins
    plain = export.user_environment()
    context = multiprocessing.get_context("spawn")
    started = [_start_probe(context, variables, run_plugins) for variables in (plain, {**plain, variable: "1"})]
    plain_report, variable_report = [_probe_report(*probe) for probe in started]

    enabled, problem = switches.read(variable, plain)
    routes = state["routes"]
    asked = [reason for reason, present in (
        (f"{variable}={plain.get(variable)!r}" + (" (not understood)" if problem else ""), enabled or problem),
        (f"an always-on hook ({routes['hook_pth'] or routes['sitecustomize']})",
         routes["hook_pth"] or routes["sitecustomize"]),
    ) if present]
    passed, detail = worker_verdict(plain_report, variable_report, asked, version)
    if not passed:
        raise AssertionError(detail)
    return detail


def worker_verdict(plain: dict, with_variable: dict, asked: List[str], sglang_version: Optional[str]) -> tuple:
    """(passed, what to print) from the two probe workers' reports: it fails where the plain launch's worker
    runs without the shim although ``asked`` names what asks for it (FP4_DYNAMO_SHIM, an always-on hook) or
    the installed SGLang needs it, and where no route reaches a worker at all."""
    variable = switches.HOOK
    release = sglang_releases.release_for(sglang_version)
    needed = sglang_releases.needs_shim(release)
    if sglang_version is None:
        sglang_line = "sglang not installed"
    elif needed:
        sglang_line = (f"sglang {sglang_version} needs the shim in its schedulers ("
                       f"{sglang_releases.describe_prefill_graph(release)})"
                       + ("" if release.loads_plugins else " and loads no plugins (before 0.5.11)"))
    elif release is None:
        sglang_line = f"sglang {sglang_version}: a release this shim's table does not know"
    else:
        sglang_line = (f"sglang {sglang_version} does not need it on a plain launch ("
                       f"{sglang_releases.describe_prefill_graph(release)}; FlashInfer's FP4 calls are not traced raw there)")
    detail = (f"plain launch (this environment{', ' + ' and '.join(asked) if asked else ''}): {_outcome(plain)}; "
              f"with {variable}=1: {_outcome(with_variable)}; {sglang_line}")
    see = "see docs/usage.md, \"Is it active in my SGLang workers?\""
    if plain.get("active"):
        return True, detail
    if not with_variable.get("active"):
        return False, (f"{detail}. No route reaches a spawned worker here (a .pth runs only from an installed "
                       f"package, not from PYTHONPATH): install the package with pip (wheel or -e) or run "
                       f"`fp4-dynamo-shim install-hook`; {see}")
    if asked or needed:
        return False, (f"{detail}. Start the launch with {variable}=1 (checked above: that works), or run "
                       f"`fp4-dynamo-shim install-hook`; {see}")
    return True, f"{detail}; nothing here asks a plain launch for the shim"



def probe_worker(queue, run_sglang_plugins=False):
    """Body of verify's worker-activation check, run in a child started the way SGLang starts its schedulers
    (multiprocessing spawn): import flashinfer as a scheduler does, optionally load SGLang's plugins as its
    scheduler does, and report whether the shim became active and through which route. Lives here because
    the child must not import the shim to find this function."""
    startup = sys.modules.get("_fp4_dynamo_shim.activation.startup")
    report = {"hook_route": getattr(startup, "route", None)}
    try:
        import flashinfer  # noqa: F401 - importing it is what runs the start-up hook in this child

        # applied, not "fp4_quantize is the shim's": on a release newer than tested, that part may be FlashInfer's
        patched = lifecycle.status()["applied"]
        report["plugin_ran"] = False
        if run_sglang_plugins and not patched:
            from sglang.srt.plugins import load_plugins

            load_plugins()
            report["plugin_ran"] = True
            patched = lifecycle.status()["applied"]
        report["active"] = patched
        report["activated_by"] = lifecycle.status()["activated_by"]
    except Exception as error:  # the report carries the failure to the parent
        report.update(active=False, error=f"{type(error).__name__}: {error}")
    queue.put(report)
