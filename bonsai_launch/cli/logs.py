"""`bonsai logs`: show a server's llama-server log.

Examples:
    bonsai logs                 # the only running server (or the latest log)
    bonsai logs demo -f         # follow, like tail -f, until the server stops or Ctrl+C
    bonsai logs demo -n 200
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from bonsai_launch.server.instances import Instance

NameArg = Annotated[str | None, typer.Argument(help="Server name, port or pid (see `bonsai ps`).")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the server stops.")]
LinesOpt = Annotated[int, typer.Option("--lines", "-n", help="How many lines from the end to show first (0 = all).")]


def _log_for(name: str | None) -> tuple[Path, Instance | None]:
    """The log of a running server, else of a server that ran under that name before."""
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.core.paths import logs_dir
    from bonsai_launch.server import instances

    live = instances.running()
    if live and (name is not None or len(live) == 1):
        try:
            inst = instances.find(name)
            return Path(inst.log_path), inst
        except BonsaiError:
            if name is None:
                raise
    if name is not None:
        path = logs_dir() / f"{name}.log"
        if path.is_file():
            return path, None
        raise BonsaiError(f"no server or log called {name!r}", "see `bonsai ps`, or the files in " + str(logs_dir()))
    if len(live) > 1:
        instances.find(None)  # raises: several running, name one
    logs = sorted(logs_dir().glob("*.log"), key=lambda p: p.stat().st_mtime) if logs_dir().is_dir() else []
    if not logs:
        raise BonsaiError("no server logs yet", "start a server with `bonsai start`")
    return logs[-1], None


def command(name: NameArg = None, follow: FollowOpt = False, lines: LinesOpt = 100) -> None:
    """Print a server's log (the newest one when no server runs)."""
    import sys
    from collections import deque

    from bonsai_launch.server import instances
    from bonsai_launch.server.supervisor import follow as follow_lines

    path, inst = _log_for(name)
    with open(path, "rb") as f:
        head = f.readlines() if lines <= 0 else deque(f, maxlen=lines)
        offset = f.tell()
    sys.stdout.write(b"".join(head).decode("utf-8", "replace"))
    sys.stdout.flush()
    if not follow or inst is None:
        return

    def alive() -> bool:
        # by name: a server restarted after a crash (same log) has a new pid
        return any(i.name == inst.name for i in instances.running())

    try:
        for line in follow_lines(path, offset=offset, alive=alive):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
