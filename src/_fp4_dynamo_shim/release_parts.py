"""A FlashInfer release the shim has no row for, judged by what its sources hold rather than by its number.

Every part the shim patches (the FP4 JIT getter, ``fp4_quantize``, each FP4 family member, the CUDA version
lookups) is compared with the newest tested release's record (``tested_sources.RECORD``). A part whose
facts match is patched as that release's row says; one that differs is left as FlashInfer's, with the
difference in words. A part also stays FlashInfer's when a part it runs through differs: every FP4 kernel
comes through the JIT getter, and two family members call ``fp4_quantize``. FlashInfer's declared ops need no
comparison: the declared layer reads them from the installed sources, and its GPU record is per release.

``tools/release_parts.py`` prints the same judgement for a wheel or an installed package, and writes the record.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Dict, List, Optional

from . import cuda_version, sources, tested_sources, versions
from .fp4 import family
from .fp4 import fp4_parts
from .fp4 import fp4_releases


@dataclasses.dataclass
class Judgement:
    """What the lifecycle applies for the installed release, and what status() says of it."""

    version: str
    #: A row of the release tables covers this release.
    tested: bool
    #: The release whose rows are used: the installed one when tested, else the newest tested one.
    row: str
    #: Part name -> how it differs from ``row``'s record (empty: it matches); empty for a tested release.
    differences: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    #: Part name -> the differing part it runs through (it stays FlashInfer's although it matches).
    follows: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def left(self) -> Dict[str, str]:
        """Part name -> why it is left as FlashInfer's."""
        left = {name: "; ".join(words) for name, words in self.differences.items() if words}
        return {**left, **{name: because(cause) for name, cause in self.follows.items()}}

    def describe(self) -> dict:
        parts = None
        if not self.tested:
            parts = {name: {"matches": not words, "difference": "; ".join(words) or None,
                            "applied": name not in self.left,
                            "left_because": because(self.follows[name]) if name in self.follows else None}
                     for name, words in self.differences.items()}
        return {"version": self.version, "tested": self.tested, "matched_row": self.row, "parts": parts}

    def line(self) -> Optional[str]:
        return summary(self.describe())


def summary(described: dict) -> Optional[str]:
    """The line verify prints for an untested release (None for a tested one), from status()["flashinfer"]."""
    parts = described["parts"]
    if described["tested"] or parts is None:
        return None
    matching = sum(part["matches"] for part in parts.values())
    line = (f"FlashInfer {described['version']} is newer than the tested range ({versions.SUPPORTED_RANGE}); "
            f"{matching} of {len(parts)} parts match {described['matched_row']}'s")
    differing = [f"`{name}` differs ({part['difference']})" for name, part in parts.items() if not part["matches"]]
    following = [f"`{name}` ({part['left_because']})" for name, part in parts.items() if part["left_because"]]
    if differing:
        line += "; " + "; ".join(differing + following) + "; left as FlashInfer's"
    return line


def because(cause: str) -> str:
    return f"it runs through {cause}, which differs"


def all_parts(target: fp4_releases.Target) -> List[sources.Part]:
    """The parts of the release ``target`` is the row for, in the order the layers apply them."""
    members = family.members_for(tested_sources.RECORD["flashinfer"])
    return [cuda_version.PART, *fp4_parts.parts(target, members)]


def facts(package, target: fp4_releases.Target) -> dict:
    """The record of a package's sources (what ``tools/release_parts.py --record`` writes); ``package`` is its
    folder or its parsed ``sources.Sources``."""
    found = package if isinstance(package, sources.Sources) else sources.Sources(package)
    parts = all_parts(target)
    others = frozenset(part.function for part in parts if part.function)
    return {part.name: sources.facts(found, part, others) for part in parts}


def compare(package: Path, target: fp4_releases.Target, record: dict = None) -> tuple:
    """(part name -> how ``package``'s sources differ from ``record``, the newest tested release's by default;
    the package's facts)."""
    record = record or tested_sources.RECORD
    parsed = sources.Sources(package)  # each file parsed once, for the facts and the kernel call
    found, parts = facts(parsed, target), all_parts(target)
    differences = {}
    for part in parts:
        recorded = record["parts"].get(part.name)
        if recorded is None:
            differences[part.name] = [f"{record['flashinfer']} has no record of it"]
            continue
        differences[part.name] = sources.differences(part, recorded, found[part.name], record["flashinfer"])
    kernel = fp4_parts.kernel_arguments_difference(parsed, target)
    if kernel:  # said instead of the digest, which differs with it
        differences[fp4_parts.JIT_GETTER] = [word for word in differences[fp4_parts.JIT_GETTER]
                                             if not word.startswith("its source differs")] + [kernel]
    return differences, found


def follows(differences: Dict[str, List[str]], found: dict) -> Dict[str, str]:
    """Part name -> the differing part it runs through, for the parts that match: every FP4 kernel comes
    through the JIT getter, the shim runs some family members through its ``fp4_quantize``, and FlashInfer's
    own functions call others (``reaches`` in their facts)."""
    differing = [name for name, words in differences.items() if words]
    through_fp4_quantize = {member.name for member in family.MEMBERS if member.through_fp4_quantize}
    through = {}
    for name in differences:
        causes = [cause for cause in differing if cause != name and (
            (cause == fp4_parts.JIT_GETTER and name != cuda_version.PART.name)
            or (cause == "fp4_quantize" and name in through_fp4_quantize)
            or cause in ((found.get(name) or {}).get("function") or {}).get("reaches", []))]
        if causes and not differences[name]:
            through[name] = causes[0]
    return through


def package_path() -> Optional[Path]:
    """The installed ``flashinfer`` package's folder, found without importing it."""
    spec = importlib.util.find_spec("flashinfer")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def is_tested(version: str) -> bool:
    """Whether the release has rows of its own, rather than being judged part by part."""
    return fp4_releases.target_for(version) is not None


def unjudged(version: Optional[str]) -> dict:
    """``status()["flashinfer"]`` where the shim is not applied: the parts are compared only when it applies."""
    tested = None if version is None else is_tested(version)
    return {"version": version, "tested": tested, "matched_row": version if tested else None, "parts": None}


def judge(version: str) -> Optional[Judgement]:
    """The judgement for an installed release; None below the first tested release (nothing is known of it)."""
    if is_tested(version):
        return Judgement(version, True, version)
    if versions.below_first(version):
        return None
    row = tested_sources.RECORD["flashinfer"]
    package = package_path()
    if package is None:
        return None
    differences, found = compare(package, fp4_releases.target_for(row))
    return Judgement(version, False, row, differences, follows(differences, found))
