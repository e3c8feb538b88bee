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

import contextlib
import sys
from dataclasses import dataclass
from typing import Annotated, Iterator, Optional

import typer

from bonsai_launch.cli._options import (CtxOpt, DrafterOpt, FamilyOpt, JsonOpt, ModelOpt, NglOpt, ProfileOpt,
                                        SizeOpt, SpecFallbackOpt, SpecNmaxOpt, SpecOpt, SpecTypeOpt)
from bonsai_launch.cli._passthrough import passthrough_args
from bonsai_launch.cli.start import start_flags

PromptArg = Annotated[str, typer.Argument(help="The prompt to answer.")]
UrlOpt = Annotated[Optional[str], typer.Option("--url", help="Use this server instead of the profile's.")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="Longest answer, in tokens.")]
TempOpt = Annotated[Optional[float], typer.Option("--temperature", "-t", help="Sampling temperature (default: the profile's).")]
SystemOpt = Annotated[Optional[str], typer.Option("--system", help="A system prompt.")]
ApiKeyOpt = Annotated[Optional[str], typer.Option("--api-key", help="API key for the server; env BONSAI_API_KEY.")]


@dataclass
class Target:
    base_url: str
    api_key: str | None
    temporary: bool
    name: str


@contextlib.contextmanager
def server_for(flags: dict, model: str | None, drafter: str | None, passthrough: tuple[str, ...], *,
               url: str | None, api_key: str | None, spec_fallback: bool,
               forwarder=None) -> Iterator[Target]:
    """A server to talk to: --url, else the running server of the profile, else a temporary
    one (started like `bonsai start`, with its checks and speculation proof; always stopped)."""
    from bonsai_launch import instances, supervisor
    from bonsai_launch.cli.start import launch_settings, prepare_plan
    from bonsai_launch.client import first_key
    from bonsai_launch.launch_inputs import explicit_model, select
    from bonsai_launch.server_process import free_port
    from bonsai_launch.settings import resolve

    key = first_key(api_key or resolve(flags).get("api_key"))
    if url:
        yield Target(url, key, False, url)
        return
    selection = select(flags)
    if not explicit_model(selection, model) and not drafter:  # BONSAI_GGUF counts as --model
        running = instances.for_profile(selection.profile.name)
        if running is not None:
            yield Target(running.base_url, key, False, running.name)
            return
    if flags.get("port") is None and not launch_settings(flags, passthrough).is_explicit("port"):
        flags = {**flags, "port": free_port()}  # a temporary server must not fight over 8080
    plan, generated = prepare_plan(flags, model, drafter, passthrough)

    def status(text: str) -> None:
        sys.stderr.write(f"temporary llama-server: {text}\n")
        sys.stderr.flush()

    launched = supervisor.launch(plan, spec_fallback=spec_fallback, on_status=status, forwarder=forwarder)
    try:
        if launched.proof is not None:
            sys.stderr.write(launched.proof.summary() + "\n")
        yield Target(plan.base_url, plan.api_key or key, True, launched.instance.name)
    finally:
        supervisor.shutdown(launched)


def stats_line(result) -> str:
    """`32 tokens, 41.3 tokens/s; speculative: drafted 46, accepted 46 (100.0%)`."""
    from bonsai_launch.client import acceptance

    t = result.timings or {}
    parts = []
    if t.get("predicted_n") is not None:
        parts.append(f"{t['predicted_n']} tokens")
    if t.get("predicted_per_second"):
        parts.append(f"{t['predicted_per_second']:.1f} tokens/s")
    line = ", ".join(parts) or "no timings from this server"
    drafted, accepted, rate = acceptance(t)
    if drafted:
        line += f"; speculative: drafted {drafted}, accepted {accepted} ({rate * 100:.1f}%)"
    return line


def command(
    ctx: typer.Context,
    prompt: PromptArg,
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
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    max_tokens: MaxTokensOpt = 1024,
    temperature: TempOpt = None,
    system: SystemOpt = None,
    spec_fallback: SpecFallbackOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Stream one answer to PROMPT, then print decode speed and speculative acceptance."""
    from bonsai_launch import client, supervisor
    from bonsai_launch.cli._output import console, emit_json

    flags = start_flags(profile, family, size, speculative, spec_type, spec_nmax, ctx_size, ngl, None, None, None)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    err = console(stderr=True)
    with supervisor.SignalForwarder() as forwarder:
        try:
            with server_for(flags, model, drafter, passthrough_args(ctx), url=url, api_key=api_key,
                            spec_fallback=spec_fallback, forwarder=forwarder) as target:
                result = client.StreamResult()
                reasoning = (lambda piece: err.print(piece, style="dim", end="")) if not json_output else None
                for piece in client.stream_chat(target.base_url, messages, max_tokens=max_tokens,
                                                temperature=temperature, api_key=target.api_key, result=result,
                                                on_reasoning=reasoning):
                    if not json_output:
                        sys.stdout.write(piece)
                        sys.stdout.flush()
        except supervisor.StopRequested:
            sys.stdout.write("\n")
            raise typer.Exit(130)
    if json_output:
        drafted, accepted, rate = client.acceptance(result.timings)
        emit_json({"text": result.text, "reasoning": result.reasoning or None, "timings": result.timings,
                   "drafted": drafted, "accepted": accepted, "acceptance": rate, "server": target.base_url})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    err.print(stats_line(result), style="dim")
