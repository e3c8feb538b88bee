"""The lock: what each profile's files resolved to, so that later starts need no hub.

`bonsai pull` lists the repository, resolves every wanted entry (resolve.py), verifies the
files, and records here per profile and entry: the repository, the revision asked for, the
commit it was at, and the file's name, size and sha256. `bonsai start` reads the lock and never
lists the repository again: a present, verified file runs offline; a missing one is fetched by
its recorded name at its recorded commit and checked against its recorded sha256 and size.

One JSON file, BONSAI_HOME/models.lock.json, for a person to read and to copy: on another
machine it makes `bonsai start` fetch the same bytes. A pull rewrites the entries it resolved
(and says when a pattern now picks another file); `bonsai rm` keeps them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.paths import bonsai_home
from bonsai_launch.models.hub import RemoteFile, RemoteListing

LOCK_NAME = "models.lock.json"
VERSION = 1


@dataclass(frozen=True)
class LockedFile:
    """One resolved entry: which file, which bytes, from which commit."""

    role: str
    builds: str
    wanted: str  # the profile's name or patterns when it was resolved
    name: str
    size: int
    sha256: str
    revision: str  # what was asked for: main, or --revision
    commit: str  # the commit the repository was at
    resolved_at: str


def lock_path() -> Path:
    return bonsai_home() / LOCK_NAME


def read_lock() -> dict[str, Any]:
    """The whole lock; an unreadable one counts as empty (a pull writes it anew)."""
    try:
        data = json.loads(lock_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"version": VERSION, "profiles": {}}
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), dict):
        return {"version": VERSION, "profiles": {}}
    return data


def locked_files(profile: Profile, data: dict[str, Any] | None = None) -> dict[str, LockedFile]:
    """The profile's recorded entries by entry key; none when the lock is for another repo."""
    entry = (read_lock() if data is None else data)["profiles"].get(profile.name)
    if not isinstance(entry, dict) or entry.get("repo") != profile.repo:
        return {}
    out = {}
    for key, raw in (entry.get("files") or {}).items():
        try:
            out[key] = LockedFile(**raw)
        except TypeError:  # written by another version: resolved again by the next pull
            continue
    return out


def applied(entry: ModelFile, locked: dict[str, LockedFile]) -> ModelFile:
    """A pattern entry with the name the lock recorded (unchanged when there is none)."""
    record = locked.get(entry.key)
    if entry.patterns and record is not None:
        return replace(entry, name=record.name)
    return entry


def apply(profile: Profile, data: dict[str, Any] | None = None) -> Profile:
    """The profile with its resolved names filled in from the lock (what starts run)."""
    if not profile.repo or not any(f.patterns for f in profile.files):
        return profile
    locked = locked_files(profile, data)
    return replace(profile, files=tuple(applied(f, locked) for f in profile.files))


def listing(profile: Profile, records: list[LockedFile]) -> RemoteListing:
    """A listing made of the lock's records (no request): each file at its own commit."""
    assert profile.repo
    files = {r.name: RemoteFile(r.name, r.size, r.sha256, r.commit) for r in records}
    latest = records[-1]
    return RemoteListing(profile.repo, latest.revision, latest.commit, files, from_lock=True)


def record(profile: Profile, listing: RemoteListing, items: list[tuple[ModelFile, RemoteFile, str]]) -> None:
    """Write (entry, remote file, verified sha256) for the profile, keeping its other entries."""
    from filelock import FileLock

    path = lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with FileLock(str(path) + ".writing"):
        data = read_lock()
        old = data["profiles"].get(profile.name)
        files = dict(old.get("files") or {}) if isinstance(old, dict) and old.get("repo") == profile.repo else {}
        for entry, remote, sha in items:
            files[entry.key] = asdict(
                LockedFile(
                    entry.role,
                    entry.layout,
                    entry.wanted,
                    remote.name,
                    remote.size,
                    sha,
                    listing.revision,
                    remote.commit or listing.commit,
                    now,
                )
            )
        data["version"] = VERSION
        data["profiles"][profile.name] = {"repo": profile.repo, "files": dict(sorted(files.items()))}
        data["profiles"] = dict(sorted(data["profiles"].items()))
        tmp = path.with_name(f".{LOCK_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
