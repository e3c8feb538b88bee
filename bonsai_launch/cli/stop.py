"""`bonsai stop`: stop servers started by bonsai.

Examples:
    bonsai stop                 # the only running server
    bonsai stop demo            # by name (see `bonsai ps`), port or pid
    bonsai stop --all
"""

from __future__ import annotations

from typing import Annotated

import typer

NameArg = Annotated[str | None, typer.Argument(help="Server name, port or pid (see `bonsai ps`).")]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Stop every running server.")]


def command(name: NameArg = None, all_servers: AllOpt = False) -> None:
    """Stop a running server: SIGTERM, a bounded wait, then SIGKILL."""
    from bonsai_launch.cli._output import console
    from bonsai_launch.core.errors import ActionFailed, BonsaiError
    from bonsai_launch.server import instances

    if all_servers and name:
        raise BonsaiError("give a server name or --all, not both", "drop one of them")
    targets = instances.running() if all_servers else [instances.find(name)]
    out = console()
    if not targets:
        out.print("no servers running")
        return
    failed = []
    for inst in targets:
        if instances.stop(inst):
            out.print(f"stopped {inst.name} (pid {inst.pid}, port {inst.port})")
        else:
            failed.append(inst.name)
    if failed:
        raise ActionFailed(f"could not stop {', '.join(failed)}", "check with `bonsai ps`; you may need more rights")
