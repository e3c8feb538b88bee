"""`bonsai verify`: check a running OpenAI-compatible server (ours or not).

Examples:
    bonsai verify                                  # the only server bonsai runs, else 127.0.0.1:8080
    bonsai verify --url http://127.0.0.1:8080 --expect-speculative
    bonsai verify --url http://host:8080/v1 --api-key KEY --json
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt

UrlOpt = Annotated[str | None, typer.Option("--url", help="Server base URL (with or without /v1).")]
ExpectSpecOpt = Annotated[bool, typer.Option("--expect-speculative", help="Fail unless speculative decoding is live.")]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", help="API key for the server; env BONSAI_API_KEY.")]


def default_url() -> tuple[str, str]:
    """The server to check when --url is not given, and why that one."""
    from bonsai_launch.config.settings import env_value
    from bonsai_launch.server import instances

    live = instances.running()
    if len(live) == 1:
        return live[0].base_url, f"bonsai server {live[0].name}"
    port = env_value("port")
    return f"http://127.0.0.1:{port}", "default address"


def command(
    url: UrlOpt = None,
    expect_speculative: ExpectSpecOpt = False,
    api_key: ApiKeyOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Check a server: health, model, decode speed, whether speculation is live.

    Drafted/accepted counts and the acceptance rate come from a short temperature-0
    generation. Exits 0 only when everything asked for holds."""
    from rich.markup import escape

    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.config.settings import env_value
    from bonsai_launch.server.verify import verify

    if url is None:
        url, _why = default_url()
    from bonsai_launch.server.client import first_key

    key = first_key(api_key or env_value("api_key"))
    report = verify(url, api_key=key, expect_speculative=expect_speculative)
    if json_output:
        emit_json(report.to_json())
    else:
        out = console()
        out.print(f"server       {report.url} ({report.server})")
        out.print(f"health       {report.health}" + (" (was asleep: this check woke it)" if report.woke else ""))
        out.print(f"model        {report.model or '-'}")
        if report.decode_tps is not None:
            out.print(
                f"decode       {report.decode_tps:.1f} tokens/s over {report.tokens} tokens (temperature 0, repetitive probe)"
            )
        if report.speculative is None:
            spec = "cannot tell (no draft counts from this server)"
        elif report.speculative:
            rate = report.acceptance or 0.0
            spec = f"live: drafted {report.drafted}, accepted {report.accepted} ({rate * 100:.1f}%)"
        else:
            spec = f"NOT live: {report.not_live_reason}"
        out.print(f"speculative  {spec}")
        for problem in report.problems:
            out.print(f"[red]FAIL[/] {escape(problem)}")
        out.print("[green]OK[/]" if report.ok else "[red]verify failed[/]")
    if not report.ok:
        raise typer.Exit(1)
