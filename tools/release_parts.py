"""Which of a FlashInfer release's parts match the newest tested release's, and what differs: for the next row.

    python tools/release_parts.py                      # the installed flashinfer
    python tools/release_parts.py PATH                 # a wheel (.whl) or a folder holding the flashinfer package
    python tools/release_parts.py --json [PATH]        # the same as data (the matrix reads it)
    python tools/release_parts.py --record             # write src/_fp4_dynamo_shim/tested_sources.py from the
                                                       # installed flashinfer, the newest tested release

It reads the sources only (nothing is imported from the release), as the shim does at apply time for a release
it has no row for: each part that matches would be patched as the newest row says; each that differs, or runs
through one that does, would be left as FlashInfer's. Adding a row for a new release is then a reviewed change:
the rows (src/_fp4_dynamo_shim/fp4/fp4_releases.py, fp4/family.py) and this record, written again with --record.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _fp4_dynamo_shim import release_parts, tested_sources, versions  # noqa: E402
from _fp4_dynamo_shim.fp4 import fp4_parts  # noqa: E402
from _fp4_dynamo_shim.fp4 import fp4_releases  # noqa: E402

RECORD_FILE = ROOT / "src" / "_fp4_dynamo_shim" / "tested_sources.py"


def unpack_sources(wheel: Path, into: Path) -> tuple:
    """(the package folder, the release) of a wheel: its Python files only (its kernels' sources are not read)."""
    version = None
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("flashinfer/") and name.endswith(".py"):
                archive.extract(name, into)
            elif re.fullmatch(r"flashinfer_python-[^/]+\.dist-info/METADATA", name):
                version = re.search(r"^Version: (\S+)$", archive.read(name).decode(), re.M).group(1)
    return into / "flashinfer", version


def installed() -> tuple:
    import importlib.metadata

    return release_parts.package_path(), importlib.metadata.version("flashinfer-python")


def rows_with_the_same_kernel_call(package: Path) -> list:
    """The release rows whose module and JIT-entry argument order the package's sources have."""
    from _fp4_dynamo_shim.sources import Sources

    found = Sources(package)
    return [str(target.versions) for target in fp4_releases.TARGETS
            if found.tree(target.module) is not None
            and fp4_parts.kernel_arguments_difference(found, target) is None]


def judgement(package: Path, version: str) -> dict:
    record = tested_sources.RECORD
    differences, found = release_parts.compare(package, fp4_releases.target_for(record["flashinfer"]))
    follows = release_parts.follows(differences, found)
    return {
        "version": version,
        "tested": fp4_releases.target_for(version) is not None,
        "compared_with": record["flashinfer"],
        "rows_with_the_same_kernel_call": rows_with_the_same_kernel_call(package),
        "parts": {name: {"matches": not words, "difference": "; ".join(words) or None,
                         "left_because": release_parts.because(follows[name]) if name in follows else None}
                  for name, words in differences.items()},
    }


def print_text(result: dict) -> None:
    state = "tested" if result["tested"] else f"newer than tested ({versions.SUPPORTED_RANGE})"
    matching = sum(part["matches"] for part in result["parts"].values())
    print(f"flashinfer-python {result['version']}: {state}")
    print(f"  kernel call as in rows: {', '.join(result['rows_with_the_same_kernel_call']) or 'none'}")
    print(f"  {matching} of {len(result['parts'])} parts match {result['compared_with']}'s:")
    for name, part in result["parts"].items():
        if part["matches"] and not part["left_because"]:
            print(f"    match    {name}")
        elif part["matches"]:
            print(f"    left     {name}: {part['left_because']}")
        else:
            print(f"    differs  {name}: {part['difference']}")


def literal(value, indent: int = 0) -> str:
    """A Python literal with one key per line and short lists (a signature's parameter) on one line."""
    pad = " " * (indent + 4)
    if isinstance(value, dict) and value:
        items = [f"{pad}{key!r}: {literal(value[key], indent + 4)}," for key in sorted(value)]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "[\n" + "\n".join(f"{pad}{item!r}," for item in value) + "\n" + " " * indent + "]"
    return repr(value)


def record(package: Path, version: str) -> None:
    target = fp4_releases.target_for(version)
    if target is None or versions.public(version) != versions.public(versions.LAST_FLASHINFER):
        raise SystemExit(f"--record takes the newest tested release ({versions.LAST_FLASHINFER}); {version} is installed")
    data = {"flashinfer": version, "parts": release_parts.facts(package, target)}
    RECORD_FILE.write_text(
        '"""The newest tested FlashInfer release\'s sources, as ``release_parts`` compares an untested release with them.\n\n'
        "Written by ``python tools/release_parts.py --record`` with that release installed; edit it only through that.\n"
        '"""\n\n'
        f"RECORD = {literal(data)}\n"
    )
    print(f"wrote {RECORD_FILE.relative_to(ROOT)} from flashinfer-python {version}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, help="a wheel or a folder holding the flashinfer package")
    parser.add_argument("--json", action="store_true", help="print the judgement as JSON")
    parser.add_argument("--record", action="store_true", help="write the record from the installed flashinfer")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if options.path is None:
            package, version = installed()
        elif options.path.suffix == ".whl":
            package, version = unpack_sources(options.path, Path(scratch))
        else:
            package = options.path / "flashinfer" if (options.path / "flashinfer").is_dir() else options.path
            meta = re.search(r'__version__ = "([^"]+)"', (package / "_build_meta.py").read_text())
            version = meta.group(1) if meta else "unknown"
        if options.record:
            record(package, version)
            return 0
        result = judgement(package, version)
    if options.json:
        print(json.dumps(result))
    else:
        print_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
