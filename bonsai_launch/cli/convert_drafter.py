"""`bonsai convert-drafter`: make PrismML's legacy DSpark drafter loadable by upstream llama.cpp.

Examples:
    bonsai convert-drafter Ternary-Bonsai-27B-dspark-bf16.gguf \\
        --target Ternary-Bonsai-27B-Q2_g64.gguf -o Ternary-Bonsai-27B-dspark-dflash-Q4_0.gguf
    bonsai convert-drafter LEGACY.gguf --target T.gguf -o D.gguf --quantize none --json
    bonsai convert-drafter LEGACY.gguf --target T.gguf -o D.gguf --keep-shared-tensors --force

Convert the `*-dspark-bf16.gguf` sidecar, never the `*-dspark-Q4_1.gguf` file (its fc tensor
uses a retired type). The target gives the drafter its tokenizer; the result only fits that
target (or one with the same vocabulary). Profiles ternary-27b and bonsai-27b do all this
for you on `bonsai pull --speculative`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt


def command(
    source: Annotated[str, typer.Argument(help="The legacy drafter, e.g. Ternary-Bonsai-27B-dspark-bf16.gguf.")],
    target: Annotated[
        str, typer.Option("--target", help="The target model GGUF the drafter will serve (gives the tokenizer).")
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write the dflash drafter (.gguf).")],
    keep_shared_tensors: Annotated[
        bool,
        typer.Option(
            "--keep-shared-tensors",
            help="Keep the drafter's own token embedding and output head (by default they are "
            "dropped and borrowed from the target: about 2.5 of the 27B drafter's 3.65 B parameters).",
        ),
    ] = False,
    quantize: Annotated[
        str, typer.Option("--quantize", help="Q4_0 (default, as PrismML does), Q8_0, or none (keep BF16).")
    ] = "Q4_0",
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
    json_output: JsonOpt = False,
) -> None:
    """Convert a legacy `dspark` drafter to the `dflash` layout for TARGET, then quantize it."""
    from pathlib import Path

    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.models.drafters.convert import convert_drafter
    from bonsai_launch.models.progress import RichReporter
    from bonsai_launch.models.store import human

    err = console(stderr=True)
    try:
        with RichReporter(err) as reporter:
            result = convert_drafter(
                Path(source).expanduser(),
                Path(target).expanduser(),
                Path(output).expanduser(),
                keep_shared_tensors=keep_shared_tensors,
                quantization=quantize,
                force=force,
                reporter=reporter,
            )
    except KeyboardInterrupt:
        err.print("interrupted: nothing was written", markup=False)
        raise typer.Exit(130) from None
    from bonsai_launch.models.drafters.cache import remember_sha256

    remember_sha256(result.source, result.provenance.source_sha256)  # later checks need no re-hash
    if json_output:
        emit_json(result.to_json())
        return
    out = console()
    dropped = f"; dropped {', '.join(result.dropped)} (borrowed from the target)" if result.dropped else ""
    out.print(
        f"wrote {result.output} ({human(result.size)}, {result.tensors} tensors, "
        f"{result.provenance.quantization}{', log-SNR conditioning' if result.log_snr else ''}){dropped}",
        markup=False,
    )
    out.print(
        f"use it: BONSAI_SPECULATIVE=1 bonsai start --model {result.target} --drafter {result.output}", markup=False
    )
