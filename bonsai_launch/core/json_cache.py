"""A value kept in one JSON file under a key (stamps of what it was derived from): read back only
while the key matches, written through a temporary file and a rename. A cache that cannot be
read or written only costs time, never an error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read(path: Path, key: Any) -> Any | None:
    """The value kept under `key` (compared as JSON gives it back: lists, not tuples), or None."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    return kept.get("value")


def write(path: Path, key: Any, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "value": value}), encoding="utf-8")
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        tmp.unlink(missing_ok=True)  # a read-only home, a full disk: the next run derives it again
