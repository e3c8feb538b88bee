"""The keeper of a detached server: `python -m bonsai_launch.server.keeper`.

Only a process's parent learns how it ended (a signal, an abort, an exit code), so a detached
server that must be restarted with its cause logged needs a parent that stays: the keeper. It
is a small detached process (its own session, no terminal) that `bonsai start --detach`
starts before anything else; the keeper spawns llama-server as its child and reports its pid.
The front (`bonsai start`) then does what it does for any server: waits for /health, proves
speculation, registers it, prints the summary; meanwhile the keeper only relays the child's
exit code, so a failed start is reported and cleaned up exactly as in the foreground. When
the front is done it hands the keeper the restart job and exits; from then on the keeper runs
server/restart.py's loop, writing its notes into the server's log. `bonsai stop` terminates
the keeper first (it is the instance's supervisor), which stops the server on purpose.

Protocol (JSON lines): front -> keeper stdin: {"spawn": {...}}, later {"serve": Job} or EOF
(the front gave up: stop the server). keeper -> front stdout: {"pid": N}, and {"exit": code}
if the server ends before the hand-over.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from bonsai_launch.core import process_control
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.log_files import open_append_shared
from bonsai_launch.server.process import ServerProcess, SignalForwarder, StopRequested, exit_cause


def _lines(stream: IO[bytes], into: queue.Queue) -> None:
    """Read JSON lines into a queue; None marks the end of the stream."""
    try:
        for raw in stream:
            try:
                into.put(json.loads(raw))
            except ValueError:
                continue
    except (OSError, ValueError):
        pass
    into.put(None)


def _reader(stream: IO[bytes]) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(stream, q), daemon=True).start()
    return q


def _unbuffered(stream: IO[bytes]) -> IO[bytes]:
    """The same pipe, read without Python's buffer. A daemon thread blocked in a buffered read
    holds that buffer's lock, and an interpreter that exits meanwhile aborts ("Fatal Python
    error: _enter_buffered_busy", SIGABRT): a keeper stopped while its server loaded was
    reported as "killed by signal 6". Unbuffered, readline stops at the newline, so nothing
    is read ahead of a line either."""
    return os.fdopen(stream.fileno(), "rb", buffering=0, closefd=False)


# -- the front's side ------------------------------------------------------------------------------


class KeptChild:
    """What ServerProcess needs of a Popen (pid, poll, wait, kill), for a server whose parent
    is the keeper: the exit code is the one the keeper relays."""

    def __init__(self, keeper: subprocess.Popen, messages: queue.Queue, pid: int, log_path: Path) -> None:
        self.keeper = keeper
        self.log_path = log_path
        self.pid = pid
        self._messages = messages
        self._code: int | None = None
        self._ended = False  # the keeper's stdout is closed
        self._handed_over = False

    def poll(self) -> int | None:
        while self._code is None and not self._ended:
            try:
                msg = self._messages.get_nowait()
            except queue.Empty:
                break
            if msg is None:
                self._ended = True
            elif "exit" in msg:
                self._code = int(msg["exit"])
        if self._code is None and self._ended and (self._handed_over or self.keeper.poll() is not None):
            # The keeper says nothing more (it ended, or it serves on its own now): judge by the pid.
            import psutil

            try:
                gone = psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                self._code = -9 if self.keeper.returncode in (None, 0) else int(self.keeper.returncode)
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["llama-server"], timeout or 0.0)
            time.sleep(0.02)

    def kill(self) -> None:
        import psutil

        try:
            psutil.Process(self.pid).kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass

    def hand_over(self, job: dict[str, Any]) -> None:
        """The server is up and proven: the keeper restarts it from now on."""
        assert self.keeper.stdin is not None
        self._handed_over = True
        self.keeper.stdin.write(json.dumps({"serve": job}).encode() + b"\n")
        self.keeper.stdin.flush()
        self.keeper.stdin.close()
        # Wait for the keeper's word: a server that died just now is reported, not lost.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                msg = self._messages.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg is None:
                break
            if "exit" in msg:
                self._code = int(msg["exit"])
                break
            if msg.get("serving"):
                return
        raise ActionFailed(
            "llama-server ended before its keeper took it over"
            + (f" ({exit_cause(self._code)})" if self._code is not None else ""),
            f"see the log {self.log_path}",
        )

    def release(self) -> None:
        """The front gave up (the server is stopped): let the keeper end."""
        try:
            if self.keeper.stdin is not None:
                self.keeper.stdin.close()
        except OSError:
            pass
        try:
            self.keeper.wait(15)
        except subprocess.TimeoutExpired:
            self.keeper.kill()


def spawn_kept(
    argv: Sequence[str], *, env: Mapping[str, str] | None, log_path: Path, base_url: str
) -> tuple[ServerProcess, KeptChild]:
    """Start a keeper and, through it, llama-server. Returns the server as a ServerProcess
    (to wait on, stop, read the log of) and the handle to hand it over or release it."""
    control = process_control.current()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open_append_shared(log_path) as log:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "bonsai_launch.server.keeper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            close_fds=True,
            **control.popen_options(die_with_parent=False, detached=True),
        )
    assert keeper.stdin is not None and keeper.stdout is not None
    spec = {"argv": list(argv), "env": dict(env or {}), "log_path": str(log_path), "base_url": base_url}
    keeper.stdin.write(json.dumps({"spawn": spec}).encode() + b"\n")
    keeper.stdin.flush()
    messages = _reader(_unbuffered(keeper.stdout))
    try:
        first = messages.get(timeout=60)
    except queue.Empty:
        first = None
    if not first or "pid" not in first:
        keeper.kill()
        keeper.wait(5)
        reason = (first or {}).get("error") or "the keeper process did not start it"
        raise ActionFailed(f"cannot start llama-server: {reason}", f"see the log {log_path}")
    child = KeptChild(keeper, messages, int(first["pid"]), log_path)
    server = ServerProcess(child, base_url, log_path, argv, control, None, detached=True)  # type: ignore[arg-type]
    return server, child


# -- the keeper's side -----------------------------------------------------------------------------


def _say(msg: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def main() -> int:
    from bonsai_launch.server.restart import Job, note, supervise

    stdin = _unbuffered(sys.stdin.buffer)
    first = json.loads(stdin.readline() or b"{}").get("spawn")
    if not first:
        return 2
    with SignalForwarder() as forwarder:
        try:
            # a stop during the spawn waits until `server` is set, so the finally below stops it
            with forwarder.held():
                try:
                    server = ServerProcess.spawn(
                        first["argv"],
                        env=first["env"],
                        log_path=Path(first["log_path"]),
                        base_url=first["base_url"],
                        die_with_parent=False,
                    )
                except BonsaiError as exc:
                    _say({"error": exc.message})
                    return 1
                forwarder.server = server
            _say({"pid": server.pid})
            commands = _reader(stdin)
            while True:  # until the hand-over: the front decides, the keeper relays
                if server.wait(0.05) is not None:
                    return 0  # the finally below relays its exit code
                try:
                    msg = commands.get_nowait()
                except queue.Empty:
                    continue
                if msg is None:  # the front is gone or gave up: the finally stops the server
                    return 0
                if "serve" in msg:
                    job = Job.from_json(msg["serve"])
                    _say({"serving": True})
                    break
            _detach_stdout()
            from bonsai_launch.server import prompt_sample, router_watch, traffic, watch

            watch.for_job(job)  # daemon threads: they end with the keeper
            prompt_sample.for_job(job, traffic.for_job(job))
            router_watch.for_job(job)

            def current(new: ServerProcess) -> None:
                nonlocal server
                server = forwarder.server = new

            try:
                supervise(job, server, on_server=current)
            except ActionFailed as exc:
                note(job, f"the keeper stops: {exc.message}")
                return 1
        except StopRequested:
            return 0
        finally:
            if "server" in locals():
                code = server.stop(10.0)
                if "job" not in locals():  # the front still waits on the server: say how it ended
                    _say({"exit": code if code is not None else -9})
            if "job" in locals():
                from bonsai_launch.server import instances

                instances.unregister(job.instance["name"], server.pid)
    return 0


def _detach_stdout() -> None:
    """The front has exited: nothing reads our stdout any more; send it to the log (stderr)."""
    try:
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
