"""Running a LaunchPlan: checks before spawning, readiness, proof of speculation, signals.

The plan says what to run; this module runs it and watches it:
- `preflight` makes the last checks the plan cannot (the port is free right now);
- `launch` spawns llama-server, registers it for `bonsai ps`, waits for /health with a live
  status, and, with speculation on, proves it is live with one real completion;
- `serve` waits for the server while forwarding Ctrl+C/SIGTERM/SIGHUP, and always leaves no
  process behind.
llama-server keeps serving without speculation when its drafter fails to initialise, so a
request is the only way to know; `prove_speculation` makes that request.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.log_files import open_read_shared
from bonsai_launch.core.paths import logs_dir
from bonsai_launch.server import instances, restart
from bonsai_launch.server import liveness as speculation_probe
from bonsai_launch.server.keeper import KeptChild, spawn_kept
from bonsai_launch.server.lifecycle import STOP_TIMEOUT, Lifecycle
from bonsai_launch.server.liveness import PROOF_PROMPT, PROOF_TOKENS, SpecProof, speculation_failure_reason  # noqa: F401 - re-exported
from bonsai_launch.server.plan import LaunchPlan, SpecPlan
from bonsai_launch.server.plan.router import RouterPlan
from bonsai_launch.server.process import ServerProcess, SignalForwarder, StopRequested

if TYPE_CHECKING:
    from bonsai_launch.server.liveness import SlotsProof

# -- before spawning ---------------------------------------------------------------------------


def check_port_free(host: str, port: int) -> None:
    """Bind the address for a moment: the only reliable test that llama-server can bind it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Match llama-server's own socket options so a port in TIME_WAIT is not reported busy.
        if sys.platform != "win32":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
                holder = _port_holder(port)
                raise BonsaiError(
                    f"port {port} on {host} is already in use{holder}",
                    "stop that server (`bonsai ps`, `bonsai stop`) or pick another with --port / BONSAI_PORT",
                ) from None
            raise BonsaiError(
                f"cannot bind {host}:{port}: {exc.strerror or exc}",
                "use another --host/BONSAI_HOST or --port/BONSAI_PORT",
            ) from None


def _port_holder(port: int) -> str:
    for inst in instances.running():
        if inst.port == port:
            return f" by bonsai server {inst.name!r} (pid {inst.pid})"
    return ""


def preflight(plan: LaunchPlan | RouterPlan) -> None:
    """Checks the pure plan cannot make. Model, drafter and capability checks already ran in
    gather_plan; each failure here is one message with the fix, in milliseconds."""
    check_port_free(plan.host, plan.port)


# -- speculation proof ---------------------------------------------------------------------------


def prove_speculation(
    base_url: str, spec: SpecPlan, log_path: Path | None = None, api_key: str | None = None
) -> SpecProof:
    """Probe a freshly started server; live only when the probe drafted tokens (the one
    rule of bonsai_launch.server.liveness, shared with verify and bench)."""
    return speculation_probe.prove(base_url, spec.spec_type, spec.n_max, log_path, api_key)


# -- launching -----------------------------------------------------------------------------------


def log_path_for(name: str) -> Path:
    """logs/<name>.log; the previous run's log is kept as <name>.log.1."""
    path = logs_dir() / f"{name}.log"
    if path.exists():
        try:
            path.replace(path.with_name(path.name + ".1"))
        except OSError:
            pass
    return path


@dataclass
class Launched:
    server: ServerProcess
    instance: instances.Instance
    ready_s: float  # from spawn to /health 200
    proof: SpecProof | None
    slots_proof: SlotsProof | None = None  # with several slots: concurrent requests, each drafted
    job: restart.Job | None = None  # how to restart it (None: restarts off)


def launch(
    plan: LaunchPlan | RouterPlan,
    *,
    detach: bool = False,
    spec_fallback: bool = False,
    on_status: Callable[[str], None] | None = None,
    forwarder: SignalForwarder | None = None,
    ready_timeout: float = 600.0,
    cores: tuple[int, ...] = (),
    name: str | None = None,
) -> Launched:
    """Spawn, register, wait until ready, prove speculation. On any failure the server is
    stopped and unregistered before the error propagates. With restarts on (BONSAI_RESTART), a
    detached server is spawned by its keeper (server/keeper.py), which restarts it later;
    `cores` is the CPU affinity a restarted server gets again (fleet replicas)."""
    preflight(plan)
    policy = restart.policy_from_env()
    router = plan.watch_json() if isinstance(plan, RouterPlan) else None
    name = name or instances.unique_name(plan.profile or Path(plan.model).stem, plan.port)
    log_path = log_path_for(name)
    kept: list[KeptChild] = []

    def spawner(argv, *, env, log_path, base_url, die_with_parent) -> ServerProcess:
        # its keeper is its parent, to restart it later, and a router's to unload idle models
        if detach and (policy.enabled or router is not None):
            server, keeper = spawn_kept(argv, env=env, log_path=log_path, base_url=base_url)
            kept.append(keeper)
            return server
        return ServerProcess.spawn(argv, env=env, log_path=log_path, base_url=base_url, die_with_parent=die_with_parent)

    life = Lifecycle(
        plan.argv, env=plan.env, log_path=log_path, base_url=plan.base_url, die_with_parent=not detach, spawner=spawner
    )
    server: ServerProcess | None = None
    ok = False
    try:
        # A stop during the spawn is acted on once the forwarder knows the server, inside this
        # try, so the server it started is stopped and the exit says a server was stopped.
        with forwarder.held() if forwarder is not None else nullcontext():
            server = life.spawn()
            if forwarder is not None:
                forwarder.server = server
        watcher = kept[0].keeper.pid if kept else (None if detach else _own_pid())
        inst = instances.Instance(
            name=name,
            pid=server.pid,
            create_time=instances.process_create_time(server.pid) or time.time(),
            host=plan.host,
            port=plan.port,
            base_url=plan.base_url,
            profile=plan.profile,
            model=plan.model,
            log_path=str(log_path),
            started_at=time.time(),
            detached=detach,
            speculative=False,
            spec_type=plan.speculative.spec_type if plan.speculative else None,
            supervisor_pid=watcher,
            api_key_required=bool(plan.env.get("LLAMA_API_KEY")),
            argv=plan.argv,
            tuning=getattr(plan, "tuning", None),
            supervisor_create_time=instances.process_create_time(watcher) if watcher else None,
            supervised=policy.enabled,
            router=router,
        )
        instances.register(inst)
        ready_s = life.wait_ready(ready_timeout, on_status)
        proof = slots_proof = None
        if plan.speculative is not None:
            if on_status:
                on_status("checking speculative decoding")
            proof = life.prove(plan.speculative, plan.api_key)
            if not proof.live and not spec_fallback:
                raise ActionFailed(
                    proof.summary(),
                    "fix the drafter or its settings, or pass --spec-fallback to serve without speculation",
                )
            slots_proof = _prove_slots(plan, proof, spec_fallback)
            if proof.live:
                instances.update(name, speculative=True)
                inst = instances.load(instances.state_path(name)) or inst
        life.running()
        job = _job(plan, inst, policy, detach, cores) if policy.enabled or router is not None else None
        if kept and job is not None:
            kept[0].hand_over(job.to_json())
        ok = True
        return Launched(server, inst, ready_s, proof, slots_proof, job)
    finally:
        if not ok and server is not None:
            life.stop(STOP_TIMEOUT)
            instances.unregister(name, server.pid)
            if kept:
                kept[0].release()


def _job(
    plan: LaunchPlan | RouterPlan,
    inst: instances.Instance,
    policy: restart.RestartPolicy,
    detach: bool,
    cores: tuple[int, ...],
) -> restart.Job:
    spec = plan.speculative
    return restart.Job(
        instance=inst.to_json(),
        argv=list(plan.argv),
        env=dict(plan.env),
        spec_type=spec.spec_type if spec is not None and inst.speculative else None,
        n_max=spec.n_max if spec is not None else None,
        api_key=plan.api_key,
        cores=list(cores),
        die_with_parent=not detach,
        policy=policy,
        watch=_watch_bounds(plan) if spec is not None and inst.speculative else {},
        sample=dict(plan.prompt_sample or {}),
        router=dict(inst.router or {}),
    )


def _watch_bounds(plan: LaunchPlan | RouterPlan) -> dict:
    """The BONSAI_WATCH_SECONDS family of settings, and the plain speed of the decision it runs (server/watch.py)."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.server.watch import Bounds, plain_speed

    return Bounds.from_settings(resolve({}), plain_speed(getattr(plan, "tuning", None))).to_json()


def _prove_slots(plan: LaunchPlan | RouterPlan, proof: SpecProof, spec_fallback: bool) -> SlotsProof | None:
    """With several slots, speculation must draft on more than one of them at once."""
    from bonsai_launch.server.liveness import prove_slots

    count = plan.slots.count if plan.slots is not None else None
    if not proof.live or plan.speculative is None or not count or count < 2:
        return None
    result = prove_slots(plan.base_url, plan.speculative, count, PROOF_TOKENS, plan.env.get("LLAMA_API_KEY"))
    if not result.live and not spec_fallback:
        raise ActionFailed(
            result.summary(), "use one slot (BONSAI_PARALLEL=1), or pass --spec-fallback to serve anyway"
        )
    return result


def _own_pid() -> int:
    import os

    return os.getpid()


def serve(launched: Launched, *, poll: float = 0.25, forwarder: SignalForwarder | None = None) -> int:
    """Wait while the server runs, restarting it when it dies on its own (server/restart.py).
    Returns 0 when the user stopped it (StopRequested is caught here); raises ActionFailed with
    the log tail when it exits with code 0, restarts are off, or on a crash loop."""

    def current(server: ServerProcess) -> None:
        launched.server = server
        if forwarder is not None:
            forwarder.server = server

    job = launched.job or restart.Job(launched.instance.to_json(), [], {}, policy=restart.RestartPolicy(False))
    observers: list = []  # filled inside the try: a stop signal at any point still shuts the server down
    try:
        # Loaded here, after the spawn: the start path imports nothing it needs only while serving.
        from bonsai_launch.server import prompt_sample, router_watch, traffic, watch

        observers += [
            watch.for_job(job, restart.stderr_event),
            prompt_sample.for_job(job, traffic.for_job(job)),
            router_watch.for_job(job),
        ]
        restart.supervise(job, launched.server, on_server=current, on_event=restart.stderr_event, poll=poll)
        return 1  # not reached: supervise only ends by raising
    except StopRequested:
        return 0
    finally:
        for observer in observers:
            if observer is not None:
                observer.stop()
        shutdown(launched)


def report_then_serve(
    launched: Launched, report: Callable[[], None], *, detach: bool, forwarder: SignalForwarder
) -> int:
    """What start and serve do once their server is up: `report` it, then return (detached) or
    keep it running in the foreground until the user stops it. A stop, or a failure while
    reporting (a closed stdout), never leaves a foreground server unwatched."""
    try:
        report()
    except BaseException as exc:
        if not detach or isinstance(exc, StopRequested):
            shutdown(launched)
        if isinstance(exc, StopRequested):
            return 0
        raise
    if detach:
        return 0
    return serve(launched, forwarder=forwarder)


def shutdown(launched: Launched) -> None:
    """Stop a launched server and forget it."""
    try:
        launched.server.stop(STOP_TIMEOUT)
    except StopRequested:  # the one stop request arrived in the middle of stopping: finish
        launched.server.stop(STOP_TIMEOUT)
    instances.unregister(launched.instance.name, launched.server.pid)


def follow(path: Path, *, offset: int = 0, alive: Callable[[], bool] | None = None, poll: float = 0.2) -> Iterator[str]:
    """Yield lines of a growing log file from byte `offset` (like `tail -f`) until `alive()`
    turns false; then the rest of the file is yielded."""
    with open_read_shared(path) as f:  # Windows: the next start may still rotate the log
        f.seek(offset)
        buffer = b""
        while True:
            chunk = f.read()
            if chunk:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
                continue
            if alive is not None and not alive():
                if buffer:
                    yield buffer.decode("utf-8", "replace")
                return
            time.sleep(poll)
