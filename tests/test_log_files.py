"""Logs and state files that Windows can rename and replace while they are open.

The Windows branch runs here with stand-ins for pywin32's win32file and msvcrt that record
the CreateFile call and hand back a real descriptor, so the file object works for real.
"""

from __future__ import annotations

import os
import types

import pytest

from bonsai_launch.core import log_files


def fake_windows(calls: list):
    def create_file(path, access, share, security, disposition, flags, template):
        calls.append((access, share, disposition))
        mode = os.O_RDONLY if access == log_files.GENERIC_READ else os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd = os.open(path, mode, 0o644)
        return types.SimpleNamespace(Detach=lambda: fd)

    return {
        "win32file": types.SimpleNamespace(CreateFile=create_file),
        "msvcrt": types.SimpleNamespace(open_osfhandle=lambda handle, flags: handle),
    }


def test_windows_log_is_opened_with_delete_sharing(tmp_path):
    calls: list = []
    log = tmp_path / "demo.log"
    with log_files.open_append_shared(log, platform="win32", **fake_windows(calls)) as f:
        f.write(b"first\n")
    with log_files.open_append_shared(log, platform="win32", **fake_windows(calls)) as f:
        f.write(b"second\n")  # appended, not overwritten
    with log_files.open_read_shared(log, platform="win32", **fake_windows(calls)) as f:
        assert f.read() == b"first\nsecond\n"
    share_delete = 0x4
    assert all(share & share_delete for _access, share, _disp in calls)
    assert [c[0] for c in calls] == [log_files.FILE_APPEND_DATA] * 2 + [log_files.GENERIC_READ]
    assert [c[2] for c in calls] == [log_files.OPEN_ALWAYS] * 2 + [log_files.OPEN_EXISTING]


def test_without_pywin32_plain_open_is_used(tmp_path):
    with log_files.open_append_shared(tmp_path / "a.log", platform="linux") as f:
        f.write(b"x")
    if os.name != "nt":
        with log_files.open_append_shared(tmp_path / "b.log", platform="win32") as f:  # no pywin32 here
            f.write(b"y")
        assert (tmp_path / "b.log").read_bytes() == b"y"


def test_a_log_can_be_rotated_while_a_server_writes_to_it(tmp_path):
    log = tmp_path / "demo.log"
    with log_files.open_append_shared(log) as writer, log_files.open_read_shared(log) as reader:
        writer.write(b"old\n")
        writer.flush()
        os.replace(log, tmp_path / "demo.log.1")  # what supervisor.log_path_for does on the next start
        assert reader.read() == b"old\n"
    assert (tmp_path / "demo.log.1").read_bytes() == b"old\n"


def test_replace_is_retried_while_windows_says_in_use(tmp_path):
    attempts = []

    def busy_twice(src, dst):
        attempts.append(1)
        if len(attempts) < 3:
            raise PermissionError(13, "The process cannot access the file because it is being used")
        os.replace(src, dst)

    (tmp_path / "new").write_text("x")
    log_files.replace_retrying(tmp_path / "new", tmp_path / "state.json", delay=0, replace=busy_twice)
    assert len(attempts) == 3 and (tmp_path / "state.json").read_text() == "x"

    def always_busy(src, dst):
        raise PermissionError(13, "in use")

    with pytest.raises(PermissionError):
        log_files.replace_retrying(tmp_path / "x", tmp_path / "y", attempts=3, delay=0, replace=always_busy)


def test_windows_open_errors_are_oserrors(tmp_path):
    class WinError(Exception):
        winerror, strerror = 2, "The system cannot find the file specified."

    def missing(*args):
        raise WinError()

    modules = {"win32file": types.SimpleNamespace(CreateFile=missing), "msvcrt": types.SimpleNamespace()}
    with pytest.raises(OSError, match="cannot find the file"):  # FileNotFoundError on Windows itself
        log_files.open_read_shared(tmp_path / "gone.json", platform="win32", **modules)
