"""`bonsai serve`: every model behind one port (llama-server's router), each planned as `start` plans it.

Examples:
    bonsai serve demo ./models/coder.gguf                    # two models, loaded on their first request
    bonsai serve demo tiny=./target.gguf+./drafter.gguf      # a target with its drafter: speculation on
    bonsai serve ./models/ --models-max 2 --idle-unload 600  # a folder; at most 2 loaded; unload after 10 min idle
    bonsai serve demo coder=./coder.gguf --pin demo --preload coder --detach
    BONSAI_API_KEY=... bonsai serve demo ./coder.gguf --dry-run   # the router command and its preset file
Arguments after -- go to every model's llama-server, as for start.
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import (
    CtxOpt,
    DetachOpt,
    DryRunOpt,
    HostOpt,
    JsonOpt,
    Kv4Opt,
    NglOpt,
    ParallelOpt,
    PortOpt,
    SpecAutoOpt,
    SpecNmaxOpt,
    SpecOpt,
    SpecTypeOpt,
)
from bonsai_launch.cli._passthrough import passthrough_args

ModelsArg = Annotated[
    list[str],
    typer.Argument(
        help="Profiles, GGUF files, TARGET.gguf+DRAFTER.gguf pairs or folders; NAME=... serves one under NAME.",
        show_default=False,
    ),
]
ModelsMaxOpt = Annotated[int | None, typer.Option("--models-max", help="Models loaded at once; env BONSAI_MODELS_MAX.")]
IdleOpt = Annotated[
    str | None,
    typer.Option(
        "--idle-unload", help="Seconds idle before a model is unloaded (300,NAME=60); env BONSAI_IDLE_UNLOAD."
    ),
]
PinOpt = Annotated[str | None, typer.Option("--pin", help="Models never unloaded (a,b); env BONSAI_PIN.")]
PreloadOpt = Annotated[
    str | None, typer.Option("--preload", help="Models loaded at start (a,b or all); env BONSAI_PRELOAD.")
]


def command(
    ctx: typer.Context,
    models: ModelsArg,
    speculative: SpecOpt = None,
    spec_type: SpecTypeOpt = None,
    spec_nmax: SpecNmaxOpt = None,
    ctx_size: CtxOpt = None,
    ngl: NglOpt = None,
    parallel: ParallelOpt = None,
    kv4: Kv4Opt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    models_max: ModelsMaxOpt = None,
    idle_unload: IdleOpt = None,
    pin: PinOpt = None,
    preload: PreloadOpt = None,
    detach: DetachOpt = False,
    dry_run: DryRunOpt = False,
    json_output: JsonOpt = False,
    speculative_auto: SpecAutoOpt = False,
) -> None:
    """Serve several models behind one port: each loads on its first request (or at start with
    --preload/--pin), runs the plan `bonsai start` makes for it (its drafter, speculation, context,
    GPU layers, template), and is unloaded, its process ended, after --idle-unload seconds idle.
    One API key (BONSAI_API_KEY) guards every model, loopback by default."""
    flags = {
        "speculative": "auto" if speculative_auto else speculative,
        "spec_type": spec_type,
        "spec_nmax": spec_nmax,
        "ctx": ctx_size,
        "ngl": ngl,
        "parallel": parallel,
        "kv4": kv4,
        "host": host,
        "port": port,
        "models_max": models_max,
        "idle_unload": idle_unload,
        "pin": pin,
        "preload": preload,
    }
    from bonsai_launch.cli._serve import dry_run_output, serve_now

    passthrough = passthrough_args(ctx)
    if dry_run:
        dry_run_output(models, flags, passthrough, json_output)
        return
    raise typer.Exit(serve_now(models, flags, passthrough, detach=detach, json_output=json_output))
