"""The members of a fleet: what `fleet up` is asked for (UpOptions), local replicas (each a detached
`bonsai start` with its share of GPUs or cores) and remote hosts from a fleet file. Waiting for a
remote member to answer is fleet/health.py's (wait_reach)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.fleet import hosts
from bonsai_launch.fleet.state import MemberState

DEFAULT_PROXY_PORT = 4000  # LiteLLM's own default


REMOTE_WAIT_S = 60.0  # how long a remote member may take to answer /health 200


@dataclass(frozen=True)
class UpOptions:
    flags: dict[str, Any]  # `bonsai start` flags (profile, speculative, ctx, ...); port is set per replica
    replicas: int | None  # None: not given (2 for a new fleet; a running fleet keeps its own)
    gpus: list[str] | None = None
    threads: int | None = None
    port: int = DEFAULT_PROXY_PORT
    hosts_file: Path | None = None
    passthrough: tuple[str, ...] = ()
    remote_wait_s: float = REMOTE_WAIT_S
    allow_down: bool = False  # start even when remote members are unreachable or refuse their key


Status = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def launch_replica(member: MemberState, status: Status):
    """Start one local replica as `bonsai start --detach` does. Returns supervisor.Launched."""
    from bonsai_launch.server import supervisor
    from bonsai_launch.server.prepare import prepare_plan

    plan, _ = prepare_plan(member.flags, None, None, tuple(member.args))
    if member.env:
        plan = plan.with_env(member.env)
    status(f"{member.name}: starting llama-server on port {plan.port} ({member.share})")
    launched = supervisor.launch(
        plan,
        detach=True,
        spec_fallback=False,
        on_status=lambda s: status(f"{member.name}: {s}"),
        cores=tuple(member.cores or ()),  # its keeper pins a restarted server again
    )
    if member.cores:
        hosts.pin_threads(launched.server.pid, tuple(member.cores))
    member.instance = launched.instance.name
    member.pid = launched.server.pid
    member.url = plan.base_url
    member.argv = list(plan.argv)
    member.parallel = max(1, plan.slots.count or 1) if plan.slots else 1  # the plan's -np (llama-server's 1 when auto)
    if plan.env.get("LLAMA_API_KEY"):
        member.api_key_env = "BONSAI_API_KEY"  # the replicas' key is the user's BONSAI_API_KEY
    return launched


def local_alive(member: MemberState) -> bool:
    from bonsai_launch.server import instances

    # By name: a replica that crashed and was restarted by its keeper has a new pid.
    return any(i.name == member.instance for i in instances.running())


def replica_members(opts: UpOptions, replicas: int, backend: str) -> list[MemberState]:
    shares = hosts.replica_shares(
        replicas,
        backend,
        gpus=opts.gpus,
        threads=opts.threads,
        cpus=hosts.usable_cpus(),
        pin=sys.platform.startswith("linux"),
    )
    members = []
    for i, share in enumerate(shares):
        port = opts.port + 1 + i
        flags = {**opts.flags, "port": port, "host": "127.0.0.1"}
        args = [*share.args, *opts.passthrough]  # the plan adds --metrics, which `fleet ps` reads
        members.append(
            MemberState(
                name=f"replica-{i + 1}",
                url=f"http://127.0.0.1:{port}",
                local=True,
                flags=flags,
                args=args,
                env=dict(share.env),
                share=share.label,
                cores=list(share.cores),
            )
        )
    return members


def replica_backend(opts: UpOptions) -> str:
    """The llama.cpp backend the replicas will run on (decides GPUs versus a CPU split). The
    first replica's plan, as `bonsai start` makes it: this also builds llama-server and fetches
    the profile's files when they are missing, once, before any replica starts."""
    from bonsai_launch.server.prepare import prepare_plan

    plan, _ = prepare_plan({**opts.flags, "port": opts.port + 1, "host": "127.0.0.1"}, None, None, opts.passthrough)
    return plan.backend


def remote_members(path: Path | None) -> list[MemberState]:
    if path is None:
        return []
    return [
        MemberState(
            name=m.name, url=m.url, local=False, api_key_env=m.api_key_env, parallel=m.parallel, timeout=m.timeout
        )
        for m in hosts.parse_fleet_file(path)
    ]
