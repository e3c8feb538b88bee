"""`bonsai fleet`: llama-server replicas behind the LiteLLM proxy, on one machine or several.

Examples:
    bonsai fleet up --profile demo --replicas 2          # two CPU replicas, cores split between them
    bonsai fleet up --profile bonsai-8b --replicas 2 --gpus 0,1 --speculative
    bonsai fleet up --profile bonsai-8b --replicas 0 --hosts fleet.yaml   # remote members only
    bonsai fleet ps --json
    bonsai fleet down

Needs the optional extra: pip install 'bonsai-launch[fleet]'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bonsai_launch.cli._options import (
    CtxOpt,
    FamilyOpt,
    JsonOpt,
    Kv4Opt,
    NglOpt,
    ParallelOpt,
    ProfileOpt,
    SizeOpt,
    SpecNmaxOpt,
    SpecOpt,
    SpecTypeOpt,
)
from bonsai_launch.cli._passthrough import PassthroughCommand, passthrough_args

app = typer.Typer(
    name="fleet",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain Click help, as `bonsai` itself (cli/main.py)
    help="Replicas of a profile behind the LiteLLM proxy (least-busy routing, retries, failover).",
    context_settings={"help_option_names": ["-h", "--help"]},
)

ReplicasOpt = Annotated[
    int | None,
    typer.Option("--replicas", "-n", help="Local llama-server replicas to start (default 2; 0: remote members only)."),
]
GpusOpt = Annotated[
    str | None, typer.Option("--gpus", help="GPU device numbers, one replica per entry in turn, e.g. 0,1.")
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads-per-replica",
        help="CPU threads per replica (default: the cores split evenly, each replica pinned to its own).",
    ),
]
ProxyPortOpt = Annotated[
    int, typer.Option("--port", help="The proxy's port; replicas take the next ports (PORT+1, PORT+2, ...).")
]
RemoteWaitOpt = Annotated[
    float,
    typer.Option("--remote-wait", help="Seconds a remote member may take to answer /health 200 before it is left out."),
]
AllowDownOpt = Annotated[
    bool,
    typer.Option(
        "--allow-down",
        help="Start even when remote members are unreachable or refuse their key (they are left out and listed).",
    ),
]
HostsOpt = Annotated[Path | None, typer.Option("--hosts", help="Fleet file listing remote members (url, api_key_env).")]


@app.command("up", cls=PassthroughCommand)
def up(
    ctx: typer.Context,
    profile: ProfileOpt = None,
    family: FamilyOpt = None,
    size: SizeOpt = None,
    replicas: ReplicasOpt = None,
    gpus: GpusOpt = None,
    threads_per_replica: ThreadsOpt = None,
    port: ProxyPortOpt = 4000,
    hosts: HostsOpt = None,
    speculative: SpecOpt = None,
    spec_type: SpecTypeOpt = None,
    spec_nmax: SpecNmaxOpt = None,
    parallel: ParallelOpt = None,
    ctx_size: CtxOpt = None,
    ngl: NglOpt = None,
    kv4: Kv4Opt = None,
    remote_wait: RemoteWaitOpt = 60.0,
    allow_down: AllowDownOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Start replicas and the proxy; return once the proxy and every member answer.

    Run again on a running fleet to restart what died. Arguments after -- go to every replica's
    llama-server."""
    import sys

    from bonsai_launch.cli._output import emit_json
    from bonsai_launch.fleet import hosts as fleet_hosts
    from bonsai_launch.fleet.members import UpOptions
    from bonsai_launch.fleet.service import up as fleet_up

    flags = {
        "profile": profile,
        "family": family,
        "size": size,
        "speculative": speculative,
        "spec_type": spec_type,
        "spec_nmax": spec_nmax,
        "parallel": parallel,
        "ctx": ctx_size,
        "ngl": ngl,
        "kv4": kv4,
    }
    opts = UpOptions(
        flags={k: v for k, v in flags.items() if v is not None},
        replicas=replicas,
        gpus=fleet_hosts.parse_gpus(gpus),
        threads=threads_per_replica,
        port=port,
        hosts_file=hosts,
        passthrough=passthrough_args(ctx),
        remote_wait_s=remote_wait,
        allow_down=allow_down,
    )

    def status(text: str) -> None:
        if not json_output:
            sys.stderr.write(f"fleet: {text}\n")
            sys.stderr.flush()

    from bonsai_launch.server.process import StopRequested

    try:
        result = fleet_up(opts, status)
    except StopRequested:  # Ctrl+C: whatever this run started was stopped on the way out
        raise typer.Exit(130) from None
    if json_output:
        emit_json(result.to_json())
        return
    _print_up(result)


def _print_up(result) -> None:
    from rich.table import Table

    from bonsai_launch.cli._output import console

    out = console()
    verb = "fleet running" if result.reused else "fleet ready"
    out.print(f"[bold green]{verb}[/]: model {result.model!r} at {result.url}/v1 (LiteLLM proxy, least-busy, retries)")
    if result.restarted:
        out.print(f"  restarted: {', '.join(result.restarted)}")
    table = Table(box=None, pad_edge=False)
    for col in ("MEMBER", "URL", "PID", "SHARE", "SPECULATIVE"):
        table.add_column(col, no_wrap=True)
    for m in result.members:
        spec = m.get("speculative")
        if spec:
            spec_text = f"live ({spec['type']})" if spec.get("live") else "not live"
        else:
            spec_text = "off" if m["local"] and not result.reused else "-"
        table.add_row(
            m["name"],
            m["url"],
            str(m["pid"] or "-"),
            m.get("share") or ("remote" if not m["local"] else "-"),
            spec_text,
        )
    out.print(table)
    for e in result.excluded:
        out.print(f"[yellow]left out[/] {e['name']} ({e['url']}): {e['why']}", markup=True)
    if result.key_source == "generated":
        out.print(
            f"  API key  {result.api_key}   [yellow](generated, shown only this once: "
            f"export BONSAI_API_KEY={result.api_key})[/]"
        )
    elif result.key_source == "BONSAI_API_KEY":
        out.print("  API key  $BONSAI_API_KEY")
    else:
        out.print("  API key  unchanged (shown when the proxy started)")
    body = '{"model":"%s","messages":[{"role":"user","content":"Hello!"}]}' % result.model  # noqa: UP031 - a JSON template
    out.print(
        f"  try: curl {result.url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-H \"Authorization: Bearer $BONSAI_API_KEY\" -d '{body}'",
        markup=False,
    )
    out.print(f"  proxy config {result.config}; llama-swap config {result.llama_swap}")
    out.print("  `bonsai fleet ps` shows the members, `bonsai fleet down` stops everything")


@app.command("ps")
def ps(json_output: JsonOpt = False) -> None:
    """Each member: URL, pid (local), health, requests in flight, speculative acceptance."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.fleet.service import ps as fleet_ps

    data = fleet_ps()
    if json_output:
        emit_json(data)
        return
    out = console()
    if not data["running"]:
        out.print("no fleet running (start one with `bonsai fleet up --profile demo --replicas 2`)")
        return
    from rich.table import Table

    p = data["proxy"]
    out.print(
        f"proxy {data['url']}/v1 model {data['model']!r}: "
        + ("[green]up[/]" if p and p["alive"] else "[red]dead[/] (`bonsai fleet up` starts it again)")
        + (f", pid {p['pid']}" if p else "")
    )
    table = Table(box=None, pad_edge=False)
    for col in ("MEMBER", "URL", "PID", "HEALTH", "IN FLIGHT", "ACCEPTANCE"):
        table.add_column(col, no_wrap=True)
    for m in data["members"]:
        health = m["health"] if m["local"] else (m.get("state") or m["health"])  # remote: as the proxy sees it
        colour = "green" if health in ("ok", "healthy") else "yellow" if health == "cooling down" else "red"
        acc = f"{m['acceptance'] * 100:.1f}% ({m['accepted']}/{m['drafted']})" if m["acceptance"] is not None else "-"
        table.add_row(
            m["name"],
            m["url"],
            str(m["pid"] or "-"),
            f"[{colour}]{health}[/]",
            "-" if m["in_flight"] is None else str(m["in_flight"]),
            acc,
        )
    out.print(table)
    for m in data["members"]:
        if m.get("last_error"):
            out.print(f"  {m['name']}: last error: {m['last_error']}", markup=False, highlight=False)
    if any(not m["local"] and not m.get("proxy_view") for m in data["members"]):
        out.print(
            "  (remote states are what each member answers now; export BONSAI_API_KEY=<proxy key> to see the proxy's view)"
        )
    for e in data["excluded"]:
        out.print(f"[yellow]left out at start[/] {e['name']} ({e['url']}): {e['why']}")
    if any(m["health"] != "ok" or m.get("state") not in (None, "healthy") for m in data["members"]):
        out.print("a member is down: the proxy routes around it; `bonsai fleet up` starts dead local replicas again")


@app.command("down")
def down(json_output: JsonOpt = False) -> None:
    """Stop the proxy and every local replica; nothing is left running."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.fleet.service import down as fleet_down

    result = fleet_down()
    if json_output:
        emit_json(result)
        return
    out = console()
    if not result["was_running"]:
        out.print("no fleet running")
    else:
        out.print(f"stopped: {', '.join(result['stopped']) or 'nothing was left running'}")
        if result.get("already_gone"):
            out.print(f"already gone: {', '.join(result['already_gone'])}")
