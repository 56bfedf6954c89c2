"""The export to spawned children, a layer of its own: ``import fp4_dynamo_shim`` applies it after the others.

It sets ``FP4_DYNAMO_SHIM=1`` for child processes, unless the user set the variable to a value the hook
understands, and warns once if no start-up route would act on it in a child. A value the hook does not
understand would leave every child without the shim: it is replaced, and the warning names it. Its undo
(``revert()``) puts back exactly what it changed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from .. import startup_files, switches
from ..layers import Context
from ..sglang import sglang_releases

#: The export in force in this process, if it set the variable itself (what ``user_environment`` takes back).
_in_force: Optional["Exported"] = None


@dataclasses.dataclass
class Exported:
    #: Whether the export set the variable (False where the user's own value was one the hook understands).
    set_here: bool
    #: The user's value it replaced (one the hook does not understand), or None.
    replaced: Optional[str] = None

    def undo(self) -> None:
        global _in_force
        if self.set_here and os.environ.get(switches.HOOK) == "1":
            if self.replaced is None:
                del os.environ[switches.HOOK]
            else:
                os.environ[switches.HOOK] = self.replaced
        _in_force = None

    def describe(self) -> dict:
        return {"children": startup_files.children(exported=self.set_here)}


def apply(context: Context) -> Exported:
    global _in_force
    value = os.environ.get(switches.HOOK, "")
    exported = Exported(set_here=False)
    if not value.strip() or switches.read(switches.HOOK)[1]:
        os.environ[switches.HOOK] = "1"
        exported = _in_force = Exported(set_here=True, replaced=value if value.strip() else None)
        if exported.replaced is not None:
            switches.warn(f"import fp4_dynamo_shim set {switches.HOOK}=1 for child processes in place of "
                          f"{value!r}, which the import hook does not understand (children would run without "
                          "the shim); revert() puts it back")
    _warn_without_a_route()
    return exported


def _warn_without_a_route() -> None:
    routes = startup_files.installed_routes()
    if routes["pth"] or routes["hook_pth"] or routes["sitecustomize"]:
        return
    plugin = sglang_releases.plugin_entry_point()
    sites = ", ".join(map(str, startup_files.site_dirs())) or "any site directory"
    switches.warn(
        f"import fp4_dynamo_shim exports {switches.HOOK}=1 for child processes, but no import hook is installed "
        f"where they start (no {startup_files.PACKAGE_PTH} or {startup_files.HOOK_PTH} in {sites}"
        + (f"; {routes['sitecustomize_shadowed_by']} shadows the sitecustomize block" if routes["sitecustomize_shadowed_by"] else "")
        + "), so spawned workers such as SGLang's schedulers will not apply the shim"
        + (" (the SGLang plugin still does, on SGLang >= 0.5.11)" if plugin else "")
        + ". Install the package with pip (a wheel or -e), or run `fp4-dynamo-shim install-hook`; "
        "`python -m fp4_dynamo_shim.verify` checks a spawned worker."
    )


def user_environment() -> dict:
    """``os.environ`` as the user set it: without what the export changed here."""
    environment = dict(os.environ)
    if _in_force is not None and environment.get(switches.HOOK) == "1":
        if _in_force.replaced is None:
            del environment[switches.HOOK]
        else:
            environment[switches.HOOK] = _in_force.replaced
    return environment
