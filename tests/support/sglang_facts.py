"""Facts read off every SGLang wheel from 0.5.3.post1 to 0.5.23, for ``tests/sglang/test_sglang_release_table_matches_wheels.py``;
and verbatim copies of the few SGLang files ``tests/sglang/test_sglang_wrapper.py`` runs (``tests/data/sglang_sources``).

    python tests/support/sglang_facts.py [--wheels DIR]          # rewrite tests/data/sglang_facts.json
    python tests/support/sglang_facts.py [--wheels DIR] --check  # exit 1 if the committed file differs

Downloads each release's wheel once (``pip download --no-deps``, about 360 MB for all 36, cached in
``DIR``, default ``~/.cache/fp4-dynamo-shim/sglang-wheels``) and reads, without importing SGLang, what
``_fp4_dynamo_shim.sglang.source`` reads: how the NVFP4 layers bind FlashInfer, the prefill-graph default,
where a scheduler imports its FP4 modules and loads plugins, the raw FlashInfer calls of the opt-in paths,
and the pins in METADATA. The JSON is committed so that CI checks the table against it without downloading
the wheels; run this after adding a release (and add the release to ``RELEASES``).

It also records, in ``tests/data/sglang_reads.json.xz`` (340 KB: 174 distinct files, each stored once), every
file ``sglang_source.read_release`` asks each wheel for and the wheel's ``Requires-Dist`` lines, so that
``tests/sglang/test_sglang_source_read_for_every_release.py`` runs the source readers over all 36 releases without the wheels and
holds what they read against ``sglang_facts.json``.

For ``SOURCE_RELEASES`` and ``MLP_RELEASES`` it also copies, byte for byte, SGLang's ``fp4_utils.py`` (the FP4 wrapper op),
``utils/custom_op.py`` and ``kernel_api_logging.py`` (how that op is registered and bound), the wheel's
LICENSE, and an excerpt of ``utils/common.py`` (``sglang_lib`` and ``direct_register_custom_op``, the lines
named in the excerpt's first line): SGLang's ``common.py`` imports triton, torchvision and more, which a CPU
test environment does not have, so the test loads these files instead of the package. For ``MLP_RELEASES``
also the Qwen3.5 NVFP4 dense MLP's fused path (``tests/sglang/test_sglang_qwen3_5.py``), excerpted the same way.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import lzma
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
from _fp4_dynamo_shim.sglang import source  # noqa: E402

FACTS_FILE = HERE.parent / "data" / "sglang_facts.json"
READS_FILE = HERE.parent / "data" / "sglang_reads.json.xz"
SOURCES = HERE.parent / "data" / "sglang_sources"
#: Releases whose FP4 wrapper the CPU tests run: 0.5.14 (the GPU machine's torch, tc_piecewise by default)
#: and 0.5.21 (the last with tc_piecewise; fp4_utils reads the platform from runtime_context).
SOURCE_RELEASES = ("0.5.14", "0.5.21")
VERBATIM = ("sglang/srt/layers/quantization/fp4_utils.py", "sglang/srt/utils/custom_op.py")
EXCERPT = "sglang/srt/utils/common_excerpt.py"
#: Releases whose Qwen3.5 NVFP4 dense MLP calls FlashInfer raw and still has tc_piecewise (opt-in).
MLP_RELEASES = ("0.5.19", "0.5.20", "0.5.21")
MLP_EXCERPT = "sglang/srt/models/qwen3_5_mlp_excerpt.py"
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


def read_wheel(path: Path, files: dict = None) -> tuple:
    """(facts, what was read: {"paths": {path: content key or None}, "requires": Requires-Dist lines}); each
    file's text is added to ``files`` under its content key."""
    read_paths = {}
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())

        def read(relative: str):
            name = f"sglang/srt/{relative}"
            text = archive.read(name).decode("utf-8") if name in names else None
            key = None if text is None else hashlib.sha256(text.encode()).hexdigest()[:16]
            read_paths[relative] = key
            if files is not None and key is not None:
                files[key] = text
            return text

        facts = source.read_release(read)
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(archive.read(metadata).decode("utf-8"))
    requires = message.get_all("Requires-Dist") or []
    facts["pins"] = source.pins(requires)
    return facts, {"paths": dict(sorted(read_paths.items())), "requires": requires}


def load_reads() -> dict:
    """The committed record of what the readers read: {"files": {key: text}, "releases": {version: ...}}."""
    return json.loads(lzma.decompress(READS_FILE.read_bytes()))


def recorded_reader(reads: dict, version: str):
    """A ``sglang_source.Reader`` over one release's recorded files; a path the record lacks raises KeyError
    (the readers now ask for a file they did not when the record was written: regenerate it)."""
    paths = reads["releases"][version]["paths"]

    def read(relative: str):
        key = paths[relative]
        return None if key is None else reads["files"][key]

    return read


def _excerpt(common: str) -> str:
    """``sglang_lib = Library("sglang", "FRAGMENT")`` and ``def direct_register_custom_op``, verbatim."""
    import ast

    tree = ast.parse(common)
    lines = common.splitlines(keepends=True)
    spans = [(node.lineno, node.end_lineno) for node in tree.body
             if (isinstance(node, ast.FunctionDef) and node.name == "direct_register_custom_op")
             or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "sglang_lib" for t in node.targets))]
    header = "# sglang/srt/utils/common.py, lines " + ", ".join(f"{a}-{b}" for a, b in spans) + " (verbatim)\n"
    return header + "".join("".join(lines[a - 1:b]) + "\n" for a, b in spans)


def _mlp_excerpt(qwen2_moe: str, qwen3_5: str) -> str:
    """Qwen2MoeMLP's ``_silu_fp4_quant_fused`` and ``forward`` (dedented out of the class) and qwen3_5.py's
    ``_maybe_enable_silu_fp4_quant_fusion``, verbatim otherwise."""
    import ast
    import textwrap

    parts, header = [], []
    for name, text, wanted in (("models/qwen2_moe.py", qwen2_moe, ("_silu_fp4_quant_fused", "forward")),
                               ("models/qwen3_5.py", qwen3_5, ("_maybe_enable_silu_fp4_quant_fusion",))):
        tree, lines = ast.parse(text), text.splitlines(keepends=True)
        body = tree.body
        if name.endswith("qwen2_moe.py"):
            (mlp,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2MoeMLP"]
            body = mlp.body
        for node in body:
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                parts.append(textwrap.dedent("".join(lines[start - 1:node.end_lineno])))
                header.append(f"{name}:{start}-{node.end_lineno} ({node.name})")
    return ("# sglang/srt/" + ", ".join(header) + "; verbatim, methods dedented out of Qwen2MoeMLP\n\n"
            + "\n\n".join(parts))


def sources(version: str, wheel: Path) -> dict:
    """{path under tests/data/sglang_sources/<version>: text} for one release."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())

        def text(name):
            return archive.read(name).decode("utf-8")

        found = {}
        if version in SOURCE_RELEASES:
            found = {name: text(name) for name in VERBATIM}
            logging_module = next(line.split()[1] for line in found["sglang/srt/utils/custom_op.py"].splitlines()
                                  if line.startswith("from sglang") and "kernel_api_logging" in line)
            logging_path = logging_module.replace(".", "/") + ".py"
            found[logging_path] = text(logging_path)
            found[EXCERPT] = _excerpt(text("sglang/srt/utils/common.py"))
        if version in MLP_RELEASES:
            found[MLP_EXCERPT] = _mlp_excerpt(text("sglang/srt/models/qwen2_moe.py"), text("sglang/srt/models/qwen3_5.py"))
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        found["LICENSE"] = text(license_name)
    return found


def all_sources(wheels: Path) -> dict:
    return {f"{version}/{path}": text for version in sorted(set(SOURCE_RELEASES) | set(MLP_RELEASES))
            for path, text in sources(version, wheel_for(version, wheels)).items()}


def generate(wheels: Path) -> tuple:
    """(facts per release, the record of what was read)."""
    wheels.mkdir(parents=True, exist_ok=True)
    files, facts, releases = {}, {}, {}
    for version in RELEASES:
        facts[version], releases[version] = read_wheel(wheel_for(version, wheels), files)
    return facts, {"files": dict(sorted(files.items())), "releases": releases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "fp4-dynamo-shim" / "sglang-wheels")
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    options = parser.parse_args()
    found, reads = generate(options.wheels)
    facts = {version: dict(sorted(values.items())) for version, values in found.items()}
    text = json.dumps(facts, indent=1) + "\n"
    copies = all_sources(options.wheels)
    if options.check:
        stale = [str(FACTS_FILE)] if FACTS_FILE.read_text() != text else []
        stale += [str(READS_FILE)] if not READS_FILE.exists() or load_reads() != reads else []
        stale += [path for path, content in copies.items()
                  if not (SOURCES / path).exists() or (SOURCES / path).read_text() != content]
        if stale:
            print(f"differs from what the wheels say (rerun without --check): {', '.join(stale)}", file=sys.stderr)
            return 1
        print(f"{FACTS_FILE}, {READS_FILE} and {SOURCES}: match the wheels of {len(RELEASES)} releases")
        return 0
    FACTS_FILE.write_text(text)
    READS_FILE.write_bytes(lzma.compress(json.dumps(reads, sort_keys=True).encode(), preset=9))
    for path, content in copies.items():
        (SOURCES / path).parent.mkdir(parents=True, exist_ok=True)
        (SOURCES / path).write_text(content)
    print(f"wrote {FACTS_FILE} ({len(RELEASES)} releases), {READS_FILE} and {len(copies)} files under {SOURCES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
