"""`bonsai run`: one prompt, one streamed answer, then decode speed and acceptance.

Uses the running server of the profile (see `bonsai ps`); when none runs, starts a temporary
one and stops it afterwards.

Examples:
    bonsai run --profile demo "Write a haiku about bonsai trees"
    BONSAI_SPECULATIVE=1 bonsai run --profile demo "List the numbers from 1 to 50"
    bonsai run --url http://127.0.0.1:8080 "Hello"
    bonsai run --profile demo --json "Hello"
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from bonsai_launch.cli._launch import LaunchOptions, launch_options
from bonsai_launch.cli._options import JsonOpt
from bonsai_launch.cli._passthrough import passthrough_args
from bonsai_launch.cli._target import (
    ApiKeyOpt,
    MaxTokensOpt,
    SystemOpt,
    TempOpt,
    UrlOpt,
    server_for,
    stats_line,
    stream_answer,
)

PromptArg = Annotated[str, typer.Argument(help="The prompt to answer.")]


@launch_options
def command(
    ctx: typer.Context,
    prompt: PromptArg,
    launch: LaunchOptions,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    max_tokens: MaxTokensOpt = 1024,
    temperature: TempOpt = None,
    system: SystemOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Stream one answer to PROMPT, then print decode speed and speculative acceptance."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.server import client
    from bonsai_launch.server.process import SignalForwarder, StopRequested

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    err = console(stderr=True)
    with SignalForwarder() as forwarder:
        try:
            with server_for(launch, passthrough_args(ctx), url=url, api_key=api_key, forwarder=forwarder) as target:
                reasoning = (lambda piece: err.print(piece, style="dim", end="")) if not json_output else None
                result = stream_answer(
                    target,
                    messages,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    on_reasoning=reasoning,
                    echo=not json_output,
                )
        except StopRequested:
            sys.stdout.write("\n")
            raise typer.Exit(130) from None
    if json_output:
        drafted, accepted, rate = client.acceptance(result.timings)
        emit_json(
            {
                "text": result.text,
                "reasoning": result.reasoning or None,
                "timings": result.timings,
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": rate,
                "server": target.base_url,
            }
        )
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    err.print(stats_line(result, target.speculative), style="dim")
