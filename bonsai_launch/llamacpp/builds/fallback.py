"""A GPU build that fails never strands a user: which backend was asked for, and what failed.

`auto` (no --backend, no BONSAI_BACKEND) may fall back: when the GPU backend it chose cannot be
built (its preflight refuses, cmake or the compiler fails), bonsai says what failed and where the
log is, and goes on with the CPU build. A backend the user named is obeyed: its failure stops.

A configure or compile failure takes minutes, so it is remembered (BONSAI_HOME/builds/
failed-<backend>.json) and `auto` skips that backend until something that could fix it changes:
the pin, the patch series, or the backend's toolchain (its main tool's path and mtime). An
explicit `bonsai build --backend X` always tries again, and a success forgets the failure.
Preflight refusals are not remembered: they are checked again in seconds every time.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bonsai_launch.core.paths import builds_dir

ENV = "BONSAI_BACKEND"


def requested_backend(flag: str | None) -> tuple[str, bool]:
    """(backend, explicit): the flag when given, else BONSAI_BACKEND, else auto. `auto` is never
    explicit. A bad BONSAI_BACKEND is one line naming it and the allowed values."""
    if flag is not None:
        value = flag.strip().lower() or "auto"
    else:
        from bonsai_launch.config.settings import BY_ENV, parse_value

        raw = os.environ.get(ENV, "").strip()
        value = parse_value(BY_ENV[ENV], raw, ENV) if raw else "auto"
    return value, value != "auto"


def _tool_stamp(backend: str, tools) -> dict[str, Any]:
    """The toolchain part of a failure's fingerprint: the backend's main tool, where it is and
    when it last changed (an upgraded toolkit gets another try)."""
    path = {"cuda": tools.nvcc.path, "vulkan": tools.glslc.path, "hip": tools.hipconfig.path}.get(backend)
    if backend == "cuda" and path is None:
        from bonsai_launch.llamacpp.builds import cuda_toolkit

        nvcc = cuda_toolkit.wheel_toolkit(cuda_toolkit.wheel_roots()).nvcc
        path = str(nvcc) if nvcc else None
    try:
        mtime = Path(path).stat().st_mtime_ns if path else None
    except OSError:
        mtime = None
    return {"tool": path, "mtime_ns": mtime}


def fingerprint(backend: str, tools) -> str:
    """What a remembered failure holds for: the pin, the patch series and the toolchain."""
    from bonsai_launch.llamacpp.builds.patches import load_series, series_hash
    from bonsai_launch.llamacpp.builds.pin import load_pin

    try:
        pin, patches = load_pin().default.sha256, series_hash(load_series())
    except Exception:  # an unreadable pin: the failure cannot be matched, so it is not skipped
        pin, patches = None, None
    material = {"backend": backend, "pin": pin, "patches": patches, **_tool_stamp(backend, tools)}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def _marker(backend: str) -> Path:
    return builds_dir() / f"failed-{backend}.json"


def record_failure(backend: str, tools, message: str, log: Path | None) -> None:
    data = {
        "backend": backend,
        "fingerprint": fingerprint(backend, tools),
        "error": message,
        "log": str(log) if log else None,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    try:
        _marker(backend).parent.mkdir(parents=True, exist_ok=True)
        _marker(backend).write_text(json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only home only costs another try next time


def recorded_failure(backend: str, tools) -> dict[str, Any] | None:
    """The remembered failure of `backend` while it still holds (same pin, patches, toolchain)."""
    try:
        data = json.loads(_marker(backend).read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("fingerprint") == fingerprint(backend, tools) else None


def clear_failure(backend: str) -> None:
    _marker(backend).unlink(missing_ok=True)


def launch_backend(choose_auto: Callable[[Any], str]) -> str:
    """The backend a launch uses: BONSAI_BACKEND when set; else `choose_auto(tools)` (what auto
    would build here, without running anything heavy), or the CPU when that backend's build
    failed and nothing has changed since."""
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.llamacpp.builds import toolchain

    requested, explicit = requested_backend(None)
    if explicit:
        return requested
    tools = toolchain.detect(versions=False)
    try:
        chosen = choose_auto(tools)
    except BonsaiError:
        return "cpu"
    if chosen != "cpu" and recorded_failure(chosen, tools) is not None:
        return "cpu"
    return chosen


def fallback_note(backend: str, message: str, log: Path | None) -> str:
    """The one line `auto` prints when it goes on with the CPU build."""
    where = f"; log: {log}" if log else ""
    return (
        f"the {backend} build failed ({message}){where}; using the CPU build instead "
        f"(--backend {backend} or BONSAI_BACKEND={backend} insists on {backend})"
    )
