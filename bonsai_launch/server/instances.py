"""Running servers bonsai knows about: one small JSON state file each under paths.run_dir().

Both foreground (`bonsai start`) and detached (`bonsai start --detach`) servers register here,
so `bonsai ps`, `bonsai run` and `bonsai stop` find them. A state file is only a claim: it is
trusted only while its pid is alive, is a llama-server, and has the recorded creation time
(pids are reused). Anything else is stale and is removed on sight.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core import process_control
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.log_files import open_read_shared, replace_retrying
from bonsai_launch.core.paths import run_dir
from bonsai_launch.server.lifecycle import State
from bonsai_launch.server.process import RESEND_AFTER

CREATE_TIME_SLACK = 1.0  # seconds; psutil's create_time is rounded by the kernel's clock ticks


@dataclass(frozen=True)
class Instance:
    name: str
    pid: int
    create_time: float  # psutil's create_time of pid, to tell a reused pid apart
    host: str
    port: int
    base_url: str
    profile: str | None
    model: str
    log_path: str
    started_at: float
    detached: bool
    speculative: bool  # proven live (not merely requested)
    spec_type: str | None = None
    supervisor_pid: int | None = None  # the `bonsai start` process watching it, if foreground
    api_key_required: bool = False
    argv: tuple[str, ...] = field(default_factory=tuple)
    tuning: dict[str, Any] | None = None  # BONSAI_SPECULATIVE=auto: the decision it runs (tune/auto.py)
    # Restarts (server/restart.py): the process restarting this server when it dies (a foreground
    # `bonsai start`, or the keeper of a detached one), how often it did, and the last cause.
    supervisor_create_time: float | None = None
    supervised: bool = False  # restarted when it dies (BONSAI_RESTART)
    restarts: int = 0
    last_exit: str | None = None  # `was killed by signal 9 (...)`
    last_exit_at: float | None = None
    state: str = State.RUNNING.value  # "restarting" between a crash and the new server's /health 200
    watch: dict[str, Any] | None = None  # whether speculation still pays on its work (server/watch.py)
    router: dict[str, Any] | None = None  # `bonsai serve`: its models and their policies (router_watch.py)
    traffic: dict[str, Any] | None = None  # auto re-decided from its own traffic (server/traffic.py)

    @property
    def uptime(self) -> float:
        return max(0.0, time.time() - self.started_at)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["uptime_s"] = round(self.uptime, 1)
        return data


def state_path(name: str) -> Path:
    return run_dir() / f"{name}.json"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    replace_retrying(tmp, path)  # Windows: a reader may hold the old file for a moment


def process_create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _matches(inst: Instance) -> bool:
    """Is the recorded process still the llama-server we started?"""
    import psutil

    try:
        proc = psutil.Process(inst.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if abs(proc.create_time() - inst.create_time) > CREATE_TIME_SLACK:
            return False
        name = proc.name().lower()
        exe_name = Path(inst.argv[0]).name.lower() if inst.argv else "llama-server"
        return "llama-server" in name or name == exe_name[:15] or exe_name.startswith(name)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def register(inst: Instance) -> Path:
    path = state_path(inst.name)
    write_atomic(path, json.dumps(inst.to_json(), indent=2) + "\n")
    return path


def update(name: str, **changes: Any) -> None:
    inst = load(state_path(name))
    if inst is not None:
        data = inst.to_json()
        data.update(changes)
        write_atomic(state_path(name), json.dumps(data, indent=2) + "\n")


def unregister(name: str, pid: int | None = None) -> None:
    """Remove a state file; with `pid`, only if it still describes that process."""
    path = state_path(name)
    if pid is not None:
        inst = load(path)
        if inst is not None and inst.pid != pid:
            return
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def load(path: Path) -> Instance | None:
    try:
        with open_read_shared(path) as f:  # never blocks a writer's replace on Windows
            data = json.loads(f.read().decode("utf-8"))
        data.pop("uptime_s", None)
        data["argv"] = tuple(data.get("argv") or ())
        known = Instance.__dataclass_fields__
        return Instance(**{k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None


def _alive(inst: Instance) -> bool:
    """Its server runs, or died and is being restarted (its supervisor lives)."""
    return _matches(inst) or _supervisor(inst, include_self=True) is not None


def running() -> list[Instance]:
    """Live instances, oldest first. Stale or unreadable state files are deleted."""
    found: list[Instance] = []
    folder = run_dir()
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.json")):
        inst = load(path)
        if inst is None or not _alive(inst):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            continue
        found.append(inst)
    return sorted(found, key=lambda i: i.started_at)


def unique_name(base: str, port: int) -> str:
    """The profile's name, or name-port when that name is already taken by a live server."""
    base = base.replace(os.sep, "_") or "server"
    if not state_path(base).exists():
        return base  # the usual case, decided without psutil (this runs before every spawn)
    taken = {i.name for i in running()}
    return base if base not in taken else f"{base}-{port}"


def find(selector: str | None) -> Instance:
    """The instance a user means: by name, port, or pid; the only one when not given."""
    live = running()
    if not live:
        raise BonsaiError("no server started by bonsai is running", "start one with `bonsai start --detach`")
    if selector is None:
        if len(live) == 1:
            return live[0]
        raise BonsaiError(
            f"{len(live)} servers are running ({', '.join(i.name for i in live)})", "name one of them, or use --all"
        )
    for inst in live:
        if selector in (inst.name, str(inst.port), str(inst.pid)):
            return inst
    raise BonsaiError(
        f"no running server is called {selector!r} (running: {', '.join(i.name for i in live)})", "see `bonsai ps`"
    )


def for_profile(profile: str | None) -> Instance | None:
    for inst in running():
        if inst.profile == profile:
            return inst
    return None


def serving(argv: Sequence[str], api_key_required: bool) -> Instance | None:
    """A live server started with exactly this llama-server command line (and a key, or none, as
    asked): what a second `bonsai start --detach` of the same settings finds already up. Runs
    before the spawn: only a state file of this command line is checked for life (psutil)."""
    folder = run_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        inst = load(path)
        if inst is None or inst.argv != tuple(argv) or inst.api_key_required != api_key_required:
            continue
        if _alive(inst):  # psutil only for a state file of this command line
            return inst
    return None


def _wait_gone(proc, timeout: float) -> bool:
    """Wait until `proc` has exited. A zombie counts as gone: a detached server's parent is
    init (or a container's PID 1), which may take its time to reap it."""
    import psutil

    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _supervisor(inst: Instance, include_self: bool = False):
    """The live process watching this server (a foreground `bonsai start`, or the keeper of a
    detached one), or None."""
    import psutil

    if not inst.supervisor_pid or (inst.supervisor_pid == os.getpid() and not include_self):
        return None
    try:
        sup = psutil.Process(inst.supervisor_pid)
        if sup.status() == psutil.STATUS_ZOMBIE:
            return None
        if inst.supervisor_create_time is not None:
            if abs(sup.create_time() - inst.supervisor_create_time) > CREATE_TIME_SLACK:
                return None  # a reused pid
        elif sup.create_time() > inst.create_time + CREATE_TIME_SLACK:
            return None  # it started before the server it spawned; a reused pid would be younger
        return sup
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def stop(inst: Instance, timeout: float = 10.0, control: process_control.ProcessControl | None = None) -> bool:
    """Ask the server to exit, wait (bounded), then end it. True when it is gone.

    POSIX: SIGTERM to its group, SIGKILL at the end. Windows: TerminateProcess, since a
    console event may only be sent to a group started in our own console (process_control).
    """
    import psutil

    control = control or process_control.current()
    supervisor = _supervisor(inst)
    if supervisor is not None:
        # A supervisor watches this server (a foreground `bonsai start`, or a detached one's
        # keeper): ask it to stop, so that it stops the server on purpose, never restarts it,
        # and a foreground one exits 0 as for Ctrl+C. (On Windows this is TerminateProcess of
        # that process; a foreground one's Job Object then ends the server.)
        try:
            supervisor.terminate()
        except psutil.NoSuchProcess:
            pass
        _wait_gone(supervisor, timeout + 5)
        # then make sure the server is gone too (a keeper killed on Windows leaves it)
    if not _matches(inst):
        unregister(inst.name)
        return True
    try:
        proc = psutil.Process(inst.pid)
        sent = control.request_stop(inst.pid, shares_console=False)
        resend = min(timeout, RESEND_AFTER)
        if sent and not _wait_gone(proc, resend) and timeout > resend:
            # A SIGTERM that lands just as llama-server finishes loading can be lost: resend.
            control.request_stop(inst.pid, shares_console=False)
        if not sent or not _wait_gone(proc, max(0.0, timeout - resend)):
            control.force_stop(inst.pid)
            if not _wait_gone(proc, 5):
                return False
    except psutil.NoSuchProcess:
        pass
    unregister(inst.name)
    return True
