"""Installing built binaries atomically, with a manifest that says what they are.

Layout under BONSAI_HOME/builds/<key>/: `work/` (the cmake build folder), `bin/` (the
installed binaries), `manifest.json` and `build.log`. The manifest is the commit point: it
is removed before the binaries are swapped and written (temp name, rename) after, so a
`bin/` without a manifest is never used, and a manifest always describes the `bin/` beside it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed

MANIFEST = "manifest.json"
SCHEMA = 1


def manifest_path(key_dir: Path) -> Path:
    return key_dir / MANIFEST


def read_manifest(key_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(manifest_path(key_dir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def write_manifest(key_dir: Path, data: dict[str, Any]) -> None:
    tmp = key_dir / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, manifest_path(key_dir))


def install_binaries(work_bin: Path, key_dir: Path, targets: tuple[str, ...]) -> dict[str, Path]:
    """Copy the targets from the build folder into key_dir/bin in one rename."""
    missing = [t for t in targets if not (work_bin / t).is_file()]
    if missing:
        raise ActionFailed(
            f"the build finished but {', '.join(missing)} is missing from {work_bin}",
            "the source may not define these targets; see the build log",
        )
    manifest_path(key_dir).unlink(missing_ok=True)  # from here on, the old install is not valid
    new = key_dir / f".bin.new-{os.getpid()}"
    old = key_dir / f".bin.old-{os.getpid()}"
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    try:
        for t in targets:
            shutil.copy2(work_bin / t, new / t)
        final = key_dir / "bin"
        try:
            if final.exists():
                os.replace(final, old)
            os.replace(new, final)
        except PermissionError as exc:
            # Windows: a folder whose llama-server.exe is running cannot be renamed.
            raise ActionFailed(
                f"cannot replace {final} ({exc.strerror or exc}): a llama-server from it is probably running",
                "stop it (`bonsai ps`, `bonsai stop`) and build again",
            ) from None
    finally:
        shutil.rmtree(new, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return {t: key_dir / "bin" / t for t in targets}


def installed_builds(builds: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every complete install under builds/, newest first."""
    found: list[tuple[Path, dict[str, Any]]] = []
    if not builds.is_dir():
        return found
    for key_dir in builds.iterdir():
        data = read_manifest(key_dir) if key_dir.is_dir() else None
        if data is None:
            continue
        server = Path(data.get("binaries", {}).get("llama-server", ""))
        if server.is_file():
            found.append((key_dir, data))
    found.sort(key=lambda item: item[1].get("built_at", ""), reverse=True)
    return found
