"""Facts read off every SGLang wheel from 0.5.3.post1 to 0.5.23, for ``tests/test_sglang_releases.py``.

    python tests/sglang_facts.py [--wheels DIR]          # rewrite tests/sglang_facts.json
    python tests/sglang_facts.py [--wheels DIR] --check  # exit 1 if the committed file differs

Downloads each release's wheel once (``pip download --no-deps``, about 600 MB for all of them, cached in
``DIR``, default ``~/.cache/fp4-dynamo-shim/sglang-wheels``) and reads, without importing SGLang, what
``fp4_dynamo_shim.sglang_source`` reads: how the NVFP4 layers bind FlashInfer, the prefill-graph default,
where a scheduler imports its FP4 modules and loads plugins, the raw FlashInfer calls of the opt-in paths,
and the pins in METADATA. The JSON is committed so that CI checks the table against it without downloading
the wheels; run this after adding a release (and add the release to ``RELEASES``).
"""

from __future__ import annotations

import argparse
import email.parser
import json
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
from fp4_dynamo_shim import sglang_source  # noqa: E402

FACTS_FILE = HERE / "sglang_facts.json"
#: Every release on PyPI in the range, in order.
RELEASES = (
    "0.5.3.post1", "0.5.3.post2", "0.5.3.post3", "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3", "0.5.5",
    "0.5.5.post1", "0.5.5.post2", "0.5.5.post3", "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8",
    "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1",
    "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)


def wheel_for(version: str, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d",
                        str(wheels)], check=True)
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    return found[0]


def read_wheel(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())

        def read(relative: str):
            name = f"sglang/srt/{relative}"
            return archive.read(name).decode("utf-8") if name in names else None

        facts = sglang_source.read_release(read)
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(archive.read(metadata).decode("utf-8"))
    facts["pins"] = sglang_source.pins(message.get_all("Requires-Dist"))
    return facts


def generate(wheels: Path) -> dict:
    wheels.mkdir(parents=True, exist_ok=True)
    return {version: read_wheel(wheel_for(version, wheels)) for version in RELEASES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "fp4-dynamo-shim" / "sglang-wheels")
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    options = parser.parse_args()
    facts = {version: dict(sorted(found.items())) for version, found in generate(options.wheels).items()}
    text = json.dumps(facts, indent=1) + "\n"
    if options.check:
        if FACTS_FILE.read_text() != text:
            print(f"{FACTS_FILE} differs from what the wheels say; rerun without --check", file=sys.stderr)
            return 1
        print(f"{FACTS_FILE}: matches the wheels of {len(RELEASES)} releases")
        return 0
    FACTS_FILE.write_text(text)
    print(f"wrote {FACTS_FILE} ({len(RELEASES)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
