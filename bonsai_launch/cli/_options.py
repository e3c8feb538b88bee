"""Options that recur across commands, declared once so every command spells them the same."""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.config.settings import FAMILY_SIZES, family_sizes_text

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")]
ProfileOpt = Annotated[
    str | None, typer.Option("--profile", "-p", help="Profile name (see `bonsai models`); env BONSAI_PROFILE.")
]
FamilyOpt = Annotated[str | None, typer.Option("--family", help=f"{', '.join(FAMILY_SIZES)}; env BONSAI_FAMILY.")]
SizeOpt = Annotated[str | None, typer.Option("--size", help=f"{family_sizes_text()}; env BONSAI_MODEL.")]

# Launch options shared by start, run, chat and bench.
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Run this local GGUF instead of the profile's weights.")
]
DrafterOpt = Annotated[str | None, typer.Option("--drafter", help="Use this local DSpark/DFlash drafter GGUF.")]
MmprojOpt = Annotated[
    str | None, typer.Option("--mmproj", help="Use this local vision projector GGUF; env BONSAI_MMPROJ.")
]
SpecOpt = Annotated[
    bool | None,
    typer.Option(
        "--speculative/--no-speculative",
        help="Speculative decoding on/off; `--speculative auto`: what `bonsai tune` measured to pay; env BONSAI_SPECULATIVE.",
    ),
]
SpecAutoOpt = Annotated[
    bool, typer.Option("--speculative-auto", hidden=True, help="What `--speculative auto` becomes (see cli/main.py).")
]
SpecTypeOpt = Annotated[str | None, typer.Option("--spec-type", help="Speculative type; env BONSAI_SPEC_TYPE.")]
SpecNmaxOpt = Annotated[
    int | None,
    typer.Option("--spec-nmax", help="Draft length (must equal the drafter's block size); env BONSAI_SPEC_NMAX."),
]
CtxOpt = Annotated[int | None, typer.Option("--ctx", "-c", help="Context size, 0 = auto; env BONSAI_CTX.")]
NglOpt = Annotated[int | None, typer.Option("--ngl", help="GPU layers; env BONSAI_NGL.")]
HostOpt = Annotated[str | None, typer.Option("--host", help="Bind address; env BONSAI_HOST.")]
PortOpt = Annotated[int | None, typer.Option("--port", help="Port; env BONSAI_PORT.")]
ParallelOpt = Annotated[
    int | None,
    typer.Option(
        "--parallel", help="Server slots: requests served at once (default 1 with speculation); env BONSAI_PARALLEL."
    ),
]
Kv4Opt = Annotated[bool | None, typer.Option("--kv4/--no-kv4", help="4-bit KV cache; env BONSAI_KV4.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the llama-server command instead of running it.")]
FormatOpt = Annotated[str, typer.Option("--format", help="Shell for --dry-run output: posix or powershell.")]
DetachOpt = Annotated[
    bool,
    typer.Option(
        "--detach", "-d", help="Return once the server is ready and keep it running (see `bonsai ps`, `bonsai stop`)."
    ),
]
SpecFallbackOpt = Annotated[
    bool,
    typer.Option(
        "--spec-fallback", help="When speculation is not live, warn and keep serving without it instead of stopping."
    ),
]
