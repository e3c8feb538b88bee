"""`bonsai export`: a profile as a vLLM or SGLang command line (experimental, not run here).

Examples:
    bonsai export --engine vllm --profile bonsai-8b --speculative
    bonsai export --engine sglang --profile ternary-27b --speculative --json
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt, ProfileOpt

EngineOpt = Annotated[str, typer.Option("--engine", help="vllm or sglang.")]
SpeculativeFlag = Annotated[
    bool,
    typer.Option("--speculative", help="Add the engine's speculative decoding settings with a safetensors drafter."),
]
UnpackedOpt = Annotated[
    bool, typer.Option("--unpacked", help="27B: the unpacked BF16 checkpoint instead of the AWQ INT4 one.")
]
ExportPortOpt = Annotated[int, typer.Option("--port", help="Port in the generated command.")]
MaxLenOpt = Annotated[int | None, typer.Option("--max-model-len", help="Context length in the generated command.")]


def command(
    engine: EngineOpt,
    profile: ProfileOpt = None,
    speculative: SpeculativeFlag = False,
    unpacked: UnpackedOpt = False,
    port: ExportPortOpt = 8000,
    max_model_len: MaxLenOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Print the vLLM/SGLang command for a profile's AWQ or unpacked checkpoint."""
    from bonsai_launch.cli._output import console, emit_json, warn
    from bonsai_launch.fleet.export import WARNING, build_export
    from bonsai_launch.server.inputs import select

    name = profile or select({}).profile.name  # BONSAI_PROFILE, else the default profile
    result = build_export(
        engine, name, speculative=speculative, unpacked=unpacked, port=port, max_model_len=max_model_len
    )
    if json_output:
        emit_json(result.to_json())
        return
    warn(WARNING)
    warn(result.memory)
    for note in result.notes:
        warn(note)
    console().print(result.command, markup=False, highlight=False)
