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
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="A `bonsai serve` router's model: only its lines (see `bonsai ps`).")
]


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


def command(name: NameArg = None, follow: FollowOpt = False, lines: LinesOpt = 100, model: ModelOpt = None) -> None:
    """Print a server's log (the newest one when no server runs); with --model, one model of a
    `bonsai serve` router: its llama-server's lines and bonsai's notes on it."""
    import sys
    from collections import deque

    from bonsai_launch.server import instances
    from bonsai_launch.server.supervisor import follow as follow_lines

    path, inst = _log_for(name)
    keep = _model_filter(inst, model)
    with open(path, "rb") as f:
        kept = (line for line in f if keep(line.decode("utf-8", "replace")))
        head = list(kept) if lines <= 0 else deque(kept, maxlen=lines)
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
            if not keep(line):
                continue
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass


def _model_filter(inst: Instance | None, model: str | None):
    """Every line, or one model's lines of a router's log (server/router.py's ModelLog)."""
    if model is None:
        return lambda line: True
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.server.router import ModelLog

    served = [m["name"] for m in ((inst.router or {}).get("models") or [])] if inst is not None else []
    if inst is None or not served:
        raise BonsaiError("--model is for a running `bonsai serve` router", "see `bonsai ps`")
    if model not in served:
        raise BonsaiError(f"--model {model}: {inst.name} serves no such model", f"it serves: {', '.join(served)}")
    return ModelLog(model).keep
