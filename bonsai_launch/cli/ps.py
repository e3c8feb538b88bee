"""`bonsai ps`: llama-servers started by bonsai that are running now.

Examples:
    bonsai ps
    bonsai ps --json
"""

from __future__ import annotations

from bonsai_launch.cli._options import JsonOpt


def format_uptime(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def command(json_output: JsonOpt = False) -> None:
    """List running servers: profile, bind address, whether an API key is required (KEY), pid,
    uptime, whether speculation is live, restarts after crashes and the last cause, and whether
    it is asleep (BONSAI_SLEEP_IDLE_SECONDS: model unloaded until the next request) or awake.

    State files of servers that are gone are removed, never trusted."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.config.settings import env_value
    from bonsai_launch.server import instances
    from bonsai_launch.server.client import first_key
    from bonsai_launch.server.lifecycle import State

    live = instances.running()
    key = first_key(env_value("api_key")) if any(i.api_key_required for i in live) else None
    # Asked of /props, which answers from a cache while asleep: looking never wakes a server.
    asleep = {i.name: sleep_state(i, key) for i in live} if live else {}
    routed = {i.name: models_state(i, key) for i in live if i.router}
    if json_output:
        emit_json([{**i.to_json(), "sleeping": asleep[i.name], **models_json(routed, i.name)} for i in live])
        return
    out = console()
    if not live:
        out.print("no servers running (start one with `bonsai start --detach`)")
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    tuned = any(i.tuning for i in live)
    watched = any(i.watch for i in live)
    for col in (
        ("NAME", "PROFILE", "ADDRESS", "KEY", "PID", "UPTIME", "SPECULATIVE", "MODE", "RESTARTS", "SLEEP")
        + (("AUTO DECISION",) if tuned else ())
        + (("SPEC WATCH",) if watched else ())
    ):
        table.add_column(col, no_wrap=True)
    for i in live:
        if i.router:
            spec = "per model (below)"
        elif i.speculative:
            spec = f"yes ({i.spec_type})"
        else:
            spec = "no (not live, fallback)" if i.spec_type else "no"
        # The real bind address (0.0.0.0 is every interface), not the URL bonsai talks to.
        address = escape(f"[{i.host}]:{i.port}" if ":" in i.host else f"{i.host}:{i.port}")
        row = [
            i.name,
            i.profile or "-",
            address,
            "yes" if i.api_key_required else "no",
            str(i.pid) if i.state == State.RUNNING else f"{i.state}",
            format_uptime(i.uptime),
            spec,
            "detached" if i.detached else "foreground",
            restarts_cell(i),
            {True: "asleep", False: "awake", None: "-"}[asleep[i.name]],
        ]
        if tuned:
            row.append(decision_cell(i.tuning, i.traffic))
        if watched:
            row.append(watch_cell(i.watch))
        table.add_row(*row)
    if not out.is_terminal:
        out.width = max(out.width, 160)  # piped into a script or a file: never cut a row short
    out.print(table)
    for name, models in routed.items():
        out.print(f"\n{name}: models behind one port (`bonsai serve`)")
        out.print(models_table(models))


def models_state(inst, api_key: str | None) -> list[dict]:
    from bonsai_launch.server.router import models_state as state

    return state(inst, api_key)


def models_json(routed: dict[str, list[dict]], name: str) -> dict:
    return {"models": routed[name]} if name in routed else {}


def models_table(models: list[dict]):
    """A router's models: state, speculation (proven live when it loaded), acceptance so far,
    memory of its llama-server child, and the time left before its idle unload."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("MODEL", "STATE", "SPECULATION", "ACCEPTANCE", "MEMORY", "UNLOADS IN"):
        table.add_column(col, no_wrap=True)
    for m in models:
        state = m.get("state") or "unloaded"
        if state == "failed":
            state = f"failed (exit {m.get('exit_code')})"
        proof = m.get("proof") or {}
        spec = m.get("spec_type") or "off"
        if m.get("spec_type") and proof:
            spec += " (live)" if proof.get("live") else " (NOT live)"
        drafted, accepted = int(m.get("drafted") or 0), int(m.get("accepted") or 0)
        acceptance = f"{accepted / drafted:.0%} of {drafted}" if drafted else "-"
        rss = m.get("rss_bytes")
        memory = f"{rss / 2**20:.0f} MiB" if rss else "-"
        if m.get("pinned"):
            unload = "pinned"
        elif m.get("unload_in_s") is not None:
            unload = format_uptime(m["unload_in_s"])
        else:
            unload = "-" if m.get("idle_unload_s") else "never"
        table.add_row(m["name"], state, spec, acceptance, memory, unload)
    return table


def sleep_state(inst, api_key: str | None) -> bool | None:
    """True asleep, False awake, None unknown (restarting, or /props refused: BONSAI_API_KEY unset)."""
    from bonsai_launch.server import client
    from bonsai_launch.server.lifecycle import State

    if inst.state != State.RUNNING:
        return None
    return client.sleeping(inst.base_url, api_key)


def restarts_cell(inst) -> str:
    """`0`, `2 (last: was killed by signal 9 ...)`, or `off` when BONSAI_RESTART=0 started it."""
    if not inst.supervised:
        return "off"
    if not inst.restarts and not inst.last_exit:
        return "0"
    short = (inst.last_exit or "").split(" (")[0]  # the full cause is in --json and the log
    return f"{inst.restarts} (last: {short})"


def decision_cell(tuning: dict | None, traffic: dict | None = None) -> str:
    """`ngram-mod 1.42x (decision 3f2a9c1d)`, `plain (decision ...)`, or why none was used; with
    a re-decision from the server's own traffic (server/traffic.py) what the next start runs."""
    if not tuning:
        return "-"
    if tuning.get("status") != "found":
        return f"none ({tuning.get('status')}): plain"
    choice = tuning.get("choice") or {}
    what = choice.get("label") or "plain"
    if choice.get("ratio"):
        what += f" {choice['ratio']:.2f}x"
    cell = f"{what} (decision {tuning.get('id')})"
    if traffic and traffic.get("decision"):
        cell += f"; re-decided from its traffic: {traffic.get('choice')}, from the next start (decision {traffic['decision']})"
    return cell


def watch_cell(watch: dict | None) -> str:
    """`paying: 96% accepted, 41.2 tok/s (4 windows)`, `below plain: ...`, `watching: ...`
    (server/watch.py: the server's own /metrics over windows of drafted tokens)."""
    if not watch:
        return "-"
    status = watch.get("status")
    last = watch.get("last") or {}
    if status == "watching" or not last:
        return f"watching: {watch.get('why')}"
    figures = f"{last['acceptance']:.0%} accepted"
    if last.get("decode_tps"):
        figures += f", {last['decode_tps']:.1f} tok/s"
    if status == "below plain":
        return f"below plain: {watch.get('why')}"
    return f"{status}: {figures} ({watch.get('windows')} windows)"
