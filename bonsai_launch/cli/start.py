"""`bonsai start`: launch llama-server with the right flags.

Examples:
    bonsai start --profile demo
    BONSAI_SPECULATIVE=1 bonsai start --profile demo
    bonsai start --profile ternary-27b --dry-run --json
    bonsai start --model T.gguf --drafter D.gguf --speculative --dry-run --format powershell
    bonsai start --profile demo -- --threads 2      # arguments after -- go to llama-server
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from bonsai_launch.cli._options import FamilyOpt, JsonOpt, ProfileOpt, SizeOpt

ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Run this local GGUF instead of the profile's weights.")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", help="Use this local DSpark/DFlash drafter GGUF.")]
SpecOpt = Annotated[Optional[bool], typer.Option("--speculative/--no-speculative", help="Speculative decoding on/off; env BONSAI_SPECULATIVE.")]
SpecTypeOpt = Annotated[Optional[str], typer.Option("--spec-type", help="Speculative type; env BONSAI_SPEC_TYPE.")]
SpecNmaxOpt = Annotated[Optional[int], typer.Option("--spec-nmax", help="Draft length (must equal the drafter's block size); env BONSAI_SPEC_NMAX.")]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", "-c", help="Context size, 0 = auto; env BONSAI_CTX.")]
NglOpt = Annotated[Optional[int], typer.Option("--ngl", help="GPU layers; env BONSAI_NGL.")]
HostOpt = Annotated[Optional[str], typer.Option("--host", help="Bind address; env BONSAI_HOST.")]
PortOpt = Annotated[Optional[int], typer.Option("--port", help="Port; env BONSAI_PORT.")]
Kv4Opt = Annotated[Optional[bool], typer.Option("--kv4/--no-kv4", help="4-bit KV cache; env BONSAI_KV4.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the llama-server command instead of running it.")]
FormatOpt = Annotated[str, typer.Option("--format", help="Shell for --dry-run output: posix or powershell.")]


def start_flags(profile, family, size, speculative, spec_type, spec_nmax, ctx, ngl, host, port, kv4) -> dict:
    """CLI flags keyed by setting name (None = not given), for the settings resolver."""
    return {"profile": profile, "family": family, "size": size, "speculative": speculative,
            "spec_type": spec_type, "spec_nmax": spec_nmax, "ctx": ctx, "ngl": ngl,
            "host": host, "port": port, "kv4": kv4}


def command(
    ctx: typer.Context,
    profile: ProfileOpt = None,
    family: FamilyOpt = None,
    size: SizeOpt = None,
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    speculative: SpecOpt = None,
    spec_type: SpecTypeOpt = None,
    spec_nmax: SpecNmaxOpt = None,
    ctx_size: CtxOpt = None,
    ngl: NglOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    kv4: Kv4Opt = None,
    dry_run: DryRunOpt = False,
    shell_format: FormatOpt = "posix",
    json_output: JsonOpt = False,
) -> None:
    """Launch llama-server for a profile (or local GGUFs) with the right flags."""
    from bonsai_launch.errors import BonsaiError

    if shell_format not in ("posix", "powershell"):
        raise BonsaiError(f"--format={shell_format!r} is not known", "allowed: posix, powershell")
    flags = start_flags(profile, family, size, speculative, spec_type, spec_nmax, ctx_size, ngl, host, port, kv4)
    passthrough = tuple(ctx.args)
    if dry_run:
        show_dry_run(flags, model, drafter, passthrough, shell_format, json_output)
        return
    raise BonsaiError("bonsai start can only --dry-run in this version", "add --dry-run")


def show_dry_run(flags, model, drafter, passthrough, shell_format: str, json_output: bool) -> None:
    from bonsai_launch.binaries import find_server
    from bonsai_launch.cli._output import emit_json, warn
    from bonsai_launch.launch_inputs import gather_plan
    from bonsai_launch.plan import render_command
    from bonsai_launch.settings import resolve

    binary = find_server(resolve(flags)["llama_server"])
    plan = gather_plan(flags, model, drafter, passthrough, binary)
    warnings = list(plan.warnings)
    if binary is None:
        warnings.append("no llama-server is built yet: `bonsai start` builds one; capabilities not checked")
    if json_output:
        data = plan.to_json()
        data["warnings"] = warnings
        emit_json(data)
        return
    for w in warnings:
        warn(w)
    print(render_command(plan.argv, shell_format, {k: "<hidden>" for k in plan.env}))
