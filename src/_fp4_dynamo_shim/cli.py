"""fp4-dynamo-shim / python -m fp4_dynamo_shim: verify, status, install-hook, uninstall-hook.

Nothing here applies the shim except ``verify``, which applies it as its first check: ``--version``,
``--help`` and the hook commands load neither torch nor FlashInfer, and ``status`` reports this process
without changing it.

Exit codes: 0 ok, 1 a check failed (verify) or the hook could not be installed so that it runs,
2 the shim is not applied (verify), 3 usage error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

from .errors import EXIT_FAILED, EXIT_OK
from .usage import UsageParser


def _parser():
    parser = UsageParser(prog="fp4-dynamo-shim", description="Make FlashInfer's FP4 quantization traceable by "
                    "torch.compile(fullgraph=True), for SGLang's piecewise CUDA graphs.",
                    epilog="Exit codes: 0 ok, 1 failed, 2 the shim is not applied (verify), 3 usage error.")
    parser.add_argument("--version", action="version", version=f"fp4-dynamo-shim {version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)
    verify = commands.add_parser(
        "verify", help="check the shim on this machine and in a spawned worker (verify --help)",
        description="Does the shim work on this machine, and in its SGLang workers? Applies it, prints the "
                    "environment, what was patched, then one line per check.",
        epilog="Exit codes: 0 ok, 1 a check failed, 2 the shim is not applied, 3 usage error.")
    verify.add_argument("--json", action="store_true", help="print one JSON document")
    verify.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when a GPU is visible, else cpu")
    verify.add_argument("--baseline", action="store_true", help="also show FlashInfer failing without the shim")
    verify.add_argument("--verbose", action="store_true", help="list every rebound name by module")
    verify.add_argument("--version", action="version", version=f"fp4-dynamo-shim {version()}")
    verify.set_defaults(usage_error=verify.error)  # a value verify refuses after parsing (no GPU for --device cuda)
    commands.add_parser("status", help="print fp4_dynamo_shim.status() of this process (which applies nothing) "
                                       "as JSON")
    install = commands.add_parser(
        "install-hook", help="apply the shim whenever flashinfer is imported, in every process of this environment",
        description="Writes fp4_dynamo_shim_hook.pth into a site directory (default: this interpreter's "
                    "site-packages), or a block into sitecustomize.py in a directory that is not one (for "
                    "pip install --target on PYTHONPATH), then checks that a new interpreter runs it. "
                    "Before pip uninstall, run uninstall-hook.")
    install.add_argument("--site-dir", type=Path, help="default: this interpreter's site-packages")
    install.add_argument("--sitecustomize", action="store_true",
                         help="write the sitecustomize block even into a site directory")
    uninstall = commands.add_parser("uninstall-hook", help="remove what install-hook wrote (before pip uninstall)")
    uninstall.add_argument("--site-dir", type=Path, help="default: this interpreter's site-packages")
    return parser


def version() -> str:
    """The package's own version string: asking importlib.metadata instead scans every installed distribution
    (60-80 ms of the 90 ms `--version` took in this project's venvs)."""
    from . import __version__

    return __version__


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command == "verify":
        from .verify import report

        return report.run(options, options.usage_error)
    if options.command == "status":
        from . import lifecycle

        print(json.dumps(lifecycle.status(), indent=2))
        return EXIT_OK
    from _fp4_dynamo_shim.activation import site_files
    from _fp4_dynamo_shim import startup_files

    if options.site_dir is not None and not options.site_dir.is_dir():
        parser.error(f"{options.command}: {options.site_dir} is not a directory")
    if options.command == "install-hook":
        try:
            installed = site_files.install_hook(options.site_dir, sitecustomize=options.sitecustomize)
        except site_files.HookNotRunning as error:
            print(f"fp4-dynamo-shim install-hook: {error}", file=sys.stderr)
            return EXIT_FAILED
        except OSError as error:  # a site directory this user cannot write: nothing was written
            print(f"fp4-dynamo-shim install-hook: cannot write the hook in {options.site_dir or startup_files.default_site_dir()} "
                  f"({error.strerror or error}); nothing was changed", file=sys.stderr)
            return EXIT_FAILED
        verb = "wrote the import hook to" if installed.changed else "import hook already present in"
        print(f"{verb} {installed.path} ({installed.route} route; checked: a new interpreter runs it)")
        disabled = _kill_switch_note()
        if disabled:
            print(f"fp4-dynamo-shim install-hook: {disabled}", file=sys.stderr)
    else:
        try:
            changed = site_files.uninstall_hook(options.site_dir)
        except ValueError as error:  # a block whose end marker is gone: nothing was changed
            print(f"fp4-dynamo-shim uninstall-hook: {error}", file=sys.stderr)
            return EXIT_FAILED
        except OSError as error:
            print(f"fp4-dynamo-shim uninstall-hook: cannot change {options.site_dir or startup_files.default_site_dir()} "
                  f"({error.strerror or error})", file=sys.stderr)
            return EXIT_FAILED
        print("removed the import hook from " + ", ".join(map(str, changed)) if changed else
              f"no import hook in {options.site_dir or startup_files.default_site_dir()}")
    return EXIT_OK


def _kill_switch_note() -> Optional[str]:
    """What install-hook says when the kill switch is on here: the hook is in place, and does nothing."""
    from . import switches

    disabled, _ = switches.read(switches.DISABLE)
    if not disabled:
        return None
    return (f"{switches.DISABLE}={os.environ[switches.DISABLE]} is set in this environment: the "
            "hook is installed (checked without the variable), but it applies nothing in any process that "
            "inherits the variable. Unset it to have the shim applied.")


if __name__ == "__main__":
    sys.exit(main())
