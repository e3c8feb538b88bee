"""`bonsai serve`: every model behind one port, on llama-server's own router.

The router is one llama-server started without a model: it spawns a child llama-server per model
on that model's first request (or at start), routes each request by its "model" field, and
unloads the least recently used model past --models-max. Bonsai plans each model exactly as
`bonsai start` would (router_inputs.py, the one planner), writes the plans into the router's
preset file (plan/router.py), and runs the router as it runs any server (supervisor.launch: the
port check, the keeper of a detached one, restarts, `bonsai ps`/`stop`/`logs`). What upstream
lacks, the router's watcher adds (router_watch.py): idle unload that ends the child, pins, and
speculation proven live per model when it loads.

One key: the router demands it (LLAMA_API_KEY), and every child inherits the variable, so a model
cannot be reached around the key on a child's own loopback port either.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.server.plan.router import RouterPlan

LOAD_TIMEOUT = 600.0


def serve_dir() -> Path:
    """Where routers' preset files live (BONSAI_HOME/serve)."""
    from bonsai_launch.core.paths import bonsai_home

    return bonsai_home() / "serve"


def prepare_router(
    words: Sequence[str],
    flags: Mapping[str, Any],
    passthrough: tuple[str, ...] = (),
    *,
    dry_run: bool = False,
    env: Mapping[str, str] | None = None,
) -> tuple[RouterPlan, str | None]:
    """The RouterPlan for the models the user named, and a generated key (a remote host without
    one). Fetches profiles' missing files and builds llama-server first, unless `dry_run`. Every
    refusal comes before anything is written or started."""
    from bonsai_launch.config.profiles import load_all
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.llamacpp.binaries import probe
    from bonsai_launch.server import instances
    from bonsai_launch.server.inputs import option_table
    from bonsai_launch.server.passthrough import fold_settings, parse
    from bonsai_launch.server.plan import check_host, is_loopback, plan_server
    from bonsai_launch.server.plan.router import plan_router
    from bonsai_launch.server.prepare import build_server, launch_settings
    from bonsai_launch.server.router_inputs import fetch_files, parse_sources, plan_models

    env = dict(os.environ if env is None else env)
    generated = None
    early = launch_settings(flags, passthrough)
    if not is_loopback(early["host"]) and early["allow_remote"] and not early.get("api_key"):
        generated = secrets.token_urlsafe(24)
        env["BONSAI_API_KEY"] = generated
    check_host(fold_settings(resolve(flags, env), parse(passthrough, option_table(None))))
    sources = parse_sources(words, sorted(load_all()))
    binary, flavour = _binary(sources, flags, env)
    if not dry_run:
        fetch_files(sources, flags, env, flavour)
        if binary is None:
            plan_models(sources, flags, passthrough, None, env)  # a bad setting or file fails now, not after a build
            binary = build_server(flavour)
    models = plan_models(sources, flags, passthrough, binary, env, repack=not dry_run)
    caps = probe(binary) if binary is not None else None
    table = option_table(caps)
    settings = fold_settings(resolve(flags, env), parse(passthrough, table))
    server = plan_server(settings, str(binary) if binary is not None else "llama-server", caps)
    name = instances.unique_name("serve", server.port)
    plan = plan_router(
        server,
        models,
        {k: settings.get(k) for k in ("idle_unload", "pin", "preload", "models_max")},
        table,
        preset_path=str(serve_dir() / f"{name}.ini"),
        cache_dir=str(serve_dir() / "no-hub-cache"),
        name=name,
    )
    return plan, generated


def _binary(sources, flags: Mapping[str, Any], env: Mapping[str, str]) -> tuple[Path | None, str]:
    """One llama-server runs every model: the one `start` would choose; models that need
    different builds (the PrismML fork and mainline) cannot share it."""
    from bonsai_launch.server.inputs import select
    from bonsai_launch.server.prepare import choose_binary
    from bonsai_launch.server.router_inputs import model_flags

    choices: dict[str, tuple[str, Any]] = {}
    for source in sources:
        choice = choose_binary(select(model_flags(source, flags), env))
        choices.setdefault(choice.kind.flavour, (source.shown, choice))
    if len(choices) > 1:
        shown = "; ".join(f"{src} needs the {flavour} build" for flavour, (src, _) in choices.items())
        raise BonsaiError(
            f"one router runs one llama-server: {shown}", "serve them with two `bonsai serve`s on two ports"
        )
    flavour, (_, choice) = next(iter(choices.items()))
    return choice.path, flavour


def write_preset(plan: RouterPlan) -> None:
    """The preset file (atomically) and the router's empty model cache folder."""
    from bonsai_launch.server.instances import write_atomic

    Path(plan.cache_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(plan.preset_path), plan.preset)


def launch(
    plan: RouterPlan,
    *,
    detach: bool,
    on_status: Callable[[str], None] | None = None,
    forwarder=None,
    load_timeout: float = LOAD_TIMEOUT,
):
    """Start the router as `bonsai start` starts a server, then wait for the models loaded at start
    (pinned, preloaded) and prove their speculation. Returns (supervisor.Launched, {name: record})."""
    from bonsai_launch.server import router_watch, supervisor

    write_preset(plan)
    old = router_watch.state_file(plan.name)  # a previous router's models are not this one's
    for leftover in (old, *old.parent.glob(f"{plan.name}.proving-*")):
        leftover.unlink(missing_ok=True)
    launched = supervisor.launch(plan, detach=detach, on_status=on_status, forwarder=forwarder, name=plan.name)
    try:
        watch = router_watch.RouterWatch(
            plan.name, plan.base_url, plan.api_key, plan.watch_json()["models"], launched.server.log_path
        )
        at_start = [m.name for m in plan.models if m.pinned or m.preload]
        deadline = time.monotonic() + load_timeout
        while True:
            watch.step(time.time())
            pending = [n for n in at_start if watch.records[n].state not in ("loaded", "sleeping", "failed")]
            if not pending:
                break
            if not launched.server.alive():
                raise ActionFailed(launched.server.exit_message("while loading its models"))
            if time.monotonic() > deadline:
                raise ActionFailed(f"{', '.join(pending)} did not load within {load_timeout:.0f} s")
            if on_status:
                on_status(f"loading {', '.join(pending)}")
            time.sleep(0.2)
    except BaseException:
        supervisor.shutdown(launched)
        raise
    return launched, {name: r.to_json() for name, r in watch.records.items()}


def models_state(inst, api_key: str | None) -> list[dict[str, Any]]:
    """A router instance's models as `bonsai ps` shows them: the watcher's records, with the
    router's own word for each state when it can be asked (it needs the key)."""
    from bonsai_launch.server import router_watch

    now = time.time()
    saved = router_watch.read_state(inst.name)
    try:
        live = router_watch.router_models(inst.base_url, api_key)
    except Exception:
        live = {}
    out = []
    for m in (inst.router or {}).get("models") or []:
        record = dict(saved.get(m["name"]) or {"name": m["name"], "state": "unloaded"})
        record.setdefault("idle_unload_s", m.get("idle_unload_s"))
        record.setdefault("pinned", m.get("pinned"))
        record.setdefault("spec_type", m.get("spec_type"))
        status = live.get(m["name"])
        if status is not None:  # the router's own word is newer than the watcher's last look
            failed = bool(status.get("failed")) and status.get("value") == "unloaded"
            record["state"] = "failed" if failed else status.get("value") or record.get("state")
            if failed:
                record["exit_code"] = status.get("exit_code")
        if record.get("state") not in ("loaded", "sleeping"):
            record["unload_in_s"] = None
            record["rss_bytes"] = None
        elif record.get("unload_in_s") is not None and record.get("last_active"):
            remaining = record["idle_unload_s"] - (now - record["last_active"])
            record["unload_in_s"] = max(0.0, remaining)
        out.append(record)
    return out


class ModelLog:
    """One model's lines of a router's log: its children's output (the router prefixes each line
    with the child's port, and names the port when it spawns the child) and bonsai's notes on it.
    Fed line by line, in order, so that it follows a growing log too."""

    _SPAWNED = re.compile(r"spawning server instance with name=(\S+) on port (\d+)")
    _CHILD = re.compile(r"^\[\s*(\d+)\]")

    def __init__(self, model: str) -> None:
        self.model = model
        self.ports: set[str] = set()

    def keep(self, line: str) -> bool:
        spawned = self._SPAWNED.search(line)
        if spawned:
            if spawned.group(1) != self.model:
                return False
            self.ports.add(spawned.group(2))
            return True
        child = self._CHILD.match(line)
        return bool(child and child.group(1) in self.ports) or f"model {self.model}:" in line
