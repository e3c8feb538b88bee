"""Opening logs and state files so that Windows can still rename and replace them.

On POSIX a file can be renamed or replaced while any process has it open. On Windows a
rename or a replace fails while someone holds the file without FILE_SHARE_DELETE, and
Python's open() never asks for it. llama-server holds its log for as long as it runs and
`bonsai logs -f` reads it meanwhile; `bonsai ps` reads state files that `bonsai start`
replaces. So on Windows these files are opened through CreateFile (pywin32's win32file)
with read, write and delete sharing, and a replace that still meets a reader without it
(another program, an antivirus scan) is retried for a moment instead of failing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Windows SDK values (winnt.h / fileapi.h), so this module imports and is tested anywhere.
FILE_APPEND_DATA = 0x0004
GENERIC_READ = 0x80000000
FILE_SHARE_ALL = 0x1 | 0x2 | 0x4  # FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE
OPEN_EXISTING = 3
OPEN_ALWAYS = 4
FILE_ATTRIBUTE_NORMAL = 0x80


def _win32_open(
    path: Path, access: int, disposition: int, flags: int, mode: str, win32file: Any = None, msvcrt: Any = None
) -> IO[bytes] | None:
    """A Python file object over a CreateFile handle with full sharing; None without pywin32."""
    try:
        if win32file is None:
            import msvcrt

            import win32file
    except ImportError:
        return None
    try:
        handle = win32file.CreateFile(str(path), access, FILE_SHARE_ALL, None, disposition, FILE_ATTRIBUTE_NORMAL, None)
    except Exception as exc:  # pywintypes.error: turn it into what open() would raise
        # On Windows, OSError's 4th argument (winerror) picks the subclass: FileNotFoundError...
        raise OSError(
            None, getattr(exc, "strerror", None) or str(exc), str(path), getattr(exc, "winerror", None)
        ) from None
    fd = msvcrt.open_osfhandle(handle.Detach(), flags)
    return os.fdopen(fd, mode)


def open_append_shared(path: Path, *, platform: str | None = None, **modules: Any) -> IO[bytes]:
    """Open `path` for appending bytes (created if missing), renamable while open."""
    if (platform or sys.platform) == "win32":
        f = _win32_open(path, FILE_APPEND_DATA, OPEN_ALWAYS, os.O_APPEND | getattr(os, "O_BINARY", 0), "ab", **modules)
        if f is not None:
            return f
    return open(path, "ab")


def open_read_shared(path: Path, *, platform: str | None = None, **modules: Any) -> IO[bytes]:
    """Open `path` for reading bytes without keeping a writer from renaming or replacing it."""
    if (platform or sys.platform) == "win32":
        f = _win32_open(path, GENERIC_READ, OPEN_EXISTING, os.O_RDONLY | getattr(os, "O_BINARY", 0), "rb", **modules)
        if f is not None:
            return f
    return open(path, "rb")


def replace_retrying(
    src: Path,
    dst: Path,
    *,
    attempts: int = 20,
    delay: float = 0.025,
    replace: Callable[[Path, Path], None] = os.replace,
) -> None:
    """os.replace, retried for about half a second while Windows says the target is in use."""
    for attempt in range(attempts):
        try:
            replace(src, dst)
            return
        except PermissionError:
            if attempt == attempts - 1:
                raise
            time.sleep(delay)


def append_note(path: Path, text: str) -> None:
    """One `[bonsai <time>] text` line in a server's log (what `bonsai logs` shows beside
    llama-server's own lines); a log that cannot be written loses the note, never the caller."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open_append_shared(path) as f:
            f.write(f"[bonsai {stamp}] {text}\n".encode())
    except OSError:
        pass
