"""The `bonsai` command. Commands register here; each lives in its own module.

Examples:
    bonsai build                         # compile llama-server for this machine
    bonsai pull --profile demo           # fetch a model (and its drafter)
    BONSAI_SPECULATIVE=1 bonsai start --profile demo
    bonsai start --profile ternary-27b --dry-run --json
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from bonsai_launch.core.errors import BonsaiError


@dataclass(frozen=True)
class CommandEntry:
    """One `bonsai` command, imported only when it runs (or its own --help is asked for): a
    command's module pulls in the library it drives, and `bonsai start` should not pay for
    `bench`'s. `summary` is its line in `bonsai --help` (the docstring holds the rest)."""

    name: str
    module: str  # under bonsai_launch.cli
    summary: str
    passthrough: bool = False  # takes llama-server's options (cli/_passthrough.py)
    subcommands: bool = False  # the module's `app` is a Typer group (fleet, service)


COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry("build", "build", "Compile llama-server and its tools for this machine."),
    CommandEntry("doctor", "doctor", "Hardware, toolchains, builds, models, and what each can do."),
    CommandEntry("config", "config", "Each BONSAI_* setting's value and where it came from."),
    CommandEntry("pull", "pull", "Download a profile's model, drafter and projector."),
    CommandEntry("models", "models", "List every profile and which of its files are here."),
    CommandEntry("rm", "rm", "Delete the downloaded files of a profile."),
    CommandEntry("inspect", "inspect", "What a GGUF file is: architecture, sizes, codec, drafter."),
    CommandEntry("convert-drafter", "convert_drafter", "Convert a legacy `dspark` drafter to the `dflash` layout."),
    CommandEntry("start", "start", "Launch llama-server for a profile with the right flags.", True),
    CommandEntry("serve", "serve", "Serve several models behind one port, loaded on demand.", True),
    CommandEntry("ps", "ps", "List running servers: speculation, restarts, sleep, models."),
    CommandEntry("logs", "logs", "Print a server's log."),
    CommandEntry("stop", "stop", "Stop a running server."),
    CommandEntry("verify", "verify", "Check a server: health, model, speed, speculation."),
    CommandEntry("run", "run", "Stream one answer to PROMPT, with speed and acceptance.", True),
    CommandEntry("chat", "chat", "Chat in the terminal, with speed and acceptance.", True),
    CommandEntry("tune", "tune", "Decide by measuring whether speculation pays here.", True),
    CommandEntry("bench", "bench", "Benchmark speculative against plain decoding.", True),
    CommandEntry("export", "export", "Print the vLLM/SGLang command for a profile's checkpoint."),
    CommandEntry("fleet", "fleet", "Replicas of a profile behind the LiteLLM proxy.", subcommands=True),
    CommandEntry("service", "service", "Run `bonsai start` as a login service.", subcommands=True),
)
_BY_NAME = {entry.name: entry for entry in COMMANDS}


def load_command(entry: CommandEntry) -> Any:
    """The Click command of ENTRY, built by Typer from its module (imported now)."""
    module = importlib.import_module(f"bonsai_launch.cli.{entry.module}")
    if entry.subcommands:
        group = typer.main.get_group(module.app)
        group.name = entry.name
        return group
    info = typer.models.CommandInfo(
        name=entry.name,
        callback=module.command,
        cls=_passthrough_command() if entry.passthrough else TyperCommand,
        short_help=entry.summary,
    )
    return typer.main.get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=_MARKUP)


def _passthrough_command() -> type:
    from bonsai_launch.cli._passthrough import PassthroughCommand

    return PassthroughCommand


def speculative_auto_args(args: list[str]) -> list[str]:
    """`--speculative auto` (or `=auto`) becomes the hidden flag `--speculative-auto`: a click
    flag cannot also take an optional value. Arguments after `--` belong to llama-server."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        if arg == "--speculative=auto" or (arg == "--speculative" and i + 1 < len(args) and args[i + 1] == "auto"):
            out.append("--speculative-auto")
            i += 1 if "=" in arg else 2
            continue
        out.append(arg)
        i += 1
    return out


# Plain Click help: Typer's rich help imports rich's console, markdown and tables, about
# 0.13 s of CPU before a single line is printed (docs/benchmarks.md, launcher overhead).
_MARKUP = None


class _Group(TyperGroup):
    """The `bonsai` group: commands load on demand, and `bonsai --help` lists them from COMMANDS
    without importing any."""

    _listing = False

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, speculative_auto_args(list(args)))

    def list_commands(self, ctx) -> list[str]:
        return [entry.name for entry in COMMANDS]

    def get_command(self, ctx, cmd_name: str):
        entry = _BY_NAME.get(cmd_name)
        if entry is None:
            return None
        if self._listing:
            return TyperCommand(entry.name, short_help=entry.summary)
        return load_command(entry)

    def format_help(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = _Group(
    name="bonsai",
    help="Build, pull and launch llama.cpp servers for Bonsai and other GGUF models, "
    "with speculative decoding where it pays.",
    no_args_is_help=True,
    rich_markup_mode=_MARKUP,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def run() -> None:
    """Console-script entry point: user errors become one line and an exit code."""
    try:
        app.main(prog_name="bonsai")
    except BonsaiError as err:
        from bonsai_launch.cli._output import error_line

        error_line(str(err))
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
