"""A build's self-test verdict, kept beside its manifest (`<key>/selftest.json`), and what it
means for a launch. Pure reading and judging here; the checks run in server/selftest.py.

The record belongs to the binaries it tested: it names llama-server's size and mtime, and a
record that no longer matches them (a rebuild) is treated as missing, so the next `bonsai
build` or `bonsai doctor --self-test` runs the checks again. Kept apart from manifest.json on
purpose: the manifest is the build's commit point (install.py), and a self-test that changes
must not make the build look different or cost a rebuild.

What a failed check changes (issue 38):
- `hybrid_two_slots`: hybrid targets on 2+ slots get `--no-repack` (the AMX batched-matmul
  workaround, shared/reference/hybrid-targets.md), said in one line;
- `kernels`: the weight types whose check failed are refused on this build, with the log;
- `gpu_offload`: `auto` falls back to the CPU build; an explicit `--backend` stops with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORD = "selftest.json"
SCHEMA = 2  # 2: a GPU build with no device visible skips its GPU check (1 failed it): rerun
HYBRID = "hybrid_two_slots"
KERNELS = "kernels"
GPU = "gpu_offload"


def record_path(key_dir: Path) -> Path:
    return key_dir / RECORD


def key_dir_of(server: Path) -> Path:
    return server.resolve().parent.parent  # <key>/bin/llama-server


def binary_stamp(server: Path) -> dict[str, int]:
    st = server.resolve().stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def read_record(key_dir: Path) -> dict[str, Any] | None:
    """The record, or None when there is none, it is unreadable, or its binary changed since."""
    try:
        data = json.loads(record_path(key_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    server = key_dir / "bin" / Path(str(data.get("binary", "llama-server"))).name
    try:
        if data.get("binary_stamp") != binary_stamp(server):
            return None
    except OSError:
        return None
    return data


def for_server(server: Path | None) -> dict[str, Any] | None:
    """The record of the build `server` belongs to (None for a binary bonsai did not build)."""
    if server is None:
        return None
    try:
        return read_record(key_dir_of(server))
    except OSError:
        return None


def write_record(key_dir: Path, data: dict[str, Any]) -> Path:
    path = record_path(key_dir)
    tmp = key_dir / f".{RECORD}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({**data, "schema": SCHEMA}, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def check(record: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    if not record:
        return None
    return next((c for c in record.get("checks", []) if c.get("name") == name), None)


def failed(record: Mapping[str, Any] | None, name: str) -> str | None:
    """What the check `name` found when it failed (its detail), else None (passed, skipped, not run)."""
    c = check(record, name)
    if c is None or c.get("status") != "failed":
        return None
    return str(c.get("detail") or "failed")


def refused_types(record: Mapping[str, Any] | None) -> dict[str, str]:
    """Weight type -> why this build is refused for it (the kernel check failed for that type)."""
    c = check(record, KERNELS)
    if c is None or c.get("status") != "failed":
        return {}
    log = record.get("log", "") if record else ""
    return {
        t: f"the build's kernel self-test failed for {t} (log: {log})" for t, ok in c.get("types", {}).items() if not ok
    }


def hybrid_workaround(record: Mapping[str, Any] | None) -> str | None:
    """The one line `start` says when it adds --no-repack for a hybrid target on 2+ slots."""
    why = failed(record, HYBRID)
    if why is None:
        return None
    return f"this build's self-test found 2 slots on a hybrid target answering wrong ({why}): adding --no-repack"
