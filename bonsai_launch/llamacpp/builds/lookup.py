"""Which installed llama-server a launch uses: the backend `auto` means here, and the best build
of it (the pin with the current patches first). Apart from builder.py so that `bonsai start` with
a build in place never imports the build machinery (source, preflight, CMake, the chat page)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import builds_dir
from bonsai_launch.llamacpp.builds import fallback, toolchain
from bonsai_launch.llamacpp.builds.backend import choose_backend
from bonsai_launch.llamacpp.builds.install import installed_builds
from bonsai_launch.llamacpp.builds.patches import load_series, series_hash
from bonsai_launch.llamacpp.builds.pin import load_pin


def hardware_for(requested: str, tools: toolchain.Toolchain):
    """The machine as the backend choice needs it. Probing GPUs (NVML) only matters when
    nvcc could use them; skipping it otherwise keeps the up-to-date path fast."""
    from bonsai_launch.core import hardware

    if tools.nvcc.found and requested in ("auto", "cuda"):
        return hardware.detect()
    import platform

    return hardware.Hardware(platform.system(), platform.machine().lower(), os.cpu_count() or 1, os.cpu_count() or 1, 0)


def detected_backend() -> str:
    """The backend a launch uses without --backend (fallback.launch_backend): BONSAI_BACKEND, else
    what `auto` would build here, unless that backend's build failed and nothing changed since."""
    return fallback.launch_backend(lambda tools: choose_backend("auto", hardware_for("auto", tools), tools).backend)


def fork_sources() -> list:
    """The pin's named sources that are PrismML's fork (GitPin), pinned by tag and commit."""
    return [a for a in load_pin().alternatives.values() if a.flavour == "fork"]


def builds_of(backend: str, flavour: str) -> list[dict[str, Any]]:
    """Installed builds for a backend whose llama.cpp is of `flavour` (mainline or fork), newest first."""
    from bonsai_launch.llamacpp.flavours import kind_of_manifest

    return [
        m
        for _d, m in installed_builds(builds_dir())
        if m.get("backend") == backend and kind_of_manifest(m).flavour == flavour
    ]


def find_installed(backend: str = "auto", flavour: str = "mainline", min_release: int | None = None) -> Path | None:
    """The installed llama-server for `backend` (auto: the detected one) and llama.cpp flavour, or None.

    Mainline: prefers a build of the current pin with the current patch series, then any build
    of the pin, then the newest build of that backend. Fork: the pinned fork release first, then
    the newest; builds of a known release older than `min_release` (what the profile's files
    need) are left out, so a profile that needs a newer fork gets the pin built.
    """
    backend = detected_backend() if backend == "auto" else backend
    candidates = builds_of(backend, flavour)
    if flavour == "fork" and min_release is not None:
        candidates = [m for m in candidates if (m.get("source", {}).get("release") or min_release) >= min_release]
    if not candidates:
        return None
    try:
        pin = load_pin()
        pinned, patches_id = pin.default.sha256, series_hash(load_series())
        fork_commits = {a.commit for a in pin.alternatives.values() if a.flavour == "fork" and a.commit}
    except BonsaiError:
        pinned, patches_id, fork_commits = None, None, set()

    def rank(m: dict[str, Any]) -> int:
        identity = m.get("source", {}).get("identity") or ""
        if flavour == "fork":  # the pin may know only a short commit id: a prefix of the build's
            return 1 if any(identity.startswith(c) for c in fork_commits) else 0
        of_pin = identity == pinned
        return 2 if of_pin and m.get("patches_hash") == patches_id else 1 if of_pin else 0

    best = max(candidates, key=rank)  # max keeps the first (newest) of equal rank
    return Path(best["binaries"]["llama-server"])
