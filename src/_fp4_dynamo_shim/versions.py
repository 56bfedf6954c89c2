"""The one version-to-row lookup, and the one spelling of the FlashInfer releases the shim was tested on.

Every release table (FlashInfer's ``fp4_quantize`` rows, its FP4 family members, SGLang's releases) is a tuple of
rows with a ``versions`` :class:`~packaging.specifiers.SpecifierSet`; a local build ("0.6.3+cu128") is looked up
as the release it was cut from, and pre-releases inside a row belong to it.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

Row = TypeVar("Row")

#: The first and last FlashInfer releases the shim was tested on (the ones SGLang 0.5.6-0.5.23 pin); post
#: releases of the last one are in. ``pyproject.toml`` requires the first and names no last: a newer release
#: is judged part by part against the last one (``release_parts``), and installing the shim never changes it.
FIRST_FLASHINFER, LAST_FLASHINFER = "0.5.3", "0.7.4"
_last = Version(LAST_FLASHINFER)
SUPPORTED_FLASHINFER = SpecifierSet(f">={FIRST_FLASHINFER},<{_last.major}.{_last.minor}.{_last.micro + 1}")
#: How status() and verify name the tested range.
SUPPORTED_RANGE = f"flashinfer-python >={FIRST_FLASHINFER}, <={LAST_FLASHINFER}"


def below_first(version: Optional[str]) -> bool:
    """Older than the first tested release, or not a version at all: nothing is known of it."""
    release = public(version)
    return release is None or release < Version(FIRST_FLASHINFER)


def public(version: Optional[str]) -> Optional[Version]:
    """The release a version string names (its local part dropped), or None when it is not a version."""
    try:
        return Version(Version(version).public) if version is not None else None
    except InvalidVersion:
        return None


def rows_for(version: Optional[str], rows: Iterable[Row]) -> List[Row]:
    """Every row whose ``versions`` hold ``version``."""
    release = public(version)
    if release is None:
        return []
    return [row for row in rows if row.versions.contains(release, prereleases=True)]


def row_for(version: Optional[str], rows: Iterable[Row]) -> Optional[Row]:
    """The first row whose ``versions`` hold ``version``; None for no row or no version."""
    found = rows_for(version, rows)
    return found[0] if found else None
