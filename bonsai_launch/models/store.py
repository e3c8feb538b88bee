"""Where downloaded models live on disk, what is known about them, and who may write them.

Layout (a person can read it; `bonsai rm PROFILE` deletes one folder):

    <models_dir>/<profile>/<file name as in the repo>      verified files only
    <models_dir>/<profile>/.verified.json                  sha256, size, mtime of each verified file
    <models_dir>/<profile>/.partial/<name>.<sha12>.part    an interrupted download, resumed later
    <models_dir>/.locks/<profile>.lock                     one writer per profile

A file only gets its final name after its sha256 matched, so a file under its real name is
either verified or was put there by hand. The record keeps size and mtime so later runs trust
the file without re-hashing gigabytes; touching or rewriting the file voids the record.
The lock lives outside the profile folder so `bonsai rm` can delete the folder while holding it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.paths import models_dir, profile_models_dir

RECORD_NAME = ".verified.json"
PARTIAL_DIR = ".partial"
HASH_BLOCK = 4 * 1024 * 1024


class ByteBar(Protocol):
    """What hashing and downloading report progress to (see download_progress.py)."""

    def update(self, n: int) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Record:
    """Proof that a file was checked: its sha256 matched `sha256` when it had this size and mtime."""

    sha256: str
    size: int
    mtime_ns: int
    source: str  # where the expected sha256 came from: "hf:<repo>@<commit>" or "pypi:<package>"
    verified_at: str


@dataclass(frozen=True)
class FileState:
    """What is on disk for one file of a profile, without hashing anything."""

    name: str
    path: Path
    present: bool
    size: int | None
    verified: bool  # present, recorded, and unchanged since it was recorded
    record: Record | None
    partial_bytes: int  # bytes of an interrupted download waiting to be resumed


def folder(profile_name: str) -> Path:
    return profile_models_dir(profile_name)


def _check_name(profile_name: str) -> None:
    # A profile name becomes a folder name; never let it climb out of models_dir().
    if (
        not profile_name
        or profile_name.startswith(".")
        or any(c in profile_name for c in "/\\")
        or ".." in profile_name
    ):
        raise BonsaiError(f"{profile_name!r} is not a valid profile name", "use a name from `bonsai models`")


# --- verification records -------------------------------------------------------------------


def read_records(profile_name: str) -> dict[str, Record]:
    path = folder(profile_name) / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {name: Record(**entry) for name, entry in data.get("files", {}).items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError):
        # A damaged record only costs a re-hash; never fail a launch over it.
        return {}


def _write_records(profile_name: str, records: dict[str, Record]) -> None:
    target = folder(profile_name) / RECORD_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{RECORD_NAME}.{os.getpid()}.tmp")
    data = {"version": 1, "files": {name: asdict(r) for name, r in sorted(records.items())}}
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def record_verified(profile_name: str, name: str, sha256: str, source: str) -> Record:
    """Remember that folder/name has this sha256 (the caller has just checked it)."""
    path = folder(profile_name) / name
    st = path.stat()
    record = Record(
        sha256=sha256,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        source=source,
        verified_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    records = read_records(profile_name)
    records[name] = record
    _write_records(profile_name, records)
    return record


def forget(profile_name: str, name: str) -> None:
    records = read_records(profile_name)
    if records.pop(name, None) is not None:
        _write_records(profile_name, records)


def state(profile_name: str, name: str, records: dict[str, Record] | None = None) -> FileState:
    path = folder(profile_name) / name
    record = (read_records(profile_name) if records is None else records).get(name)
    try:
        st = path.stat()
        present = path.is_file()
    except OSError:
        st, present = None, False
    verified = bool(present and record and st and record.size == st.st_size and record.mtime_ns == st.st_mtime_ns)
    partial = sum(p.stat().st_size for p in partials(profile_name, name))
    return FileState(
        name, path, present, st.st_size if present and st else None, verified, record if verified else None, partial
    )


# --- partial downloads ----------------------------------------------------------------------


def partial_path(profile_name: str, name: str, sha256: str) -> Path:
    """The resume file of one exact version: a partial of another version is never resumed."""
    return folder(profile_name) / PARTIAL_DIR / f"{name}.{sha256[:12]}.part"


def partials(profile_name: str, name: str) -> list[Path]:
    directory = folder(profile_name) / PARTIAL_DIR
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob(f"{name}.*.part") if p.is_file())


def drop_stale_partials(profile_name: str, name: str, keep: Path) -> None:
    for p in partials(profile_name, name):
        if p != keep:
            p.unlink(missing_ok=True)


def install(partial: Path, profile_name: str, name: str) -> Path:
    """Give a checked download its final name (an atomic rename on the same disk)."""
    target = folder(profile_name) / name
    os.replace(partial, target)
    with contextlib.suppress(OSError):
        partial.parent.rmdir()  # only when no other partial is waiting
    return target


# --- hashing --------------------------------------------------------------------------------


def sha256_file(path: Path, bar: ByteBar | None = None, limit: int | None = None) -> hashlib._Hash:
    """The sha256 object of a file (or of its first `limit` bytes), reading it in large blocks."""
    digest = hashlib.sha256()
    remaining = limit
    with path.open("rb") as fh:
        while remaining is None or remaining > 0:
            block = fh.read(HASH_BLOCK if remaining is None else min(HASH_BLOCK, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
            if bar is not None:
                bar.update(len(block))
    return digest


class HashingFile:
    """A file opened for writing that hashes what is written, so a download is checked without a
    second pass over gigabytes. It offers what huggingface_hub's http_get uses: write, tell,
    seek and truncate (it rewinds and truncates when a server ignores a Range request)."""

    def __init__(self, path: Path, prefix_bar_factory: Callable[[int], ByteBar | None] | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("r+b" if path.exists() else "w+b")
        self._fh.seek(0, os.SEEK_END)
        self.resumed_from = self._fh.tell()
        # Bytes already on disk from an interrupted run are part of the file: hash them first.
        bar = prefix_bar_factory(self.resumed_from) if prefix_bar_factory and self.resumed_from else None
        try:
            self._digest = sha256_file(path, bar) if self.resumed_from else hashlib.sha256()
        finally:
            if bar is not None:
                bar.close()
        self._hashed = self.resumed_from

    def write(self, data: bytes) -> int:
        if self._fh.tell() != self._hashed:
            raise OSError(f"{self.path}: write at {self._fh.tell()} but {self._hashed} bytes are hashed")
        n = self._fh.write(data)
        self._digest.update(data)
        self._hashed += n
        return n

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._fh.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        size = self._fh.tell() if size is None else size
        result = self._fh.truncate(size)
        if size < self._hashed:
            self.resumed_from = min(self.resumed_from, size)  # the server restarted us from there
            self._fh.flush()
            self._digest = sha256_file(self.path, limit=size) if size else hashlib.sha256()
            self._hashed = size
        return result

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if self._fh.closed:  # closed early (a refused download), then again on leaving `with`
            return
        self._fh.flush()
        with contextlib.suppress(OSError):
            os.fsync(self._fh.fileno())
        self._fh.close()

    @property
    def size(self) -> int:
        return self._hashed

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def __enter__(self) -> HashingFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- disk space -----------------------------------------------------------------------------


def free_bytes(path: Path) -> int:
    """Free space on the disk that holds `path` (or would hold it: the nearest existing parent)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def human(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def require_space(directory: Path, needs: dict[str, int]) -> None:
    """Refuse before downloading anything when the files cannot fit, with the numbers."""
    need = sum(needs.values())
    if need <= 0:
        return
    free = free_bytes(directory)
    if need > free:
        detail = ", ".join(f"{name} {human(n)}" for name, n in needs.items())
        raise ActionFailed(
            f"not enough disk space in {directory}: the download needs {human(need)} ({detail}) "
            f"but only {human(free)} is free",
            f"free at least {human(need - free)} there, or set BONSAI_MODELS_DIR to a disk with room",
        )


# --- locking --------------------------------------------------------------------------------


def lock_path(profile_name: str) -> Path:
    return models_dir() / ".locks" / f"{profile_name}.lock"


@contextlib.contextmanager
def profile_lock(profile_name: str, on_wait: Callable[[Path], None] | None = None, wait: bool = True) -> Iterator[None]:
    """Hold the profile's lock: two pulls (or a pull and an rm) never write the same folder.

    `on_wait` is told once when another process holds it; `wait=False` refuses instead.
    """
    from filelock import FileLock, Timeout

    _check_name(profile_name)
    path = lock_path(profile_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if not wait:
            raise BonsaiError(
                f"another bonsai command is writing profile {profile_name} (lock {path})",
                "wait for it to finish, then try again",
            ) from None
        if on_wait is not None:
            on_wait(path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


# --- removal --------------------------------------------------------------------------------


def folder_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / f).lstat().st_size
    return total


def stored_profiles() -> list[str]:
    """Names of the profile folders that exist under models_dir()."""
    base = models_dir()
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def remove(profile_name: str) -> int:
    """Delete a profile's folder (files, records, partial downloads); the bytes freed.

    The caller holds the profile lock. The folder is renamed away first, so a crash halfway
    leaves no half-deleted profile that looks complete.
    """
    _check_name(profile_name)
    target = folder(profile_name)
    if not target.exists():
        return 0
    size = folder_size(target)
    doomed = target.with_name(f".{profile_name}.removing.{os.getpid()}")
    os.replace(target, doomed)
    shutil.rmtree(doomed)
    return size
