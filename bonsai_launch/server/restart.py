"""Restarting a llama-server that died on its own.

A server that aborts (a GGML_ASSERT), is killed (the out-of-memory killer, `kill -9`) or exits
with an error while serving is started again: the same command line on the same port, after a
short backoff, and the speculation proof runs again. The foreground `bonsai start` runs this
loop itself; a detached server's loop runs in its keeper (server/keeper.py). What is never a
crash: a stop the user asked for (Ctrl+C, SIGTERM/SIGHUP to bonsai, `bonsai stop`, which stops
the supervisor first) and an exit with code 0 (llama-server's answer to a polite SIGTERM/SIGINT
from anyone). A crash loop (`max_exits` exits within `window_s`) ends with one message naming
the log. BONSAI_RESTART=0 turns all of it off.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.core.log_files import append_note
from bonsai_launch.server import instances
from bonsai_launch.server.lifecycle import Lifecycle, State
from bonsai_launch.server.process import ServerProcess, exit_cause

Event = Callable[[str], None]


@dataclass(frozen=True)
class RestartPolicy:
    enabled: bool = True
    max_exits: int = 5  # this many unexpected exits within window_s is a crash loop
    window_s: float = 60.0
    backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0)  # before the 1st, 2nd, ... restart in a row
    ready_timeout: float = 600.0  # a restart that does not answer /health 200 by then counts as an exit

    def delay(self, recent_exits: int) -> float:
        return self.backoff_s[min(max(recent_exits, 1), len(self.backoff_s)) - 1]


def policy_from_env(env: Mapping[str, str] | None = None) -> RestartPolicy:
    """BONSAI_RESTART, through the settings registry (a bad value is refused there)."""
    from bonsai_launch.config.settings import read_env

    return RestartPolicy(enabled=bool(read_env(env).get("restart", True)))


@dataclass
class Job:
    """What restarting a server needs; plain data, so a keeper can receive it as JSON."""

    instance: dict[str, Any]  # the Instance as registered (to_json)
    argv: list[str]
    env: dict[str, str]
    spec_type: str | None = None  # the speculation proof's parameters; None: plain
    n_max: int | None = None
    api_key: str | None = None
    cores: list[int] = field(default_factory=list)  # CPU affinity of the server (fleet replicas)
    die_with_parent: bool = True  # False for a detached server: it outlives its keeper
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    watch: dict[str, Any] = field(default_factory=dict)  # watch.Bounds as JSON; empty: no watch
    sample: dict[str, Any] = field(default_factory=dict)  # prompt_sample's limit, every_s, path; empty: off
    router: dict[str, Any] = field(default_factory=dict)  # a router's models and their policies (router_watch.py)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["policy"]["backoff_s"] = list(self.policy.backoff_s)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        policy = dict(data.get("policy") or {})
        policy["backoff_s"] = tuple(policy.get("backoff_s") or RestartPolicy.backoff_s)
        return cls(**{**data, "policy": RestartPolicy(**policy)})

    @property
    def log_path(self) -> Path:
        return Path(self.instance["log_path"])


def note(job: Job, text: str, on_event: Event | None = None, more: str = "") -> None:
    """A line in the server's own log (what `bonsai logs` shows), and to the user if watching;
    `more` (the log's last lines) only to the user: in the log they are just above."""
    append_note(job.log_path, text)
    if on_event is not None:
        on_event(text + more)


def pin(pid: int, cores: list[int]) -> None:
    """Hold the new server's threads to `cores`, as the fleet pinned the first one (Linux)."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:
            pass


def _wait_exit(server: ServerProcess, poll: float) -> int:
    """Block until the server exits (in slices, so a stop signal is handled at once)."""
    while True:
        code = server.wait(poll)
        if code is not None:
            return code


def record(job: Job, **changes: Any) -> None:
    """Change the registered instance (what `bonsai ps` reads) and the job's copy of it."""
    job.instance.update(changes)
    data = {k: v for k, v in job.instance.items() if k != "uptime_s"}
    data["argv"] = tuple(data.get("argv") or ())
    known = instances.Instance.__dataclass_fields__
    instances.register(instances.Instance(**{k: v for k, v in data.items() if k in known}))


def _prove(job: Job, life: Lifecycle, on_event: Event | None) -> bool:
    from bonsai_launch.server.plan import SpecPlan

    if job.spec_type is None:
        return False
    try:
        proof = life.prove(SpecPlan(job.spec_type, job.n_max), job.api_key)
    except Exception as exc:  # a failed probe must not end a server that serves
        note(job, f"the speculation proof after the restart failed: {exc}", on_event)
        return False
    if not proof.live:
        note(job, f"after the restart: {proof.summary()}; serving without it", on_event)
    return proof.live


def supervise(
    job: Job,
    server: ServerProcess,
    *,
    on_server: Callable[[ServerProcess], None] = lambda s: None,
    on_event: Event | None = None,
    poll: float = 0.25,
) -> None:
    """Watch `server`; restart it after each unexpected exit until a crash loop.

    Never returns normally: raises ActionFailed (with the log tail) when the server exits with
    code 0, when restarts are off, or on a crash loop. A stop request (StopRequested, raised by
    the caller's signal handler) passes through at any point; `on_server` is told each new
    server at once, so that the caller always stops the current one."""
    policy = job.policy
    exits: deque[float] = deque()
    port = job.instance.get("port")
    while True:
        code = _wait_exit(server, poll)
        if code == 0 or not policy.enabled:
            raise ActionFailed(server.exit_message("while serving"), f"full log: {server.log_path}")
        now = time.monotonic()
        exits.append(now)
        while exits and now - exits[0] > policy.window_s:
            exits.popleft()
        cause = exit_cause(code)
        tail = "\n".join("  " + line for line in server.log_tail(12)) or "  (the log is empty)"
        record(job, state=State.RESTARTING.value, last_exit=cause, last_exit_at=time.time())
        if len(exits) >= policy.max_exits:
            message = (
                f"llama-server {cause}: {len(exits)} unexpected exits within {policy.window_s:.0f} s, "
                f"a crash loop; not restarting it again. Log: {job.log_path}"
            )
            note(job, message)
            instances.unregister(job.instance["name"])
            raise ActionFailed(f"{message}\nlast log lines:\n{tail}", f"see the log {job.log_path}")
        delay = policy.delay(len(exits))
        note(
            job,
            f"llama-server {cause} while serving; restarting it on port {port} in {delay:.0f} s "
            f"(exit {len(exits)} within {policy.window_s:.0f} s; exit {policy.max_exits} ends the restarts)",
            on_event,
            f"; last log lines:\n{tail}",
        )
        time.sleep(delay)
        life = Lifecycle(
            job.argv,
            env=job.env,
            log_path=job.log_path,
            base_url=job.instance["base_url"],
            die_with_parent=job.die_with_parent,
        )
        server = life.spawn()
        on_server(server)
        pin(server.pid, job.cores)
        try:
            ready_s = life.wait_ready(policy.ready_timeout)
        except ActionFailed:
            if server.alive():  # not ready in time: end it; the loop counts it as an exit
                server.kill()
                server.wait(10)
            continue
        live = _prove(job, life, on_event)
        life.running()
        record(
            job,
            pid=server.pid,
            create_time=instances.process_create_time(server.pid) or time.time(),
            started_at=time.time(),
            speculative=live,
            restarts=int(job.instance.get("restarts") or 0) + 1,
            state=State.RUNNING.value,
        )
        note(
            job,
            f"restarted: llama-server pid {server.pid} serves on port {port} again "
            f"(ready in {ready_s:.1f} s, restart {job.instance['restarts']})"
            + ("; speculative decoding live" if live else ""),
            on_event,
        )


def stderr_event(text: str) -> None:
    sys.stderr.write(f"bonsai: {text}\n")
    sys.stderr.flush()
