"""One llama-server's life, in named states; every command that runs one goes through it.

    STOPPED -> STARTING (spawned, /health not 200 yet) -> PROVING (speculation being proven live)
            -> RUNNING (serving) -> STOPPING -> STOPPED
    RUNNING -> RESTARTING (it died on its own; server/restart.py brings up the next one)

`bonsai start` and `serve` (server/supervisor.py), a restart after a crash (server/restart.py),
each configuration bench and tune measure (bench/servers.py) and the build self-test
(server/selftest_checks.py) spawn, wait and prove through `Lifecycle`, so a server that dies while
loading gets one message (its exit cause, the hint for it, the log's last lines) wherever it
happens, and a failed start never leaves a process behind.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from bonsai_launch.server.process import ServerProcess, StopRequested

if TYPE_CHECKING:
    from bonsai_launch.server.liveness import SpecProof
    from bonsai_launch.server.plan import SpecPlan

STOP_TIMEOUT = 10.0


class State(enum.StrEnum):
    """A server's state, as `bonsai ps` shows it (the value is what its state file holds)."""

    STOPPED = "stopped"
    STARTING = "starting"
    PROVING = "proving"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"


Spawner = Callable[..., ServerProcess]  # ServerProcess.spawn's signature: (argv, *, env, log_path, base_url, ...)


class Lifecycle:
    """One llama-server command line brought up, proven and stopped, possibly several times (a
    restart spawns the same command again). `on_state` hears every change of state."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        log_path: Path,
        base_url: str,
        die_with_parent: bool = True,
        spawner: Spawner | None = None,
        on_state: Callable[[State], None] | None = None,
    ) -> None:
        self.argv = tuple(argv)
        self.env = dict(env or {})
        self.log_path = log_path
        self.base_url = base_url
        self.die_with_parent = die_with_parent
        self._spawner = spawner or ServerProcess.spawn
        self._on_state = on_state
        self.state = State.STOPPED
        self.server: ServerProcess | None = None
        self.spawned_at = 0.0

    def _enter(self, state: State) -> None:
        self.state = state
        if self._on_state is not None:
            self._on_state(state)

    def spawn(self) -> ServerProcess:
        """STARTING: the process exists; nothing is known about its health yet."""
        self.spawned_at = time.monotonic()
        self.server = self._spawner(
            self.argv,
            env=self.env,
            log_path=self.log_path,
            base_url=self.base_url,
            die_with_parent=self.die_with_parent,
        )
        self._enter(State.STARTING)
        return self.server

    def wait_ready(self, timeout: float, on_status: Callable[[str], None] | None = None) -> float:
        """Until /health answers 200; seconds since the spawn. Raises ActionFailed (the exit cause,
        its hint and the log's last lines) when it dies first or does not answer in time; the
        process is left to the caller (`stop`, or a restart counts it as one exit)."""
        assert self.server is not None, "spawn first"
        self.server.wait_ready(timeout, on_status)
        return time.monotonic() - self.spawned_at

    def prove(self, spec: SpecPlan, api_key: str | None) -> SpecProof:
        """PROVING: one real completion must draft tokens (server/liveness.py's rule)."""
        from bonsai_launch.server import liveness

        self._enter(State.PROVING)
        return liveness.prove(self.base_url, spec.spec_type, spec.n_max, self.log_path, api_key)

    def running(self) -> None:
        self._enter(State.RUNNING)

    def restarting(self) -> None:
        self._enter(State.RESTARTING)

    def start(
        self,
        timeout: float,
        *,
        spec: SpecPlan | None = None,
        api_key: str | None = None,
        on_status: Callable[[str], None] | None = None,
    ) -> tuple[float, SpecProof | None]:
        """Spawn, wait until ready, prove speculation when `spec` is given; (ready seconds, proof).
        Any failure, a stop request included, stops the process before it propagates."""
        ok = False
        try:
            self.spawn()
            ready_s = self.wait_ready(timeout, on_status)
            proof = self.prove(spec, api_key) if spec is not None else None
            self.running()
            ok = True
            return ready_s, proof
        finally:
            if not ok:
                self.stop()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """STOPPING, then STOPPED: asked politely, ended if it does not go (server/process.py)."""
        if self.server is None:
            return None
        self._enter(State.STOPPING)
        try:
            code = self.server.stop(timeout)
        except StopRequested:  # the one stop request arrived in the middle of stopping: finish
            code = self.server.stop(timeout)
        self._enter(State.STOPPED)
        return code

    def __enter__(self) -> Lifecycle:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
