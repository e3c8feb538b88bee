"""`bonsai chat`: an interactive chat with history, streamed.

Uses the running server of the profile, or starts a temporary one for the session.
Type /reset to forget the history, /exit (or Ctrl+D) to leave; Ctrl+C stops an answer.

Examples:
    bonsai chat --profile demo
    BONSAI_SPECULATIVE=1 bonsai chat --profile demo
    bonsai chat --url http://127.0.0.1:8080 --system "Answer briefly."
"""

from __future__ import annotations

import signal
import sys

import typer

from bonsai_launch.cli._launch import LaunchOptions, launch_options
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


@launch_options
def command(
    ctx: typer.Context,
    launch: LaunchOptions,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    max_tokens: MaxTokensOpt = 1024,
    temperature: TempOpt = None,
    system: SystemOpt = None,
) -> None:
    """Chat in the terminal; each answer ends with its decode speed and acceptance."""
    from bonsai_launch.cli._output import console
    from bonsai_launch.server.process import SignalForwarder, StopRequested

    err = console(stderr=True)
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    # Ctrl+C interrupts an answer (KeyboardInterrupt); the system's other stop signals
    # (SIGTERM/SIGHUP, or Ctrl+Break on Windows) end the session cleanly.
    from bonsai_launch.core import process_control

    stop_signals = tuple(s for s in process_control.current().stop_signals() if s != signal.SIGINT)
    with SignalForwarder(stop_signals) as forwarder:
        try:
            with server_for(launch, passthrough_args(ctx), url=url, api_key=api_key, forwarder=forwarder) as target:
                err.print(
                    f"chatting with {target.name} ({target.base_url}); /reset clears history, /exit leaves", style="dim"
                )
                while True:
                    try:
                        line = input("> ")
                    except EOFError:
                        sys.stdout.write("\n")
                        break
                    except KeyboardInterrupt:
                        sys.stdout.write("\n")
                        break
                    text = line.strip()
                    if not text:
                        continue
                    if text in ("/exit", "/quit"):
                        break
                    if text == "/reset":
                        history = history[:1] if system else []
                        err.print("history cleared", style="dim")
                        continue
                    history.append({"role": "user", "content": text})
                    try:
                        result = stream_answer(
                            target,
                            history,
                            max_tokens=max_tokens,
                            temperature=temperature,
                            on_reasoning=lambda p: err.print(p, style="dim", end=""),
                            echo=True,
                        )
                    except KeyboardInterrupt:
                        sys.stdout.write("\n")
                        err.print("(answer interrupted)", style="dim")
                        history.pop()
                        continue
                    sys.stdout.write("\n")
                    history.append({"role": "assistant", "content": result.text})
                    err.print(stats_line(result, target.speculative), style="dim")
        except StopRequested:
            pass
