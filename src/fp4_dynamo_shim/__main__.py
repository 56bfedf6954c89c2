"""fp4-dynamo-shim / python -m fp4_dynamo_shim: verify, status, install-hook, uninstall-hook.

Exit codes: 0 ok, 1 a check failed (verify) or the hook could not be installed so that it runs,
2 the shim is not applied (verify), 3 usage error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 3


def _parser():
    from .verify import Parser

    parser = Parser(prog="fp4-dynamo-shim", description="Make FlashInfer's FP4 quantization traceable by "
                    "torch.compile(fullgraph=True), for SGLang's piecewise CUDA graphs.",
                    epilog="Exit codes: 0 ok, 1 failed, 2 the shim is not applied (verify), 3 usage error.")
    parser.add_argument("--version", action="version", version=f"fp4-dynamo-shim {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    commands.add_parser("verify", help="check the shim on this machine and in a spawned worker (verify --help)",
                        add_help=False)
    commands.add_parser("status", help="print fp4_dynamo_shim.status() as JSON")
    install = commands.add_parser(
        "install-hook", help="apply the shim whenever flashinfer is imported, in every process of this environment",
        description="Writes fp4_dynamo_shim_hook.pth into a site directory (default: this interpreter's "
                    "site-packages), or a block into sitecustomize.py in a directory that is not one (for "
                    "pip install --target on PYTHONPATH), then checks that a new interpreter runs it.")
    install.add_argument("--site-dir", type=Path, help="default: this interpreter's site-packages")
    install.add_argument("--sitecustomize", action="store_true",
                         help="write the sitecustomize block even into a site directory")
    uninstall = commands.add_parser("uninstall-hook", help="remove what install-hook wrote")
    uninstall.add_argument("--site-dir", type=Path, help="default: this interpreter's site-packages")
    return parser


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("fp4-dynamo-shim")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0 (not installed)"


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify"]:
        from . import verify

        return verify.main(argv[1:])
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command == "status":
        import fp4_dynamo_shim

        print(json.dumps(fp4_dynamo_shim.status(), indent=2))
        return EXIT_OK
    from . import hook

    if options.site_dir is not None and not options.site_dir.is_dir():
        parser.error(f"{options.command}: {options.site_dir} is not a directory")
    if options.command == "install-hook":
        try:
            installed = hook.install_hook(options.site_dir, sitecustomize=options.sitecustomize)
        except hook.HookNotRunning as error:
            print(f"fp4-dynamo-shim install-hook: {error}", file=sys.stderr)
            return EXIT_FAILED
        verb = "wrote the import hook to" if installed.changed else "import hook already present in"
        print(f"{verb} {installed.path} ({installed.route} route; checked: a new interpreter runs it)")
    else:
        changed = hook.uninstall_hook(options.site_dir)
        print("removed the import hook from " + ", ".join(map(str, changed)) if changed else
              f"no import hook in {options.site_dir or hook.default_site_dir()}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
