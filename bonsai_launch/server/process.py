"""One llama-server child process: spawn, wait until it serves, stop it, read its log, and
the stop signals that reach it (StopRequested, SignalForwarder: every parent of a server uses
them, the foreground `bonsai start` as well as the keeper of a detached one).

This is the edge where processes live. How a child is started, stopped and tied to
bonsai's life differs per operating system; process_control.py holds those differences
behind one interface (own process group, polite stop, forced stop, no orphan when bonsai
dies), and this module uses only that interface.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from bonsai_launch.core import process_control
from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.core.log_files import open_append_shared, open_read_shared
from bonsai_launch.core.process_control import exit_hint

POLL_INTERVAL = 0.02  # /health is cheap (~1 ms); polling often keeps the launcher's added latency low
RESEND_AFTER = 2.0  # seconds before a lost stop request is sent again
_HANDLED_SIGNALS = process_control.current().stop_signals()  # SIGINT/SIGTERM/SIGHUP; SIGINT/SIGBREAK on Windows


class ServerProcess:
    """A running llama-server. Create it with `spawn`; always end it with `stop`."""

    def __init__(
        self,
        popen: subprocess.Popen,
        base_url: str,
        log_path: Path,
        argv: Sequence[str],
        control: process_control.ProcessControl | None = None,
        guard: process_control.Guard | None = None,
        detached: bool = False,
    ) -> None:
        self._popen = popen
        self.control = control or process_control.current()
        self._guard = guard
        self.detached = detached  # started to outlive bonsai (on Windows: without a console)
        self.pid: int = popen.pid
        self.base_url = base_url
        self.log_path = log_path
        self.argv = tuple(argv)
        self.started_at = time.time()

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        log_path: Path,
        base_url: str,
        die_with_parent: bool = True,
        control: process_control.ProcessControl | None = None,
    ) -> ServerProcess:
        """Start `argv` with stdout and stderr appended to `log_path`.

        `argv` is a list handed to the OS as it is: no shell, no quoting. `env` holds extra
        variables layered over ours (LLAMA_API_KEY, for instance), so a key never shows on
        the command line. `die_with_parent=False` is for detached servers, which must
        outlive the `bonsai start --detach` that spawned them.
        """
        control = control or process_control.current()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        with open_append_shared(log_path) as log:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                    close_fds=True,
                    **control.popen_options(die_with_parent=die_with_parent, detached=not die_with_parent),
                )
            except OSError as exc:
                raise ActionFailed(
                    f"cannot run {argv[0]}: {exc}",
                    "run `bonsai build`, or point BONSAI_LLAMA_SERVER at a working llama-server",
                ) from None
        guard = control.guard(popen, die_with_parent=die_with_parent)
        return cls(popen, base_url, log_path, argv, control, guard, detached=not die_with_parent)

    # -- state -----------------------------------------------------------------------------

    def alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, n: int = 30) -> list[str]:
        try:
            with open_read_shared(self.log_path) as f:
                # Logs can be large (verbose mode): read only the end.
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return []
        return list(deque(lines, maxlen=n))

    # -- readiness ---------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 120.0, on_status: Callable[[str], None] | None = None) -> None:
        """Poll /health until 200. 503 means loading; any other failure means not up yet.

        Raises ActionFailed with the server's last log lines when it exits first, or when
        `timeout` passes (the server is left running; the caller decides to stop it).
        """
        import httpx

        from bonsai_launch.server.client import session

        deadline = time.monotonic() + timeout
        last_status = ""

        def report(status: str) -> None:
            nonlocal last_status
            if status != last_status and on_status is not None:
                on_status(status)
            last_status = status

        report("starting llama-server")
        with session(None, 2.0) as http:
            while True:
                code = self._popen.poll()
                if code is not None:
                    raise ActionFailed(self._exit_message(code, "while loading"), f"full log: {self.log_path}")
                try:
                    r = http.get(self.base_url + "/health")
                    if r.status_code == 200:
                        report("ready")
                        return
                    if r.status_code == 503:
                        report("loading model")
                    else:
                        report(f"health answered {r.status_code}")
                except httpx.HTTPError:
                    report("starting llama-server")
                if time.monotonic() > deadline:
                    raise ActionFailed(
                        f"llama-server was not ready after {timeout:.0f} s (last state: {last_status})",
                        f"see the log {self.log_path}",
                    )
                time.sleep(POLL_INTERVAL)

    def _exit_message(self, code: int, when: str) -> str:
        tail = self.log_tail(30)
        body = "\n".join("  " + line for line in tail) if tail else "  (the log is empty)"
        return f"llama-server {exit_cause(code)} {when}; last log lines:\n{body}"

    def exit_message(self, when: str = "") -> str:
        """What to tell the user when the server ended on its own."""
        code = self._popen.poll()
        return self._exit_message(code if code is not None else 0, when or "unexpectedly")

    # -- stopping ----------------------------------------------------------------------------

    def request_stop(self) -> bool:
        """Ask the server (and its group) to exit: SIGTERM, or CTRL_BREAK_EVENT on Windows."""
        if self._popen.poll() is not None:
            return True
        return self.control.request_stop(self.pid, shares_console=not self.detached)

    def kill(self) -> None:
        """End the server now: SIGKILL to its group, or TerminateProcess on Windows."""
        if self._popen.poll() is None:
            self.control.force_stop(self.pid, self._popen)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Ask politely, wait up to `timeout`, then end it. Returns the exit code."""
        if self._popen.poll() is None:
            sent = self.request_stop()
            code = self.wait(min(timeout, RESEND_AFTER)) if sent else None
            if sent and code is None and timeout > RESEND_AFTER:
                # llama-server (b11434) loses a SIGTERM that arrives between /health turning 200
                # and its task loop starting; a second one always ends it.
                self.request_stop()
                code = self.wait(timeout - RESEND_AFTER)
            if code is None:
                self.kill()
                self.wait(5.0)
        if self._popen.poll() is not None and self._guard is not None:
            self._guard.release()  # only once the server is gone: a Job Object's close would end it
            self._guard = None
        return self._popen.poll()


# -- signals -------------------------------------------------------------------------------------


class StopRequested(BaseException):
    """The user (or the system) asked bonsai to stop: Ctrl+C, SIGTERM or SIGHUP. A
    BaseException, like KeyboardInterrupt, so no `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalForwarder:
    """Turns the first stop signal into StopRequested in the main thread; a second one while
    stopping kills the server at once (the user is impatient, and no orphan is left)."""

    def __init__(self, signals: tuple[int, ...] = _HANDLED_SIGNALS) -> None:
        self.server: ServerProcess | None = None
        self.received: int | None = None
        self._signals = signals
        self._previous: dict[int, object] = {}
        self._holding = False

    def _handle(self, signum, frame) -> None:  # signal handler signature
        if self.received is None:
            self.received = signum
            if not self._holding:
                raise StopRequested(signum)
        elif self.server is not None:
            self.server.kill()

    @contextmanager
    def held(self) -> Iterator[None]:
        """A first stop signal inside is acted on when the block ends. Spawning the server and
        recording it here is one step that way: a stop that arrives between the two would
        otherwise find a running server that bonsai did not know it had started."""
        arrived_before = self.received is not None
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self.received is not None and not arrived_before:
            raise StopRequested(self.received)

    def __enter__(self) -> SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            for sig in self._signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


def exit_cause(code: int) -> str:
    """`was killed by signal 9 (SIGKILL: ...)`, `exited with code 1`: how a process ended."""
    if code < 0:
        how = f"was killed by signal {-code}"
    elif code >= 0xC0000000:
        how = f"exited with code {code:#x}"
    else:
        how = f"exited with code {code}"
    hint = exit_hint(code)
    return f"{how} ({hint})" if hint else how


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (for tests and temporary servers)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
