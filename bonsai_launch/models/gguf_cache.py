"""GGUF header facts (models/gguf.GGUFInfo) cached by path, size and mtime."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# Header facts are cached by path, size and mtime: walking a 262k-token vocabulary costs
# ~0.1 s, and `bonsai start` reads the target and the drafter on every launch. Only successful
# reads are cached; any change to the file (a truncation, a new download) misses the cache.
CACHE_VERSION = 4  # 2: DrafterInfo gained the log-SNR fields; 3: the MTP fields; 4: Bonsai 2 fields


def _file(path: Path) -> Path:
    from bonsai_launch.core.paths import bonsai_home

    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return bonsai_home() / "cache" / "gguf" / f"{key}.json"


def get(path: Path, stat) -> dict[str, Any] | None:
    """The facts stored for this path, size and mtime (as put gave them), or None."""
    import json

    try:
        data = json.loads(_file(path).read_text(encoding="utf-8"))
        if data.pop("_stamp") != [CACHE_VERSION, str(path.resolve()), stat.st_size, stat.st_mtime_ns]:
            return None
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def put(path: Path, stat, data: dict[str, Any]) -> None:
    import json
    import os

    try:
        data = {**data, "_stamp": [CACHE_VERSION, str(path.resolve()), stat.st_size, stat.st_mtime_ns]}
        target = _file(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, target)
    except (OSError, TypeError, ValueError):
        pass  # a cache that cannot be written only costs time
