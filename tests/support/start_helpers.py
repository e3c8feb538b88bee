"""Helpers for tests that run `bonsai start` (and friends) as a real subprocess.

The command runs exactly as a user runs it (`python -m bonsai_launch ...`), in the test's own
BONSAI_HOME, so signals, exit codes and the processes it leaves behind are the real ones.
Orphan checks look for processes whose command line names the test's own temporary files,
because other llama-servers may be running on the machine at the same time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from bonsai_launch.server import client, instances

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is tests/support/)


def with_pair(pair: dict[str, Path], *more: str) -> list[str]:
    """`--model T --drafter D --speculative ...`: the tiny target and drafter with speculation,
    the arguments most server tests start with."""
    return ["--model", str(pair["target"]), "--drafter", str(pair["drafter"]), "--speculative", *more]


def bonsai_env(server: Path | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if server is not None:
        env["BONSAI_LLAMA_SERVER"] = str(server)
    env.update(extra)
    return env


def bonsai(
    args: Sequence[str],
    *,
    server: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run `bonsai ARGS` to completion; stdout/stderr captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "bonsai_launch", *map(str, args)],
        env=env if env is not None else bonsai_env(server),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        stdin=subprocess.DEVNULL,
    )


class Foreground:
    """`bonsai start` running in the foreground, its output going to files."""

    def __init__(self, args: Sequence[str], server: Path, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.out_path = tmp / "start.out"
        self.err_path = tmp / "start.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bonsai_launch", "start", *map(str, args)],
                env=env or bonsai_env(server),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = 60) -> instances.Instance:
        """Until `bonsai start` says it serves; returns its instance (with the server pid)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"bonsai start exited {self.proc.returncode}:\n{self.out}\n{self.err}")
            if "press Ctrl+C to stop" in self.out:
                live = instances.running()
                assert len(live) == 1, live
                return live[0]
            time.sleep(0.05)
        raise AssertionError(f"bonsai start not serving after {timeout}s:\n{self.out}\n{self.err}")

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def gone(pid: int, timeout: float = 15) -> bool:
    """True once `pid` no longer runs (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def processes_naming(path: Path | str) -> list[psutil.Process]:
    """Live llama-servers whose command line mentions `path` (the test's own model file)."""
    needle = str(path)
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "name"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or "llama" not in (proc.info["name"] or ""):
                continue
            if any(needle in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def no_server_left(path: Path | str, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes_naming(path):
            return True
        time.sleep(0.1)
    return False


def stop_all(server: Path | None = None) -> None:
    """Safety net at the end of a test: stop whatever this BONSAI_HOME still runs."""
    for inst in instances.running():
        instances.stop(inst, timeout=5)


def json_out(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def health_ok(url: str) -> bool:
    try:
        return client.health(url).ok
    except Exception:
        return False
