"""`bonsai fleet up | ps | down` as library calls; the CLI only renders what these return.

A fleet is N local replicas (each a detached `bonsai start`: own port, log and state,
speculation proven as `start` proves it), plus remote members from a fleet file, behind one
LiteLLM proxy on loopback. Only members that answer /health 200 join the proxy's config; a
member that never becomes healthy is reported and left out. `up` on a running fleet restarts
what died (same ports, same settings) and leaves the rest alone; `down` stops everything and
checks that nothing is left.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.fleet import configs, health, probe, proxy
from bonsai_launch.fleet import state as fleet_state
from bonsai_launch.fleet.members import (
    DEFAULT_PROXY_PORT,
    Status,
    UpOptions,
    launch_replica,
    local_alive,
    quiet,
    remote_members,
    replica_backend,
    replica_members,
)
from bonsai_launch.fleet.state import FleetState, MemberState, ProxyState


@dataclass
class UpResult:
    url: str
    api_key: str | None  # None when a running proxy was kept (its key was shown when it started)
    key_source: str  # "generated", "BONSAI_API_KEY" or "unchanged"
    model: str
    members: list[dict[str, Any]]
    excluded: list[dict[str, str]]
    config: str
    llama_swap: str
    restarted: list[str] = field(default_factory=list)
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "openai_base_url": self.url + "/v1",
            "api_key": self.api_key,
            "key_source": self.key_source,
            "model": self.model,
            "members": self.members,
            "excluded": self.excluded,
            "config": self.config,
            "llama_swap": self.llama_swap,
            "restarted": self.restarted,
            "reused": self.reused,
        }


# -- local replicas --------------------------------------------------------------------------------


# -- remote members ----------------------------------------------------------------------------------


# -- configs and the proxy -----------------------------------------------------------------------------


def _write_configs(model: str, members: list[MemberState]) -> tuple[Path, Path]:
    import yaml

    routed = [
        configs.Member(m.name, m.url, m.local, m.api_key_env, tuple(m.argv), dict(m.env), m.parallel, m.timeout)
        for m in members
    ]
    folder = fleet_state.fleet_dir()
    litellm_path, swap_path = folder / "litellm.yaml", folder / "llama-swap.yaml"
    header = "# written by `bonsai fleet up`; the master key comes from the environment, never this file\n"
    fleet_state.write_atomic(
        litellm_path, header + yaml.safe_dump(configs.litellm_config(model, routed), sort_keys=False)
    )
    swap = configs.llama_swap_config(model, routed)
    problems = configs.llama_swap_problems(swap)
    if problems:  # our own bug, never the user's: say so rather than write a file llama-swap rejects
        raise ActionFailed("internal: the llama-swap config has undocumented keys: " + "; ".join(problems))
    fleet_state.write_atomic(
        swap_path,
        "# for llama-swap users (written by `bonsai fleet up`, not run by it)\n"
        + yaml.safe_dump(swap, sort_keys=False),
    )
    return litellm_path, swap_path


def _master_key() -> tuple[str, str]:
    from bonsai_launch.config.settings import env_value

    given = (env_value("api_key") or "").strip()  # BONSAI_API_KEY, through the settings registry
    if given:
        return given, "BONSAI_API_KEY"
    return "sk-" + secrets.token_urlsafe(24), "generated"


def _start_proxy(model: str, config: Path, port: int, status: Status) -> tuple[ProxyState, str, str]:
    from bonsai_launch.server import instances
    from bonsai_launch.server.supervisor import check_port_free, log_path_for

    exe = proxy.require_litellm()
    check_port_free("127.0.0.1", port)
    key, source = _master_key()
    status(f"starting the LiteLLM proxy on 127.0.0.1:{port}")
    server = proxy.spawn(exe, config, port, key, log_path_for("fleet-proxy"))
    st = ProxyState(
        server.pid,
        instances.process_create_time(server.pid) or time.time(),
        "127.0.0.1",
        port,
        str(server.log_path),
        str(config),
    )
    try:
        proxy.wait_ready(server)
        _check_routes(st.url, key, model)
    except BaseException:
        proxy.stop(st)
        raise
    return st, key, source


def _check_routes(url: str, key: str, model: str) -> None:
    """The proxy knows the model and one request goes through it end to end."""
    from bonsai_launch.server.client import session

    with session(key, 120.0) as http:
        r = http.get(url + "/v1/models")
        if r.status_code != 200 or model not in {m.get("id") for m in r.json().get("data", [])}:
            raise ActionFailed(
                f"the LiteLLM proxy does not list model {model!r} (HTTP {r.status_code}: {r.text[:200]})"
            )
        r = http.post(
            url + "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        )
        if r.status_code != 200:
            raise ActionFailed(f"a request through the LiteLLM proxy failed: HTTP {r.status_code}: {r.text[:300]}")


# -- up ----------------------------------------------------------------------------------------------


def _member_json(m: MemberState, healthy: bool | None = None, speculative: Any = None) -> dict[str, Any]:
    data = {
        "name": m.name,
        "url": m.url,
        "local": m.local,
        "pid": m.pid if m.local else None,
        "instance": m.instance if m.local else None,  # its name in `bonsai ps` / `bonsai logs`
        "api_key_env": m.api_key_env,
        "share": m.share or None,
    }
    if healthy is not None:
        data["healthy"] = healthy
    if speculative is not None:
        data["speculative"] = speculative
    return data


def up(opts: UpOptions, status: Status = quiet) -> UpResult:
    proxy.require_litellm()  # before anything starts: the one thing a fresh install may lack
    existing = fleet_state.load()
    if existing is not None and (
        proxy.alive(existing.proxy) or any(local_alive(m) for m in existing.members if m.local)
    ):
        _refuse_a_different_fleet(existing, opts)
        return _reconcile(existing, status)
    if existing is not None:
        fleet_state.remove()  # a fleet whose processes are all gone: start afresh
    return _fresh(opts, status)


def _refuse_a_different_fleet(st: FleetState, opts: UpOptions) -> None:
    """`up` on a running fleet restarts what died; it never silently ignores a different ask."""
    local = sum(1 for m in st.members if m.local) + sum(1 for e in st.excluded if e["name"].startswith("replica-"))
    wanted_profile = opts.flags.get("profile")
    if (wanted_profile and wanted_profile != st.profile) or (opts.replicas is not None and opts.replicas != local):
        raise BonsaiError(
            f"a fleet of {local} replica(s) of {st.profile or st.model!r} is running",
            "`bonsai fleet down` first to start a different one, or run `bonsai fleet up` "
            "without --profile/--replicas to restart what died",
        )


def _fresh(opts: UpOptions, status: Status) -> UpResult:
    from bonsai_launch.server import instances
    from bonsai_launch.server.process import SignalForwarder

    remote = remote_members(opts.hosts_file)  # a bad fleet file fails before anything starts
    if opts.replicas is None:
        opts = dataclasses.replace(opts, replicas=2)
    if opts.replicas == 0 and not remote:
        raise BonsaiError(
            "--replicas=0 and no --hosts: the fleet would be empty", "ask for replicas or give a fleet file"
        )
    local = replica_members(opts, opts.replicas, replica_backend(opts)) if opts.replicas else []
    started: list[MemberState] = []
    excluded: list[dict[str, str]] = []
    proxy_st: ProxyState | None = None
    proofs: dict[str, Any] = {}
    with SignalForwarder():
        try:
            for m in local:
                try:
                    launched = launch_replica(m, status)
                except ActionFailed as exc:  # it died, never got ready, or speculation is not live
                    status(f"{m.name}: not healthy, left out: {exc.message}")
                    excluded.append({"name": m.name, "url": m.url, "why": str(exc)})
                    # A bad setting or a busy port (BonsaiError) fails every replica alike: raised once.
                proofs[m.name] = launched.proof.to_json() if launched.proof else None
                started.append(m)
            refused = _check_remote(remote, opts, started, excluded, status)
            if refused and not opts.allow_down:
                raise BonsaiError(
                    "remote member(s) not usable; fix each, or pass --allow-down to start without them:\n  "
                    + "\n  ".join(refused)
                    + "\n",
                    "set each member up as docs/serving-a-team.md says: bind address, key, firewall",
                )
            if not started:
                raise ActionFailed(
                    "no member of the fleet became healthy: " + "; ".join(f"{e['name']}: {e['why']}" for e in excluded),
                    "see `bonsai logs`, fix the cause, then `bonsai fleet up` again",
                )
            model = _model_name(opts)
            litellm_path, swap_path = _write_configs(model, started)
            proxy_st, key, source = _start_proxy(model, litellm_path, opts.port, status)
            st = FleetState(model, opts.flags.get("profile"), started, proxy_st, str(swap_path), excluded)
            fleet_state.save(st)
        except BaseException:
            for m in started:
                if m.local:
                    for inst in instances.running():
                        if inst.name == m.instance:
                            instances.stop(inst)
            raise
    members = [_member_json(m, True, proofs.get(m.name)) for m in started]
    return UpResult(proxy_st.url, key, source, model, members, excluded, str(litellm_path), str(swap_path))


def _check_remote(
    remote: list[MemberState], opts: UpOptions, started: list[MemberState], excluded: list[dict[str, str]], status
) -> list[str]:
    """Each remote member must answer its key (/v1/models: llama-server's /health needs none).
    Healthy ones join `started`, the others `excluded`; returns one line per member left out."""
    lines = []
    for m in remote:
        if m.api_key_env and not os.environ.get(m.api_key_env):
            why = f"its key variable {m.api_key_env} is not set"
            lines.append(f"{m.name} ({m.url}): {why}")
            excluded.append({"name": m.name, "url": m.url, "why": why})
            continue
        status(f"{m.name}: waiting for {m.url} to answer its key")
        got = health.wait_reach(m.url, probe.member_key(m.api_key_env), opts.remote_wait_s)
        if got.state == health.HEALTHY:
            started.append(m)
            continue
        line = health.refusal_line(m.name, m.url, got, m.api_key_env)
        lines.append(line)
        excluded.append({"name": m.name, "url": m.url, "why": line.split(": ", 1)[1]})
        status(f"not usable: {line}")
    return lines


def _model_name(opts: UpOptions) -> str:
    profile = opts.flags.get("profile")
    if profile:
        return str(profile)
    from bonsai_launch.server.inputs import select

    return select(opts.flags).profile.name


def _reconcile(st: FleetState, status: Status) -> UpResult:
    """A fleet is running: restart the local replicas that died and the proxy if it died."""
    restarted: list[str] = []
    proofs: dict[str, Any] = {}
    for m in st.members:
        if m.local and not local_alive(m):
            status(f"{m.name}: not running, starting it again")
            launched = launch_replica(m, status)
            proofs[m.name] = launched.proof.to_json() if launched.proof else None
            restarted.append(m.name)
    key, source = None, "unchanged"
    if not proxy.alive(st.proxy):
        port = st.proxy.port if st.proxy else DEFAULT_PROXY_PORT
        config = Path(st.proxy.config) if st.proxy else fleet_state.fleet_dir() / "litellm.yaml"
        st.proxy, key, source = _start_proxy(st.model, config, port, status)
        restarted.append("proxy")
    assert st.proxy is not None  # alive, or started just above
    fleet_state.save(st)
    members = [
        _member_json(m, probe.probe(m.url, probe.member_key(m.api_key_env)).healthy, proofs.get(m.name))
        for m in st.members
    ]
    return UpResult(
        st.proxy.url,
        key,
        source,
        st.model,
        members,
        st.excluded,
        st.proxy.config,
        st.llama_swap or "",
        restarted,
        reused=True,
    )


# -- ps ----------------------------------------------------------------------------------------------


def ps() -> dict[str, Any]:
    """Each member's URL, pid (local), health, requests in flight and speculative acceptance."""
    st = fleet_state.load()
    if st is None:
        return {"running": False, "url": None, "model": None, "proxy": None, "members": [], "excluded": []}
    from bonsai_launch.server import instances

    live = {i.name: i for i in instances.running()}
    members = []
    verdicts = _proxy_view(st)
    for m in st.members:
        p = probe.probe(m.url, probe.member_key(m.api_key_env), check_key=not m.local)
        inst = live.get(m.instance or "") if m.local else None
        alive = (inst is not None) if m.local else None
        health_text = p.health if (alive is not False) else "dead"
        # a replica its keeper restarted runs under a new pid: the live one, and why it restarted
        restarted = {"pid": inst.pid, "restarts": inst.restarts, "last_exit": inst.last_exit} if inst else {}
        state, last_error = None, None
        if not m.local:  # as the proxy sees it, refined by what the member answers its key now
            assert p.reach is not None  # asked for remote members (check_key)
            state, last_error = health.member_state(None if verdicts is None else verdicts.get(m.name), p.reach)
        members.append(
            {
                **_member_json(m),
                **restarted,
                "alive": alive,
                "health": health_text,
                "state": state,
                "last_error": last_error,
                "proxy_view": verdicts is not None,
                "in_flight": p.in_flight,
                "drafted": p.drafted,
                "accepted": p.accepted,
                "acceptance": p.acceptance,
            }
        )
    proxy_alive = proxy.alive(st.proxy)
    return {
        "running": True,
        "url": st.proxy.url if st.proxy else None,
        "model": st.model,
        "proxy": {**dataclasses.asdict(st.proxy), "alive": proxy_alive} if st.proxy else None,
        "members": members,
        "excluded": st.excluded,
        "llama_swap": st.llama_swap,
    }


def _proxy_view(st: FleetState) -> dict[str, health.ProxyVerdict] | None:
    """The proxy's last health verdicts; asking needs its key (BONSAI_API_KEY, as clients use)."""
    from bonsai_launch.config.settings import env_value

    if st.proxy is None or not proxy.alive(st.proxy):
        return None
    key = (env_value("api_key") or "").split(",")[0].strip()
    return health.proxy_verdicts(st.proxy.url, key or None)


# -- down --------------------------------------------------------------------------------------------


def down() -> dict[str, Any]:
    """Stop the proxy and every local replica; raise if any process is left."""
    from bonsai_launch.server import instances

    st = fleet_state.load()
    if st is None:
        return {"stopped": [], "was_running": False}
    stopped: list[str] = []
    left: list[str] = []
    already_gone: list[str] = []
    if st.proxy is not None:
        (stopped if proxy.stop(st.proxy) else left).append("proxy")
    live = {i.name: i for i in instances.running()}
    for m in st.members:
        if not m.local:
            continue
        inst = live.get(m.instance or "")
        if inst is None:  # (not the pid: a restarted replica has a new one)
            already_gone.append(m.name)
            continue
        (stopped if instances.stop(inst) else left).append(m.name)
    if left:
        raise ActionFailed(f"could not stop: {', '.join(left)}", "see `bonsai fleet ps`; stop them by pid")
    fleet_state.remove()
    return {"stopped": stopped, "already_gone": already_gone, "was_running": True}
