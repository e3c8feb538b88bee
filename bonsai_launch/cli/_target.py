"""The server `bonsai run` and `bonsai chat` talk to (--url, the profile's running server, or a
temporary one), the answer streamed from it, and the line of speed and acceptance after it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

import typer

from bonsai_launch.cli._launch import LaunchOptions

UrlOpt = Annotated[str | None, typer.Option("--url", help="Use this server instead of the profile's.")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="Longest answer, in tokens.")]
TempOpt = Annotated[
    float | None, typer.Option("--temperature", "-t", help="Sampling temperature (default: the profile's).")
]
SystemOpt = Annotated[str | None, typer.Option("--system", help="A system prompt.")]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", help="API key for the server; env BONSAI_API_KEY.")]


@dataclass
class Target:
    base_url: str
    api_key: str | None
    temporary: bool
    name: str
    speculative: bool = False  # proven live by the probe (start's, or ours for --url)


@contextlib.contextmanager
def server_for(
    launch: LaunchOptions,
    passthrough: tuple[str, ...],
    *,
    url: str | None,
    api_key: str | None,
    forwarder=None,
) -> Iterator[Target]:
    """A server to talk to: --url, else the running server of the profile, else a temporary
    one (started like `bonsai start`, with its checks and speculation proof; always stopped).

    With speculation asked for, the answer never comes from a server that does not speculate:
    a --url server must pass the liveness probe (else the command stops with the fix), and a
    running plain server of the profile is passed over for a temporary speculative one."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.server import instances, supervisor
    from bonsai_launch.server.client import first_key
    from bonsai_launch.server.inputs import explicit_model, select
    from bonsai_launch.server.prepare import launch_settings, prepare_plan
    from bonsai_launch.server.process import free_port

    flags, model, drafter = launch.flags(), launch.model, launch.drafter
    settings = resolve(flags)
    key = first_key(api_key or settings.get("api_key"))
    wants_spec = bool(settings.get("speculative"))
    if url:
        from bonsai_launch.server import client

        client.health(url, key)  # a dead URL fails here, before chat opens its prompt
        if wants_spec:
            require_speculating(url, key)
        yield Target(url, key, False, url, speculative=wants_spec)
        return
    selection = select(flags)
    if not explicit_model(selection, model) and not drafter:  # BONSAI_GGUF counts as --model
        running = instances.for_profile(selection.profile.name)
        if running is not None and (running.speculative or not wants_spec):
            yield Target(running.base_url, key, False, running.name, speculative=running.speculative)
            return
        if running is not None:
            sys.stderr.write(
                f"the running server {running.name} ({running.base_url}) does not speculate: "
                "starting a temporary speculative server for this answer\n"
            )
    if flags.get("port") is None and not launch_settings(flags, passthrough).is_explicit("port"):
        flags = {**flags, "port": free_port()}  # a temporary server must not fight over 8080
    plan, _generated = prepare_plan(flags, model, drafter, passthrough)
    if plan.tuning:  # BONSAI_SPECULATIVE=auto: say what was decided (run and chat never tune themselves)
        sys.stderr.write(plan.tuning["message"] + "\n")

    def status(text: str) -> None:
        sys.stderr.write(f"temporary llama-server: {text}\n")
        sys.stderr.flush()

    launched = supervisor.launch(plan, spec_fallback=launch.spec_fallback, on_status=status, forwarder=forwarder)
    try:
        if launched.proof is not None and launched.proof.live:
            sys.stderr.write(launched.proof.summary() + "\n")
        elif launched.proof is not None:  # only with --spec-fallback: say so, loudly
            sys.stderr.write(f"warning: {launched.proof.summary()}; answering without speculation (--spec-fallback)\n")
        if launched.slots_proof is not None:
            sys.stderr.write(launched.slots_proof.summary() + "\n")
        yield Target(
            plan.base_url,
            plan.api_key or key,
            True,
            launched.instance.name,
            speculative=bool(launched.proof and launched.proof.live),
        )
    finally:
        supervisor.shutdown(launched)


def require_speculating(url: str, api_key: str | None) -> None:
    """Speculation was asked for and the user named a server: it must pass the same probe
    `bonsai start` and `bonsai verify` use (live only when it drafted tokens)."""
    from bonsai_launch.core.errors import ActionFailed
    from bonsai_launch.server import liveness as speculation_probe

    result = speculation_probe.probe(url, api_key)
    if not speculation_probe.is_live(result):
        raise ActionFailed(
            f"speculation was asked for, but the server at {url} does not speculate: "
            f"{speculation_probe.not_live_reason(result)}",
            "start it with speculation (`bonsai start --speculative ...`), drop --url to let bonsai "
            "start a temporary speculative server, or unset BONSAI_SPECULATIVE/--speculative",
        )


def stats_line(result, speculative: bool = False) -> str:
    """`32 tokens, 41.3 tokens/s; speculative: drafted 46, accepted 46 (100.0%)`. On a
    speculating server an answer that drafted nothing says so, rather than looking plain."""
    from bonsai_launch.server.client import acceptance

    t = result.timings or {}
    parts = []
    if t.get("predicted_n") is not None:
        parts.append(f"{t['predicted_n']} tokens")
    if t.get("predicted_per_second"):
        parts.append(f"{t['predicted_per_second']:.1f} tokens/s")
    line = ", ".join(parts) or "no timings from this server"
    drafted, accepted, rate = acceptance(t)
    if drafted and rate is not None:
        line += f"; speculative: drafted {drafted}, accepted {accepted} ({rate * 100:.1f}%)"
    elif speculative and t:
        line += "; speculative: nothing drafted for this answer (n-gram types draft only on repeated text)"
    return line


def stream_answer(target: Target, messages, *, max_tokens: int, temperature: float | None, on_reasoning, echo: bool):
    """One streamed answer from `target`: pieces to stdout as they come (when `echo`), the
    reasoning to `on_reasoning`; returns the StreamResult (text, timings)."""
    from bonsai_launch.server import client

    result = client.StreamResult()
    for piece in client.stream_chat(
        target.base_url,
        messages,
        max_tokens=max_tokens,
        temperature=temperature,
        api_key=target.api_key,
        result=result,
        on_reasoning=on_reasoning,
    ):
        if echo:
            sys.stdout.write(piece)
            sys.stdout.flush()
    return result
