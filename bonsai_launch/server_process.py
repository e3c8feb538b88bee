"""One llama-server child process: spawn, wait until it serves, stop it, read its log.

This is the edge where processes live. The child gets its own process group so a signal
meant for it never hits `bonsai` (and Ctrl+C in the terminal reaches only us, who then
forward it). On Linux the child is also tied to our life with PR_SET_PDEATHSIG, so even a
`kill -9` of bonsai leaves no orphaned server behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bonsai_launch.errors import ActionFailed

POLL_INTERVAL = 0.02  # /health is cheap (~1 ms); polling often keeps the launcher's added latency low
_PR_SET_PDEATHSIG = 1
RESEND_AFTER = 2.0  # seconds before a lost SIGTERM is sent again


# What a fatal signal usually means for llama-server, to put next to the log tail.
_SIGNAL_HINTS = {
    4: "illegal instruction: the binary uses CPU instructions this machine cannot run, e.g. AMX or "
       "AVX-512 in a VM that hides them; rebuild with `bonsai build --force`, or try LLAMA_ARG_REPACK=0",
    6: "aborted: a GGML_ASSERT failed; the log lines below say which",
    9: "SIGKILL: killed from outside, often by the out-of-memory killer",
    11: "segmentation fault",
}


def _die_with_parent() -> None:
    """preexec_fn (Linux): ask the kernel to SIGTERM the child when bonsai dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:  # best effort: the process group still lets us stop it normally
        pass


class ServerProcess:
    """A running llama-server. Create it with `spawn`; always end it with `stop`."""

    def __init__(self, popen: subprocess.Popen, base_url: str, log_path: Path, argv: Sequence[str]) -> None:
        self._popen = popen
        self.pid: int = popen.pid
        self.base_url = base_url
        self.log_path = log_path
        self.argv = tuple(argv)
        self.started_at = time.time()

    @classmethod
    def spawn(cls, argv: Sequence[str], *, env: Mapping[str, str] | None, log_path: Path,
              base_url: str, die_with_parent: bool = True) -> "ServerProcess":
        """Start `argv` with stdout and stderr appended to `log_path`.

        `env` holds extra variables layered over ours (LLAMA_API_KEY, for instance), so a
        key never shows on the command line. `die_with_parent=False` is for detached servers,
        which must outlive the `bonsai start --detach` that spawned them.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        kwargs: dict = {}
        if sys.platform == "win32":
            kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
        else:
            kwargs["start_new_session"] = True
            if die_with_parent and sys.platform.startswith("linux"):
                kwargs["preexec_fn"] = _die_with_parent
        with open(log_path, "ab") as log:
            try:
                popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=full_env, close_fds=True, **kwargs)
            except OSError as exc:
                raise ActionFailed(f"cannot run {argv[0]}: {exc}",
                                   "run `bonsai build`, or point BONSAI_LLAMA_SERVER at a working llama-server") from None
        return cls(popen, base_url, log_path, argv)

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
            with open(self.log_path, "rb") as f:
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

        deadline = time.monotonic() + timeout
        last_status = ""

        def report(status: str) -> None:
            nonlocal last_status
            if status != last_status and on_status is not None:
                on_status(status)
            last_status = status

        report("starting llama-server")
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            while True:
                code = self._popen.poll()
                if code is not None:
                    raise ActionFailed(self._exit_message(code, "while loading"),
                                       f"full log: {self.log_path}")
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
                    raise ActionFailed(f"llama-server was not ready after {timeout:.0f} s (last state: {last_status})",
                                       f"see the log {self.log_path}")
                time.sleep(POLL_INTERVAL)

    def _exit_message(self, code: int, when: str) -> str:
        tail = self.log_tail(30)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if code < 0 or code > 128:
            hint = _SIGNAL_HINTS.get(-code if code < 0 else code - 128)
            if hint:
                how += f" ({hint})"
        body = "\n".join("  " + line for line in tail) if tail else "  (the log is empty)"
        return f"llama-server {how} {when}; last log lines:\n{body}"

    def exit_message(self, when: str = "") -> str:
        """What to tell the user when the server ended on its own."""
        code = self._popen.poll()
        return self._exit_message(code if code is not None else 0, when or "unexpectedly")

    # -- stopping ----------------------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Signal the whole group (llama-server has no children today, but a wrapper might)."""
        if self._popen.poll() is not None:
            return
        try:
            if sys.platform == "win32":
                self._popen.send_signal(sig)
            else:
                os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM to the group, wait up to `timeout`, then SIGKILL. Returns the exit code."""
        if self._popen.poll() is None:
            term = signal.SIGTERM if sys.platform != "win32" else signal.CTRL_BREAK_EVENT  # type: ignore[attr-defined]
            self.send_signal(term)
            code = self.wait(min(timeout, RESEND_AFTER))
            if code is None and timeout > RESEND_AFTER:
                # llama-server (b11434) loses a SIGTERM that arrives between /health turning 200
                # and its task loop starting; a second one always ends it.
                self.send_signal(term)
                code = self.wait(timeout - RESEND_AFTER)
            if code is None:
                if sys.platform == "win32":
                    self._popen.kill()
                else:
                    try:
                        os.killpg(self.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                self.wait(5.0)
        return self._popen.poll()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (for tests and temporary servers)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
