"""The attention table: per FlashInfer release, the parameters of the JIT module runs that each attention entry
point reaches, read from the release's own sources by ``tools/attention_table.py`` (its docstring says what each
field is). The data is ``attention_table.json`` beside this file, generated: do not edit it.

ROWS: row key -> a JIT module run that entry points reach; RELEASES: release -> the keys of its rows."""

from __future__ import annotations

import json
from pathlib import Path

FILE = Path(__file__).with_name("attention_table.json")
_DATA = json.loads(FILE.read_text(encoding="utf-8"))
ROWS = {key: dict(row, entry_points=tuple(row["entry_points"])) for key, row in _DATA["rows"].items()}
RELEASES = {version: tuple(keys) for version, keys in _DATA["releases"].items()}
