"""`bonsai start`: launch llama-server with the right flags.

Examples:
    bonsai start --profile demo
    BONSAI_SPECULATIVE=1 bonsai start --profile demo
    bonsai start --profile ternary-27b --dry-run --json
    bonsai start --model T.gguf --drafter D.gguf --speculative --dry-run --format powershell
    bonsai start --profile demo -- --threads 2      # arguments after -- go to llama-server (checked)
    bonsai start --profile demo --detach            # keep serving in the background (`bonsai stop`)
    bonsai start --model T.gguf --drafter D.gguf --speculative --spec-fallback
    BONSAI_SPECULATIVE=auto bonsai start --profile demo   # what `bonsai tune` measured to pay (tunes first if needed)
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._launch import LaunchOptions, launch_options
from bonsai_launch.cli._options import DetachOpt, DryRunOpt, FormatOpt, HostOpt, JsonOpt, Kv4Opt, MmprojOpt, PortOpt
from bonsai_launch.cli._passthrough import passthrough_args

NoTuneOpt = Annotated[
    bool,
    typer.Option(
        "--no-tune", help="With BONSAI_SPECULATIVE=auto and no tuning decision: start plain instead of measuring first."
    ),
]


@launch_options
def command(
    ctx: typer.Context,
    launch: LaunchOptions,
    mmproj: MmprojOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    kv4: Kv4Opt = None,
    dry_run: DryRunOpt = False,
    shell_format: FormatOpt = "posix",
    json_output: JsonOpt = False,
    detach: DetachOpt = False,
    no_tune: NoTuneOpt = False,
) -> None:
    """Launch llama-server for a profile (or local GGUFs) with the right flags.

    Waits until it serves, proves speculative decoding is live when it is on, and stops the
    server on Ctrl+C. Arguments after -- go to llama-server, read as it reads them: those bonsai
    plans (--host, --port, -c, -np, -ub, -b, --spec-*, --api-key) count as the matching setting."""
    from bonsai_launch.core.errors import BonsaiError

    if shell_format not in ("posix", "powershell"):
        raise BonsaiError(f"--format={shell_format!r} is not known", "allowed: posix, powershell")
    flags = launch.flags(host=host, port=port, kv4=kv4)
    model, drafter, spec_fallback = launch.model, launch.drafter, launch.spec_fallback
    passthrough = passthrough_args(ctx)
    if mmproj:
        flags["mmproj"] = mmproj  # the flag layer of BONSAI_MMPROJ
    if dry_run:
        show_dry_run(flags, model, drafter, passthrough, shell_format, json_output)
        return
    raise typer.Exit(
        start_server(
            flags,
            model,
            drafter,
            passthrough,
            detach=detach,
            spec_fallback=spec_fallback,
            json_output=json_output,
            tune=not no_tune,
        )
    )


def show_dry_run(flags, model, drafter, passthrough, shell_format: str, json_output: bool) -> None:
    from bonsai_launch.cli._output import emit_json, warn
    from bonsai_launch.core.shell import render_command
    from bonsai_launch.llamacpp.choice import choose_server
    from bonsai_launch.llamacpp.flavours import FORK, FORK_BUILD_COMMAND
    from bonsai_launch.server.inputs import gather_plan, select
    from bonsai_launch.server.plan.types import shown_env

    selection = select(flags)
    choice = choose_server(selection.settings, selection.flavour)
    binary = choice.path
    plan = gather_plan(flags, model, drafter, passthrough, binary)
    warnings = list(plan.warnings)
    if binary is None and choice.kind.flavour == FORK:
        warnings.append(
            f"no PrismML fork build yet ({selection.profile.name} runs on one here): `bonsai start` "
            f"builds it when GitHub is reachable, or run `{FORK_BUILD_COMMAND}`; capabilities not checked"
        )
    elif binary is None:
        warnings.append("no llama-server is built yet: `bonsai start` builds one; capabilities not checked")
    if json_output:
        data = plan.to_json()
        data["warnings"] = warnings
        data["build"] = {
            "flavour": choice.kind.flavour,
            "fork_release": choice.kind.release,
            "from": choice.origin,
            "built": binary is not None,
        }
        emit_json(data)
        return
    for w in warnings:
        warn(w)
    import sys

    # The effective values on stderr, so stdout stays a command to paste.
    sys.stderr.write("# " + effective_values(plan) + "\n")
    if plan.memory:  # the weights' path and whether they and the KV cache fit this machine
        sys.stderr.write("# memory: " + plan.memory["summary"] + "\n")
    if plan.tuning and plan.tuning.get("status") == "found":  # otherwise already a warning above
        sys.stderr.write(plan.tuning["message"] + "\n")
    print(render_command(plan.argv, shell_format, shown_env(plan.env, "<hidden>")))


def effective_values(plan) -> str:
    """`host 127.0.0.1, port 8080 (from --), context 4096, slots auto, model name demo, API key required`."""
    passed = set(plan.from_passthrough)

    def value(label: str, shown, *keys: str) -> str:
        return f"{label} {shown}" + (" (from --)" if passed.intersection(keys) else "")

    return ", ".join(
        [
            value("host", plan.host, "host"),
            value("port", plan.port, "port"),
            value("context", plan.ctx, "ctx"),
            value("slots", plan.slots.count if plan.slots and plan.slots.count else "auto", "parallel"),
            value("model name", plan.model_name, "alias"),
            value("API key", "required" if "LLAMA_API_KEY" in plan.env else "none", "api_key"),
        ]
    )


# -- the real start ---------------------------------------------------------------------------


def _status_reporter(json_output: bool):
    """Live loading status: a spinner on a terminal, plain lines otherwise. rich is imported
    on the first update, which comes after llama-server is spawned, so it costs no start-up time."""
    import sys
    import time

    started = time.monotonic()
    if sys.stderr.isatty() and not json_output:
        spinner: list = []

        def update(text: str) -> None:
            label = f"{text} ({time.monotonic() - started:.1f} s)"
            if not spinner:
                from bonsai_launch.cli._output import console

                spinner.append(console(stderr=True).status(label))
                spinner[0].start()
            spinner[0].update(label)

        return update, lambda: spinner and spinner[0].stop()

    def line(text: str) -> None:
        if text == "loading model":
            import rich.console  # noqa: F401  - warm the summary's import while the model loads
        if not json_output:
            sys.stderr.write(f"llama-server: {text}\n")
            sys.stderr.flush()

    return line, lambda: None


def _web_ui(base_url: str, api_key: str | None) -> bool:
    from bonsai_launch.server.client import serves_page

    return serves_page(base_url, api_key)


def _no_page(binary: str) -> str:
    """One line: why this server has no chat page at / and how to get one (webui.py)."""
    from pathlib import Path

    from bonsai_launch.llamacpp.builds.install import read_manifest
    from bonsai_launch.llamacpp.builds.webui import HOW_TO_GET

    manifest = read_manifest(Path(binary).resolve().parent.parent) or {}
    if "ui" not in manifest:
        why = "this llama-server was built without it" if manifest else "this llama-server serves none"
    elif manifest["ui"].get("page"):
        return "none: the build has one, but llama-server serves none at / (--no-webui?)"
    else:
        why = manifest["ui"].get("reason") or "built without it"
    return f"none ({why}); to get it: {HOW_TO_GET}"


def server_json(plan, name: str, pid: int, log, detached: bool) -> dict:
    """What `start --json` says of a server it started or found already up."""
    return {
        "name": name,
        "pid": pid,
        "url": plan.base_url,
        "openai_base_url": plan.base_url + "/v1",
        "chat_page": plan.base_url + "/" if _web_ui(plan.base_url, plan.api_key) else None,
        "log": str(log),
        "detached": detached,
        "plan": plan.to_json(),
    }


def print_already_serving(plan, inst, json_output: bool) -> None:
    """`--detach` when a server with this exact command line already runs: say where it is, exit 0."""
    from bonsai_launch.cli._output import console, emit_json

    data = server_json(plan, inst.name, inst.pid, inst.log_path, inst.detached)
    if json_output:
        emit_json({**data, "already_running": True})
        return
    out = console()
    up = f"{inst.uptime:.0f} s" if inst.uptime < 120 else f"{inst.uptime / 60:.0f} min"
    out.print(
        f"[bold green]already running[/]: {inst.name} (llama-server pid {inst.pid}, up {up}), "
        "started with this same command line; nothing to start"
    )
    rows = [("OpenAI base URL", data["openai_base_url"]), ("chat page", data["chat_page"] or _no_page(plan.binary))]
    if inst.api_key_required:
        rows.append(("API key", "the one it was started with"))
    for label, value in rows:
        out.print(f"  {label:<16} {value}", markup=False)
    out.print(f"  stop it with `bonsai stop {inst.name}`; `bonsai ps` shows it", markup=False)


def mask_key(key: str) -> str:
    """`sk-l***`: enough to recognise a key, not to use it."""
    return key[:4] + "***" if len(key) > 8 else "***"


def _per_slot(plan) -> str:
    slots = plan.slots
    if slots is None or not slots.count or slots.count < 2:
        return ""
    if slots.kv_unified:
        return f", shared by {slots.count} slots (-kvu)"
    return f", {slots.count} slots x {slots.per_slot_ctx}"


def print_ready(plan, launched, generated_key: str | None, detach: bool) -> None:
    from pathlib import Path

    from bonsai_launch.cli._output import console

    out = console()
    inst, server = launched.instance, launched.server
    key = plan.api_key
    passed = set(plan.from_passthrough)

    def mark(*keys: str) -> str:
        return " (from --)" if passed.intersection(keys) else ""

    out.print(
        f"[bold green]ready[/] in {launched.ready_s:.1f} s: llama-server pid {server.pid}, "
        f"name {inst.name}, log {server.log_path}"
    )
    everywhere = " (all interfaces)" if plan.host in ("0.0.0.0", "::") else ""
    rows = [
        ("model", Path(plan.model).name + (f" (profile {plan.profile})" if plan.profile else "")),
        ("model name", f'{plan.model_name}   (the "model" clients send; /v1/models lists it){mark("alias")}'),
        ("listening on", f"{plan.host}:{plan.port}{everywhere}{mark('host', 'port')}"),
        ("context", f"{plan.ctx} tokens{_per_slot(plan)}{mark('ctx')}"),
        (
            "slots",
            (
                f"{plan.slots.count if plan.slots and plan.slots.count else 'auto (llama-server decides)'}"
                f"{mark('parallel')}"
            ),
        ),
        ("GPU layers", f"{plan.ngl} ({plan.backend}){mark('ngl')}"),
    ]
    if plan.speculative is None:
        rows.append(("speculation", "off"))
    else:
        sp = plan.speculative
        rows.append(
            (
                "speculation",
                f"{sp.spec_type}, n-max {sp.n_max if sp.n_max is not None else _default_n_max(sp.spec_type)}"
                + (f", drafter {Path(sp.drafter).name}" if sp.drafter else ""),
            )
        )
    rows.append(("OpenAI base URL", plan.base_url + "/v1"))
    rows.append(("chat page", plan.base_url + "/" if _web_ui(plan.base_url, key) else _no_page(plan.binary)))
    for label, value in rows:
        out.print(f"  {label:<16} {value}", markup=False)
    if generated_key:
        out.print(
            f"  {'API key':<16} {generated_key}   [yellow](generated, shown only this once: "
            f"export BONSAI_API_KEY={generated_key})[/]"
        )
        shown_key = generated_key
    elif key:
        source = "the arguments after --" if "api_key" in passed else "BONSAI_API_KEY"
        out.print(
            f"  {'API key':<16} required on every request (from {source}); send it as Authorization: Bearer KEY",
            markup=False,
        )
        shown_key = mask_key(key) if "api_key" in passed else "$BONSAI_API_KEY"
    auth = f' -H "Authorization: Bearer {shown_key}"' if key else ""
    body = '{"model":"%s","messages":[{"role":"user","content":"Hello!"}]}' % plan.model_name  # noqa: UP031 - a JSON template
    out.print(
        f"  try: curl {plan.base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
        markup=False,
    )
    if launched.proof is not None and launched.proof.live:  # not live: already warned on stderr
        out.print(f"[green]{launched.proof.summary()}[/]")
    if launched.slots_proof is not None:
        style = "green" if launched.slots_proof.live else "yellow"
        out.print(f"[{style}]{launched.slots_proof.summary()}[/]")
    if plan.tuning:
        if plan.tuning.get("table"):
            from bonsai_launch.cli._decision import print_decision

            print_decision(
                out,
                plan.tuning,
                title=f"BONSAI_SPECULATIVE=auto: decision {plan.tuning['id']} "
                f"({plan.tuning['prompts']}, {plan.tuning['created']})",
            )
        out.print(plan.tuning["message"], markup=False)
    if detach:
        out.print(f"running in the background: `bonsai logs {inst.name} -f`, `bonsai stop {inst.name}`")
    else:
        out.print("press Ctrl+C to stop")


def _default_n_max(spec_type: str) -> str:
    from bonsai_launch.server.liveness import default_n_max

    return f"{default_n_max(spec_type)} (llama.cpp default)"


def tune_first(plan, flags, model, drafter, passthrough, json_output: bool) -> None:
    """BONSAI_SPECULATIVE=auto without a usable decision: measure now (`bonsai tune`)."""
    import sys
    from pathlib import Path

    sys.stderr.write(
        f"BONSAI_SPECULATIVE=auto: {plan.tuning['why']}: tuning first (about a minute on a small model; "
        "--no-tune starts plain)\n"
    )
    sys.stderr.flush()
    from bonsai_launch.cli._decision import tune_now
    from bonsai_launch.server.prompt_sample import tuning_prompts

    # The slots and arguments of this start go to the tuning too, so its decision is keyed for them.
    tune_flags = {k: v for k, v in flags.items() if k in ("profile", "family", "size", "ctx", "ngl", "parallel")}
    prompts = tuning_prompts(Path(plan.model))  # the server's own recent work, when BONSAI_TUNE_SAMPLE kept enough
    if prompts:
        sys.stderr.write("tuning on the recent requests BONSAI_TUNE_SAMPLE kept for this model\n")
    outcome = tune_now(tune_flags, model, drafter, passthrough, binary=Path(plan.binary), prompts=prompts)
    if not json_output:
        sys.stderr.write(f"tuned in {outcome.elapsed_s:.0f} s: {outcome.decision.choice.describe()}\n")


def start_server(
    flags, model, drafter, passthrough, *, detach: bool, spec_fallback: bool, json_output: bool, tune: bool = True
) -> int:
    """`bonsai start` without --dry-run. Returns the exit code (0 when the user stopped it)."""
    from bonsai_launch.cli._output import emit_json, warn
    from bonsai_launch.decisions.auto import needs_tuning
    from bonsai_launch.server import instances, supervisor
    from bonsai_launch.server.prepare import prepare_plan
    from bonsai_launch.server.process import SignalForwarder, StopRequested

    with SignalForwarder() as forwarder:
        try:
            plan, generated = prepare_plan(flags, model, drafter, passthrough)
            if tune and needs_tuning(plan):
                tune_first(plan, flags, model, drafter, passthrough, json_output)
                plan, generated = prepare_plan(flags, model, drafter, passthrough)
            for w in plan.warnings:
                warn(w)
            if detach and (up := instances.serving(plan.argv, bool(plan.env.get("LLAMA_API_KEY")))) is not None:
                # the same server is up (README's first command, run again): nothing to start
                print_already_serving(plan, up, json_output)
                return 0
            update, stop_status = _status_reporter(json_output)
            try:
                launched = supervisor.launch(
                    plan, detach=detach, spec_fallback=spec_fallback, on_status=update, forwarder=forwarder
                )
            finally:
                stop_status()
        except StopRequested:
            # 0 once a server was started (the user stopped it); 130 if stopped before that.
            return 0 if forwarder.server is not None else 130

        def report() -> None:
            if launched.proof is not None and not launched.proof.live:
                warn(launched.proof.summary() + "; serving without it (--spec-fallback)")
            if json_output:
                data = {
                    **server_json(plan, launched.instance.name, launched.server.pid, launched.server.log_path, detach),
                    "ready_s": round(launched.ready_s, 3),
                    "speculative": launched.proof.to_json() if launched.proof else None,
                    "speculative_slots": launched.slots_proof.to_json() if launched.slots_proof else None,
                }
                if generated:
                    data["api_key"] = generated
                emit_json(data)
            else:
                print_ready(plan, launched, generated, detach)

        return supervisor.report_then_serve(launched, report, detach=detach, forwarder=forwarder)
