"""GGUF header facts (models/gguf.GGUFInfo) cached by path, size and mtime."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# Header facts are cached by path, size and mtime: walking a 262k-token vocabulary costs
# ~0.1 s, and `bonsai start` reads the target and the drafter on every launch. Only successful
# reads are cached; any change to the file (a truncation, a new download) misses the cache.
CACHE_VERSION = (
    7  # 2: DrafterInfo gained the log-SNR fields; 3: the MTP fields; 4: Bonsai 2 fields; 5: core/json_cache's layout;
    # 6: tensor bytes per type and the hybrid's attention interval (the weight path and the KV size);
    # 7: DrafterInfo.borrows_head (patch 0016 cuts a borrowed head)
)


def _file(path: Path) -> Path:
    from bonsai_launch.core.paths import bonsai_home

    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return bonsai_home() / "cache" / "gguf" / f"{key}.json"


def _key(path: Path, stat) -> list[Any]:
    return [CACHE_VERSION, str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def get(path: Path, stat) -> dict[str, Any] | None:
    """The facts stored for this path, size and mtime (as put gave them), or None."""
    from bonsai_launch.core import json_cache

    data = json_cache.read(_file(path), _key(path, stat))
    return data if isinstance(data, dict) else None


def put(path: Path, stat, data: dict[str, Any]) -> None:
    from bonsai_launch.core import json_cache

    json_cache.write(_file(path), _key(path, stat), data)
