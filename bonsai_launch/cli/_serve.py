"""What `bonsai serve` and `bonsai service install --serve` share: the dry run, the start, the summary."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


def dry_run_output(models: Sequence[str], flags: dict[str, Any], passthrough: tuple[str, ...], json_output: bool):
    from bonsai_launch.cli._output import emit_json, warn
    from bonsai_launch.server.router import prepare_router

    plan, _ = prepare_router(models, flags, passthrough, dry_run=True)
    if json_output:
        emit_json(plan.to_json())
        return
    for w in plan.warnings:
        warn(w)
    import shlex

    sys.stderr.write(f"# the preset file {plan.preset_path}:\n")
    sys.stderr.write("".join(f"#   {line}\n" for line in plan.preset.splitlines()))
    print(shlex.join(plan.argv))


def _status(json_output: bool):
    said: list[str] = []

    def line(text: str) -> None:
        if not json_output and text not in said[-1:]:  # each state once, not once per look
            said.append(text)
            sys.stderr.write(f"llama-server: {text}\n")
            sys.stderr.flush()

    return line


def serve_now(
    models: Sequence[str], flags: dict[str, Any], passthrough: tuple[str, ...], *, detach: bool, json_output: bool
) -> int:
    """`bonsai serve` without --dry-run. Returns the exit code (0 when the user stopped it)."""
    from bonsai_launch.cli._output import emit_json, warn
    from bonsai_launch.server import router, supervisor
    from bonsai_launch.server.process import SignalForwarder, StopRequested

    with SignalForwarder() as forwarder:
        try:
            plan, generated = router.prepare_router(models, flags, passthrough)
            for w in plan.warnings:
                warn(w)
            launched, records = router.launch(plan, detach=detach, on_status=_status(json_output), forwarder=forwarder)
        except StopRequested:
            return 0 if forwarder.server is not None else 130

        def report() -> None:
            from bonsai_launch.server.client import serves_page

            page = plan.base_url + "/" if serves_page(plan.base_url, plan.api_key) else None
            if json_output:
                data = {
                    "name": plan.name,
                    "pid": launched.server.pid,
                    "url": plan.base_url,
                    "openai_base_url": plan.base_url + "/v1",
                    "chat_page": page,
                    "log": str(launched.server.log_path),
                    "detached": detach,
                    "ready_s": round(launched.ready_s, 3),
                    "plan": plan.to_json(),
                    "models": list(records.values()),
                }
                if generated:
                    data["api_key"] = generated
                emit_json(data)
            else:
                print_ready(plan, launched, records, generated, page, detach)

        return supervisor.report_then_serve(launched, report, detach=detach, forwarder=forwarder)


def print_ready(
    plan, launched, records: dict[str, dict], generated: str | None, page: str | None, detach: bool
) -> None:
    from pathlib import Path

    from rich.table import Table

    from bonsai_launch.cli._output import console

    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 160)  # piped into a script or a file: never cut a row short
    out.print(
        f"[bold green]ready[/] in {launched.ready_s:.1f} s: llama-server router pid {launched.server.pid}, "
        f"name {plan.name}, log {launched.server.log_path}"
    )
    rows = [
        ("listening on", f"{plan.host}:{plan.port}"),
        ("OpenAI base URL", plan.base_url + "/v1"),
        ("chat page", page or "none (this llama-server serves none)"),
        ("models loaded", f"at most {plan.models_max or 'any number'} at once; the rest on their first request"),
        ("preset file", plan.preset_path),
    ]
    if generated:
        rows.append(("API key", f"{generated}   (generated, shown only this once: export BONSAI_API_KEY=...)"))
    elif plan.api_key:
        rows.append(("API key", "required on every request and every model (BONSAI_API_KEY)"))
    for label, value in rows:
        out.print(f"  {label:<16} {value}", markup=False)
    table = Table(box=None, pad_edge=False)
    for col in ("MODEL", "FILE", "SPECULATION", "CONTEXT", "NOW", "IDLE UNLOAD"):
        table.add_column(col, no_wrap=True)
    for m in plan.models:
        spec = m.plan.speculative
        record = records.get(m.name) or {}
        proof = record.get("proof") or {}
        spec_text = "off" if spec is None else spec.spec_type + (f", n-max {spec.n_max}" if spec.n_max else "")
        if spec is not None and proof:
            spec_text += ", live" if proof.get("live") else ", NOT live"
        idle = "pinned" if m.pinned else (f"after {m.idle_unload_s} s" if m.idle_unload_s else "never")
        table.add_row(m.name, Path(m.plan.path).name, spec_text, str(m.plan.ctx), record.get("state", "unloaded"), idle)
    out.print(table)
    for m in plan.models:
        proof = (records.get(m.name) or {}).get("proof")
        if proof:
            style = "green" if proof.get("live") else "yellow"
            out.print(f"[{style}]{m.name}: {proof.get('summary')}[/]")
    auth = ' -H "Authorization: Bearer $BONSAI_API_KEY"' if plan.api_key else ""
    body = '{"model":"%s","messages":[{"role":"user","content":"Hello!"}]}' % plan.models[0].name  # noqa: UP031 - a JSON template
    out.print(
        f"  try: curl {plan.base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
        markup=False,
    )
    if detach:
        out.print(
            f"running in the background: `bonsai ps`, `bonsai logs {plan.name} --model NAME`, `bonsai stop {plan.name}`"
        )
    else:
        out.print("press Ctrl+C to stop")
