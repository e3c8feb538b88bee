"""`bonsai service`: a login service that runs `bonsai start` (systemd user unit, launchd agent,
Task Scheduler task at logon), with the profile and settings `start` takes.

Examples:
    bonsai service install --profile demo                 # ~/.config/systemd/user/bonsai-demo.service
    BONSAI_SLEEP_IDLE_SECONDS=600 bonsai service install --profile demo --speculative --port 8090
    bonsai service install --profile demo --dry-run       # print the unit, write nothing
    bonsai service status --profile demo --json
    bonsai service uninstall --profile demo
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._launch import LaunchOptions, launch_options
from bonsai_launch.cli._options import HostOpt, JsonOpt, Kv4Opt, MmprojOpt, PortOpt, ProfileOpt
from bonsai_launch.cli._passthrough import PassthroughCommand, passthrough_args

app = typer.Typer(
    name="service",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain Click help, as `bonsai` itself (cli/main.py)
    help="Run `bonsai start` as a login service: install, uninstall, status.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

NameOpt = Annotated[
    str | None, typer.Option("--name", help="Service name (default: the profile): unit bonsai-NAME.service.")
]
PrintOpt = Annotated[bool, typer.Option("--dry-run", help="Print the service file instead of installing it.")]


def _name(name: str | None, profile: str | None, flags: dict | None = None) -> str:
    from bonsai_launch.config.settings import resolve

    return name or profile or resolve(flags or {}).get("profile") or "default"


@app.command("install", cls=PassthroughCommand)
@launch_options
def install(
    ctx: typer.Context,
    launch: LaunchOptions,
    mmproj: MmprojOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    kv4: Kv4Opt = None,
    name: NameOpt = None,
    dry_run: PrintOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Write the service for this launch and enable it at login (where the manager answers).

    The service runs `bonsai start` in the foreground with these options and the BONSAI_*
    variables set now, so the restart keeper, the logs and `bonsai ps` work as in a terminal.
    Arguments after -- go to llama-server, as for start."""
    import os
    import sys
    from pathlib import Path

    from bonsai_launch.server import service, service_files

    flags = launch.flags(host=host, port=port, kv4=kv4, mmproj=str(Path(mmproj).absolute()) if mmproj else None)
    argv = service_files.start_argv(
        str(Path(sys.executable).absolute()),  # the venv's interpreter, not the file it links to
        flags,
        model=str(Path(launch.model).absolute()) if launch.model else None,
        drafter=str(Path(launch.drafter).absolute()) if launch.drafter else None,
        spec_fallback=launch.spec_fallback,
        passthrough=passthrough_args(ctx),
    )
    spec = service.make_spec(_name(name, launch.profile, flags), argv, os.environ)
    if dry_run:
        text = service.render(spec)
        sys.stdout.write(text.decode("utf-16") if service.kind() == "task" else text.decode())
        return
    _report(service.install(spec), json_output)


def _report(result, json_output: bool) -> None:
    from bonsai_launch.cli._output import console, emit_json

    if json_output:
        emit_json(result.to_json())
        return
    out = console()
    out.print(f"installed {result.path}", highlight=False)
    for done in result.done:
        out.print(f"  ran: {done}", highlight=False)
    if result.next_step:
        out.print(result.next_step, highlight=False)
    out.print(f"logs: {'; '.join(result.logs)}", highlight=False)


@app.command("install-serve", cls=PassthroughCommand)
def install_serve(
    ctx: typer.Context,
    models: Annotated[list[str], typer.Argument(help="What `bonsai serve` serves (profiles, files, folders).")],
    host: HostOpt = None,
    port: PortOpt = None,
    name: NameOpt = None,
    dry_run: PrintOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Write a service that runs `bonsai serve MODELS...` (several models behind one port) at login.

    BONSAI_* variables set now (the key, BONSAI_IDLE_UNLOAD, BONSAI_PIN, ...) go with it, as for install."""
    import os
    import sys
    from pathlib import Path

    from bonsai_launch.server import service, service_files

    argv = service_files.serve_argv(
        str(Path(sys.executable).absolute()), models, {"host": host, "port": port}, passthrough_args(ctx)
    )
    spec = service.make_spec(name or "serve", argv, os.environ)
    if dry_run:
        text = service.render(spec)
        sys.stdout.write(text.decode("utf-16") if service.kind() == "task" else text.decode())
        return
    _report(service.install(spec), json_output)


@app.command("uninstall")
def uninstall(profile: ProfileOpt = None, name: NameOpt = None, json_output: JsonOpt = False) -> None:
    """Stop the service, unregister it and remove its file."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.server import service

    spec = service.make_spec(_name(name, profile), (), {})
    result = service.uninstall(spec)
    if json_output:
        emit_json(result.to_json())
        return
    out = console()
    out.print(result.next_step or f"removed {result.path}", highlight=False)


@app.command("status")
def status(profile: ProfileOpt = None, name: NameOpt = None, json_output: JsonOpt = False) -> None:
    """Installed or not, enabled and running or not, and where the logs are."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.server import service

    spec = service.make_spec(_name(name, profile), (), {})
    result = service.status(spec)
    if json_output:
        emit_json(result.to_json())
        return
    out = console()
    word = {True: "yes", False: "no", None: "unknown"}
    out.print(f"service    {spec.name} ({result.kind})", highlight=False)
    out.print(f"installed  {word[result.installed]} ({result.path})", highlight=False)
    if not result.manager:
        out.print("manager    not reachable here (enabled: unknown)", highlight=False)
    else:
        out.print(f"enabled    {word[result.enabled]}", highlight=False)
    out.print(f"running    {word[result.running]}", highlight=False)
    out.print(f"logs       {'; '.join(result.logs)}", highlight=False)
