"""The `bonsai` command. Commands register here; each lives in its own module.

Examples:
    bonsai build                         # compile llama-server for this machine
    bonsai pull --profile demo           # fetch a model (and its drafter)
    BONSAI_SPECULATIVE=1 bonsai start --profile demo
    bonsai start --profile ternary-27b --dry-run --json
"""

from __future__ import annotations

import sys

import typer

from bonsai_launch.cli import bench as bench_cmd
from bonsai_launch.cli import build as build_cmd
from bonsai_launch.cli import chat as chat_cmd
from bonsai_launch.cli import config as config_cmd
from bonsai_launch.cli import convert_drafter as convert_drafter_cmd
from bonsai_launch.cli import doctor as doctor_cmd
from bonsai_launch.cli import export as export_cmd
from bonsai_launch.cli import fleet as fleet_cmd
from bonsai_launch.cli import inspect as inspect_cmd
from bonsai_launch.cli import logs as logs_cmd
from bonsai_launch.cli import models as models_cmd
from bonsai_launch.cli import ps as ps_cmd
from bonsai_launch.cli import pull as pull_cmd
from bonsai_launch.cli import rm as rm_cmd
from bonsai_launch.cli import run as run_cmd
from bonsai_launch.cli import service as service_cmd
from bonsai_launch.cli import start as start_cmd
from bonsai_launch.cli import stop as stop_cmd
from bonsai_launch.cli import tune as tune_cmd
from bonsai_launch.cli import verify as verify_cmd
from bonsai_launch.cli._passthrough import PassthroughCommand
from bonsai_launch.core.errors import BonsaiError


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


class _Group(typer.core.TyperGroup):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, speculative_auto_args(list(args)))


app = typer.Typer(
    cls=_Group,
    name="bonsai",
    help="Build, pull and launch llama.cpp servers for Bonsai and other GGUF models, "
    "with speculative decoding where it pays.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("build")(build_cmd.command)
app.command("doctor")(doctor_cmd.command)
app.command("config")(config_cmd.command)
app.command("pull")(pull_cmd.command)
app.command("models")(models_cmd.command)
app.command("rm")(rm_cmd.command)
app.command("inspect")(inspect_cmd.command)
app.command("convert-drafter")(convert_drafter_cmd.command)
app.command("start", cls=PassthroughCommand)(start_cmd.command)
app.command("ps")(ps_cmd.command)
app.command("logs")(logs_cmd.command)
app.command("stop")(stop_cmd.command)
app.command("verify")(verify_cmd.command)
app.command("run", cls=PassthroughCommand)(run_cmd.command)
app.command("chat", cls=PassthroughCommand)(chat_cmd.command)
app.command("tune", cls=PassthroughCommand)(tune_cmd.command)
app.command("bench", cls=PassthroughCommand)(bench_cmd.command)
app.add_typer(fleet_cmd.app, name="fleet")
app.add_typer(service_cmd.app, name="service")
app.command("export")(export_cmd.command)


def run() -> None:
    """Console-script entry point: user errors become one line and an exit code."""
    try:
        app()
    except BonsaiError as err:
        from bonsai_launch.cli._output import error_line

        error_line(str(err))
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
