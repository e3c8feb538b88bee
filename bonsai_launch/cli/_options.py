"""Options that recur across commands, declared once so every command spells them the same."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile name (see `bonsai models`); env BONSAI_PROFILE.")]
FamilyOpt = Annotated[Optional[str], typer.Option("--family", help="ternary, bonsai or bonsai2; env BONSAI_FAMILY.")]
SizeOpt = Annotated[Optional[str], typer.Option("--size", help="27B, 8B, 4B or 1.7B; env BONSAI_MODEL.")]

# Launch options shared by start, run, chat and bench.
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Run this local GGUF instead of the profile's weights.")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", help="Use this local DSpark/DFlash drafter GGUF.")]
MmprojOpt = Annotated[Optional[str], typer.Option("--mmproj", help="Use this local vision projector GGUF; env BONSAI_MMPROJ.")]
SpecOpt = Annotated[Optional[bool], typer.Option("--speculative/--no-speculative", help="Speculative decoding on/off; `--speculative auto`: what `bonsai tune` measured to pay; env BONSAI_SPECULATIVE.")]
SpecAutoOpt = Annotated[bool, typer.Option("--speculative-auto", hidden=True, help="What `--speculative auto` becomes (see cli/main.py).")]
SpecTypeOpt = Annotated[Optional[str], typer.Option("--spec-type", help="Speculative type; env BONSAI_SPEC_TYPE.")]
SpecNmaxOpt = Annotated[Optional[int], typer.Option("--spec-nmax", help="Draft length (must equal the drafter's block size); env BONSAI_SPEC_NMAX.")]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", "-c", help="Context size, 0 = auto; env BONSAI_CTX.")]
NglOpt = Annotated[Optional[int], typer.Option("--ngl", help="GPU layers; env BONSAI_NGL.")]
HostOpt = Annotated[Optional[str], typer.Option("--host", help="Bind address; env BONSAI_HOST.")]
PortOpt = Annotated[Optional[int], typer.Option("--port", help="Port; env BONSAI_PORT.")]
ParallelOpt = Annotated[Optional[int], typer.Option("--parallel", help="Server slots: requests served at once (default 1 with speculation); env BONSAI_PARALLEL.")]
Kv4Opt = Annotated[Optional[bool], typer.Option("--kv4/--no-kv4", help="4-bit KV cache; env BONSAI_KV4.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the llama-server command instead of running it.")]
FormatOpt = Annotated[str, typer.Option("--format", help="Shell for --dry-run output: posix or powershell.")]
DetachOpt = Annotated[bool, typer.Option("--detach", "-d", help="Return once the server is ready and keep it running (see `bonsai ps`, `bonsai stop`).")]
SpecFallbackOpt = Annotated[bool, typer.Option("--spec-fallback", help="When speculation is not live, warn and keep serving without it instead of stopping.")]
