"""`python -m bonsai_launch.core.watchdog PID [GRACE]`: stop PID's process group when bonsai dies.

Used where the kernel cannot do it for us (macOS and other POSIX systems without Linux's
PR_SET_PDEATHSIG; see process_control.py). Its stdin is the read end of a pipe that only
bonsai can write to. Reading blocks until bonsai closes it: on purpose after stopping the
server itself (the watchdog then finds nothing to do), or because bonsai died, even by
SIGKILL, when the kernel closes every descriptor it held. Then: SIGTERM to the group, once
more after RESEND_AFTER seconds (llama-server can lose the first one while it finishes
loading), SIGKILL after GRACE seconds.

It imports only the standard library and psutil, so it costs a few MiB and ~50 ms to start,
in parallel with the model loading.
"""

from __future__ import annotations

import os
import signal
import sys
import time

RESEND_AFTER = 2.0


def _same_process(pid: int, created: float | None) -> bool:
    """Is `pid` still the process we watch (not gone, not a zombie, not a reused pid)?"""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(proc.create_time() - created) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_group(pid: int, created: float | None, grace: float) -> bool:
    """SIGTERM, a resend, then SIGKILL; True when the process is gone."""
    if not _same_process(pid, created):
        return True
    _signal_group(pid, signal.SIGTERM)
    started = time.monotonic()
    resent = False
    while time.monotonic() - started < grace:
        if not _same_process(pid, created):
            return True
        if not resent and time.monotonic() - started > RESEND_AFTER:
            _signal_group(pid, signal.SIGTERM)
            resent = True
        time.sleep(0.05)
    if _same_process(pid, created):
        _signal_group(pid, signal.SIGKILL)
    return not _same_process(pid, created)


def wait_for_eof(fd: int = 0) -> None:
    while True:
        try:
            if not os.read(fd, 4096):
                return
        except InterruptedError:
            continue
        except OSError:
            return


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m bonsai_launch.core.watchdog PID [GRACE_SECONDS]\n")
        return 2
    pid = int(argv[0])
    grace = float(argv[1]) if len(argv) > 1 else 10.0
    for name in ("SIGINT", "SIGHUP", "SIGTSTP"):
        if hasattr(signal, name):  # the terminal's keys are for bonsai, not for us
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    import psutil

    try:
        created: float | None = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0
    except psutil.AccessDenied:
        created = None
    wait_for_eof(0)
    stop_group(pid, created, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
