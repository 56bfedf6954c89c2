"""``fp4-dynamo-shim`` / ``python -m fp4_dynamo_shim``: verify, status, install-hook, uninstall-hook."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="fp4-dynamo-shim")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("verify", help="check the shim on this machine (see --help of verify)", add_help=False)
    commands.add_parser("status", help="print fp4_dynamo_shim.status() as JSON")
    for name, verb in (("install-hook", "add"), ("uninstall-hook", "remove")):
        sub = commands.add_parser(name, help=f"{verb} the import hook block in sitecustomize.py")
        sub.add_argument("--site-dir", type=Path, help="default: this interpreter's site-packages")
    if argv[:1] == ["verify"]:
        from . import verify

        return verify.main(argv[1:])
    options = parser.parse_args(argv)
    if options.command == "status":
        import fp4_dynamo_shim

        print(json.dumps(fp4_dynamo_shim.status(), indent=2))
        return 0
    from . import hook

    if options.site_dir is not None and not options.site_dir.is_dir():
        print(f"fp4-dynamo-shim {options.command}: {options.site_dir} is not a directory", file=sys.stderr)
        return 2
    if options.command == "install-hook":
        path, changed = hook.install_hook(options.site_dir)
        print(f"{'wrote the import hook to' if changed else 'import hook already present in'} {path}")
    else:
        path, changed = hook.uninstall_hook(options.site_dir)
        print(f"{'removed the import hook from' if changed else 'no import hook in'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
