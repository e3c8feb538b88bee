"""How bonsai starts, stops and outlives child processes on each operating system.

One small interface, three implementations, chosen by `for_platform(sys.platform)`:

- Linux: the child gets its own session (so Ctrl+C in the terminal reaches only bonsai, who
  then stops the server on purpose) and PR_SET_PDEATHSIG, so the kernel sends it SIGTERM
  even when bonsai is killed with `kill -9`. Stop = SIGTERM to the group, SIGKILL to end it.
- macOS (and other POSIX systems): the same session and signals, but there is no
  PDEATHSIG. A watchdog (`python -m bonsai_launch.core.watchdog`, a few MiB, stdlib + psutil)
  holds the read end of a pipe whose write end only bonsai has; when bonsai dies for any
  reason the kernel closes that end, the watchdog reads EOF and stops the server.
- Windows: no process groups in the POSIX sense and no `os.killpg`. The child starts in a
  new process group (CREATE_NEW_PROCESS_GROUP), so the console's Ctrl+C reaches only
  bonsai; stop = CTRL_BREAK_EVENT to that group (llama-server handles only CTRL_C_EVENT, so
  the default handler ends it at once), then TerminateProcess. A Job Object with
  KILL_ON_JOB_CLOSE (through pywin32's win32job) ends the server when bonsai dies.
  A console event is sent only to a group we started in our own console: Windows delivers
  it to the processes of the sender's console, and for a group id it does not know there it
  can reach every process of that console, bonsai included. So `bonsai stop` (another
  process's server) and detached servers (no console) are ended with TerminateProcess.

Signals that do not exist on a system are never named there: every signal number comes
from `signal` through getattr, and the Windows branch only uses console events.
Tests run each branch on Linux by building a control for another platform with fake
system calls (see tests/test_process_control.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# Windows constants, spelled out so that the Windows branch can be built (and tested) on
# any system; the values are those of the Windows SDK and of Python's subprocess/signal.
CREATE_NEW_PROCESS_GROUP = 0x00000200
DETACHED_PROCESS = 0x00000008
CTRL_BREAK_EVENT = 1

_PR_SET_PDEATHSIG = 1


class Guard(Protocol):
    """What keeps a child tied to bonsai's life (a watchdog, a Job Object); `release` after
    the child has been stopped."""

    def release(self) -> None: ...


class _NoGuard:
    def release(self) -> None:
        pass


@dataclass
class SysCalls:
    """The system calls a control uses; tests replace them to run another system's branch."""

    kill: Callable[[int, int], None] = os.kill
    killpg: Callable[[int, int], None] | None = getattr(os, "killpg", None)  # noqa: RUF009 - None on Windows


class ProcessControl:
    """Start a child in its own group, stop it politely, then for certain, and keep it from
    outliving bonsai. Subclasses fill in one operating system each."""

    system = "posix"
    #: signals bonsai turns into an orderly stop of its server (names; present ones only)
    stop_signal_names: tuple[str, ...] = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self, calls: SysCalls | None = None) -> None:
        self.calls = calls or SysCalls()

    # -- starting ----------------------------------------------------------------------------

    def popen_options(self, *, die_with_parent: bool, detached: bool = False) -> dict[str, Any]:
        """Extra keyword arguments for subprocess.Popen: the child's own process group, and
        what ties it to bonsai (`die_with_parent`) or frees it from our console (`detached`)."""
        raise NotImplementedError

    def guard(self, popen: subprocess.Popen, *, die_with_parent: bool) -> Guard:
        """Tie a freshly started child to bonsai's life, where the system needs a helper."""
        return _NoGuard()

    # -- stopping ----------------------------------------------------------------------------

    def request_stop(self, pid: int, *, shares_console: bool = True) -> bool:
        """Ask the child (and its group) to exit. False when the request could not be sent,
        so the caller goes straight to `force_stop`. `shares_console=False`: `pid` was not
        started by this process in its console (a detached server, another bonsai's)."""
        raise NotImplementedError

    def force_stop(self, pid: int, popen: subprocess.Popen | None = None) -> None:
        """End the child (and its group) now."""
        raise NotImplementedError

    def interrupt(self, pid: int) -> bool:
        """What Ctrl+C would send: used to stop a build (ninja and its compilers)."""
        return self.request_stop(pid)

    def end_leftovers(self, pid: int) -> None:
        """After a group's leader has exited, end whatever is left in its group."""

    def stop_signals(self) -> tuple[int, ...]:
        return tuple(getattr(signal, n) for n in self.stop_signal_names if hasattr(signal, n))


class PosixControl(ProcessControl):
    """Sessions and signals; the base of Linux and macOS."""

    system = "posix"

    def popen_options(self, *, die_with_parent: bool, detached: bool = False) -> dict[str, Any]:
        return {"start_new_session": True}  # pgid == pid: one signal reaches the whole group

    def _signal_group(self, pid: int, sig: int) -> bool:
        try:
            if self.calls.killpg is not None:
                self.calls.killpg(pid, sig)
            else:
                self.calls.kill(pid, sig)
            return True
        except ProcessLookupError:
            return True  # already gone: nothing left to ask
        except PermissionError:
            # Not our group (pgid != pid, e.g. started by someone else): the process alone.
            try:
                self.calls.kill(pid, sig)
                return True
            except (ProcessLookupError, PermissionError):
                return False

    def request_stop(self, pid: int, *, shares_console: bool = True) -> bool:
        return self._signal_group(pid, signal.SIGTERM)

    def interrupt(self, pid: int) -> bool:
        return self._signal_group(pid, signal.SIGINT)

    def force_stop(self, pid: int, popen: subprocess.Popen | None = None) -> None:
        self._signal_group(pid, getattr(signal, "SIGKILL", signal.SIGTERM))

    def end_leftovers(self, pid: int) -> None:
        try:
            if self.calls.killpg is not None:
                self.calls.killpg(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
        except (ProcessLookupError, PermissionError):
            pass


def _die_with_parent() -> None:
    """preexec_fn (Linux): ask the kernel to SIGTERM the child when bonsai dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:  # best effort: the process group still lets us stop it normally
        pass


class LinuxControl(PosixControl):
    system = "linux"

    def popen_options(self, *, die_with_parent: bool, detached: bool = False) -> dict[str, Any]:
        options = super().popen_options(die_with_parent=die_with_parent, detached=detached)
        if die_with_parent and not detached:
            options["preexec_fn"] = _die_with_parent
        return options


@dataclass
class Watchdog:
    """A `python -m bonsai_launch.core.watchdog PID` process reading a pipe only bonsai writes to."""

    process: subprocess.Popen
    write_fd: int | None

    def release(self) -> None:
        """Close our end: the watchdog sees EOF, finds the server already gone and exits."""
        if self.write_fd is not None:
            try:
                os.close(self.write_fd)
            except OSError:
                pass
            self.write_fd = None
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_watchdog(pid: int, *, grace: float = 10.0) -> Watchdog:
    """Start the watchdog of `pid` with the read end of a fresh pipe as its stdin.

    Our write end is not inheritable (os.pipe's default), and every child is started with
    close_fds, so bonsai is the only holder: its death, however it happens, is the EOF.
    """
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "bonsai_launch.core.watchdog", str(pid), str(grace)],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
        )  # the terminal's Ctrl+C must not end it before bonsai is done
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return Watchdog(process, write_fd)


class WatchdogControl(PosixControl):
    """macOS and any POSIX system without PR_SET_PDEATHSIG."""

    system = "darwin"

    def guard(self, popen: subprocess.Popen, *, die_with_parent: bool) -> Guard:
        if not die_with_parent:
            return _NoGuard()
        try:
            return start_watchdog(popen.pid)
        except OSError:
            return _NoGuard()  # the server still runs and is stopped normally; only kill -9 of bonsai leaks it


@dataclass
class JobGuard:
    """A Windows Job Object with KILL_ON_JOB_CLOSE holding the server: when the last handle
    closes (bonsai exits or is killed), Windows ends every process in the job."""

    handle: Any
    close: Callable[[Any], None] = field(repr=False, default=lambda h: None)

    def release(self) -> None:
        if self.handle is not None:
            try:
                self.close(self.handle)
            except Exception:
                pass
            self.handle = None


def assign_kill_on_close_job(
    pid: int, win32job: Any = None, win32api: Any = None, win32con: Any = None
) -> JobGuard | None:
    """Put `pid` in a new Job Object that kills it when bonsai's handle closes (pywin32).

    None when pywin32 is missing or the system refuses (bonsai already in a job that forbids
    nesting on old Windows): the server then only ends when stopped, or with its console.
    """
    try:
        if win32job is None:
            import win32api
            import win32con
            import win32job
    except ImportError:
        return None
    try:
        job = win32job.CreateJobObject(None, "")
        info = win32job.QueryInformationJobObject(job, win32job.JobObjectExtendedLimitInformation)
        info["BasicLimitInformation"]["LimitFlags"] |= win32job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
        win32job.SetInformationJobObject(job, win32job.JobObjectExtendedLimitInformation, info)
        process = win32api.OpenProcess(win32con.PROCESS_SET_QUOTA | win32con.PROCESS_TERMINATE, False, pid)
        try:
            win32job.AssignProcessToJobObject(job, process)
        finally:
            win32api.CloseHandle(process)
    except Exception:
        return None
    return JobGuard(job, win32api.CloseHandle)


class WindowsControl(ProcessControl):
    system = "win32"
    # SIGBREAK is Ctrl+Break in the console; SIGTERM exists in Python on Windows but the OS never sends it.
    stop_signal_names = ("SIGINT", "SIGBREAK")

    def __init__(self, calls: SysCalls | None = None, job_factory: Callable[[int], Guard | None] | None = None) -> None:
        super().__init__(calls)
        self._job_factory = job_factory or assign_kill_on_close_job

    def popen_options(self, *, die_with_parent: bool, detached: bool = False) -> dict[str, Any]:
        flags = CREATE_NEW_PROCESS_GROUP
        if detached:
            # A detached server must survive the console window closing; without a console
            # it cannot get console events, so it is stopped with TerminateProcess.
            flags |= DETACHED_PROCESS
        return {"creationflags": flags}

    def guard(self, popen: subprocess.Popen, *, die_with_parent: bool) -> Guard:
        """A Job Object: it ends the server when bonsai dies and, when released, anything the
        child started (a build's compilers), which Windows has no process group signal for."""
        if not die_with_parent:
            return _NoGuard()
        return self._job_factory(popen.pid) or _NoGuard()

    def request_stop(self, pid: int, *, shares_console: bool = True) -> bool:
        # os.kill with a console event calls GenerateConsoleCtrlEvent for the group `pid`
        # leads (it was started with CREATE_NEW_PROCESS_GROUP, so pid is the group id).
        if not shares_console:
            return False  # see the module docstring: never broadcast to our own console
        try:
            self.calls.kill(pid, getattr(signal, "CTRL_BREAK_EVENT", CTRL_BREAK_EVENT))
            return True
        except OSError:  # no shared console (detached server, bonsai without a console)
            return False

    def force_stop(self, pid: int, popen: subprocess.Popen | None = None) -> None:
        if popen is not None:
            try:
                popen.kill()  # TerminateProcess on Windows
            except OSError:
                pass
            return
        import psutil

        try:
            psutil.Process(pid).kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def for_platform(platform: str | None = None, calls: SysCalls | None = None) -> ProcessControl:
    """The control for `platform` (a sys.platform value; default: this system)."""
    platform = platform or sys.platform
    if platform == "win32":
        return WindowsControl(calls)
    if platform.startswith("linux"):
        return LinuxControl(calls)
    return WatchdogControl(calls)


def current() -> ProcessControl:
    return for_platform(sys.platform)


# What a fatal signal usually means for llama-server, to put next to the log tail.
_SIGNAL_HINTS = {
    4: "illegal instruction: the binary uses CPU instructions this machine cannot run, e.g. AMX or "
    "AVX-512 in a VM that hides them; rebuild with `bonsai build --force`, or try LLAMA_ARG_REPACK=0",
    6: "aborted: a GGML_ASSERT failed; the log lines below say which",
    9: "SIGKILL: killed from outside, often by the out-of-memory killer",
    11: "segmentation fault",
}
# The same for Windows, where a crash is an NTSTATUS exit code instead of a signal.
_NTSTATUS_HINTS = {
    0xC000001D: _SIGNAL_HINTS[4],
    0xC0000005: "access violation (the Windows segmentation fault)",
    0xC0000409: "stack buffer overrun or abort(): a GGML_ASSERT may have failed; the log lines below say which",
    0xC000013A: "ended by a console Ctrl+C/Ctrl+Break",
    0xC0000017: "out of memory",
    0xC0000135: "a DLL it needs was not found: for a CUDA build, put the CUDA toolkit's bin folder on PATH",
}


def exit_hint(code: int) -> str | None:
    """A short explanation of a fatal exit code (POSIX signal or Windows NTSTATUS)."""
    if code < 0:
        return _SIGNAL_HINTS.get(-code)
    if code >= 0xC0000000:
        return _NTSTATUS_HINTS.get(code)
    if code > 128:
        return _SIGNAL_HINTS.get(code - 128)
    return None
