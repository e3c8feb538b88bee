"""`bonsai doctor`: is this machine ready to build and run llama-server? Each problem has a fix.

Examples:
    bonsai doctor
    bonsai doctor --json | jq '.problems'
    bonsai doctor --self-test               # rerun each current build's self-test (seconds)
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt

SelfTestOpt = Annotated[
    bool,
    typer.Option(
        "--self-test",
        help="Rerun the self-test of each build of the current pin (kernels, 2 slots on a hybrid target, "
        "speculation, GPU vs CPU) and keep its verdict.",
    ),
]


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _self_test_lines(entry: dict) -> list[str]:
    r = entry.get("self_test")
    if not r:
        return [f"  {entry['key']}: [dim]no self-test verdict (`bonsai doctor --self-test`)[/]"]
    flags = r.get("cpu_flags", {})
    seen = ", ".join(f"{k.upper().replace('_', '-')} {'yes' if v else 'no'}" for k, v in flags.items()) or "unknown"
    lines = [
        f"  {entry['key']}: {'[green]passed[/]' if r.get('passed') else '[red]failed[/]'} at {r.get('ran_at')} "
        f"in {r.get('seconds')} s; device {r.get('device')}; CPU {seen}"
        + (f"; [yellow]forced fault: {r['fault']}[/]" if r.get("fault") else "")
    ]
    for c in r.get("checks", []):
        colour = {"passed": "green", "failed": "red"}.get(c.get("status"), "yellow")
        lines.append(f"    {c['name']}: [{colour}]{c.get('status')}[/] {c.get('detail', '')}")
    return lines


def command(json_output: JsonOpt = False, self_test: SelfTestOpt = False) -> None:
    """Hardware, toolchains, builds and their capabilities and self-tests, models present, the default port."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.doctor import gather

    fault = resolve({})["self_test_fault"]
    report = gather(self_test=self_test, fault=fault, console=None if json_output else console(stderr=True))
    if json_output:
        emit_json(report.to_json())
        return
    from rich.table import Table

    out = console()
    hw = report.hardware
    gpus = (
        ", ".join(f"{g['name']} ({_gb(g['total_bytes'])}, cc {g['compute_capability']})" for g in hw["gpus"]) or "none"
    )
    out.print(
        f"[bold]hardware[/]  {hw['os']} {hw['arch']}, {hw['physical_cores']} cores "
        f"({hw['logical_cores']} threads), {hw['ram_gb']} GiB RAM; GPUs: {gpus}"
        + (" ; Metal" if hw.get("metal") else "")
    )

    tools = Table(title="toolchain", title_justify="left")
    for col in ("tool", "path", "version"):
        tools.add_column(col)
    for name, tool in report.toolchain.items():
        tools.add_row(name, tool["path"] or "[dim]not found[/]", tool["version"] or "")
    out.print(tools)
    b = report.backend
    out.print(f"[bold]backend[/]  `bonsai build` would build [bold]{b.get('backend')}[/] ({b.get('reason')})")
    if b.get("launch") and b.get("launch") != b.get("backend"):
        out.print(f"[bold]launch[/]  `bonsai start` uses [bold]{b['launch']}[/] ({b.get('launch_reason')})")
    for name, entry in report.backends.items():
        devices = ", ".join(entry["devices"]) or "none"
        check = entry.get("preflight")
        state = (
            ""
            if check is None
            else "; toolchain [green]ok[/]"
            if check["ok"]
            else f"; toolchain [yellow]incomplete[/]: {check['problem']}"
        )
        failed = entry.get("failed_build")
        state += f"; [yellow]last build failed[/] (log {failed['log']})" if failed else ""
        out.print(f"  {name}: devices {devices} [dim](from {entry['how']})[/]{state}")

    if report.builds:
        builds = Table(title="builds", title_justify="left")
        for col in ("key", "build", "source", "draft-dspark", "current"):
            builds.add_column(col)
        builds.add_column("runs profiles", overflow="fold")
        builds.add_column("llama-server", overflow="fold")
        for entry in report.builds:
            number = entry.get("build_number")
            current = entry["is_pin"] and entry["current_patches"]
            source = (entry["source"] or "?") + (f" ({entry['kind']})" if entry.get("flavour") == "fork" else "")
            builds.add_row(
                entry["key"],
                f"b{number}" if number is not None else "?",
                source,
                "[green]yes[/]" if "draft-dspark" in entry["spec_types"] else "[red]no[/]",
                "[green]yes[/]" if current else "[yellow]no[/]",
                ", ".join(entry.get("profiles", [])) or "[dim]none[/]",
                entry["llama_server"],
            )
        out.print(builds)
        out.print("[bold]self-test[/] [dim](after `bonsai build`; `bonsai doctor --self-test` reruns it)[/]")
        for entry in report.builds:
            for line in _self_test_lines(entry):
                out.print(line)
        if not any(entry.get("flavour") == "fork" for entry in report.builds) and report.fork_only_files:
            # Bonsai 2 and 2.5 run on bonsai's build (patch 0010): only the `builds: fork` files need the fork
            only = report.fork_only_files
            named = ", ".join(only[:2]) + (f" and {len(only) - 2} more" if len(only) > 2 else "")
            out.print(
                f"[dim]no PrismML fork build: every profile's default runs on bonsai's build; only {named} "
                "need one (`bonsai build --source prismml`)[/]",
                highlight=False,
            )
    else:
        out.print("[bold]builds[/]  none")
    if report.llama_server:
        ls = report.llama_server
        out.print(
            f"[bold]{ls.get('setting', 'BONSAI_LLAMA_SERVER')}[/]  {ls['path']}: "
            + (ls.get("error") or ls.get("version") or "?")
        )
    if report.models:
        for m in report.models:
            out.print(
                f"[bold]model[/]  {m['profile']}: {', '.join(m['files'])} ({_gb(m['bytes'])})"
                + ("" if m["complete"] else " [yellow](incomplete)[/]")
            )
    else:
        out.print("[bold]models[/]  none downloaded (`bonsai pull --profile demo`)")
    p = report.port
    if p:
        out.print(f"[bold]port[/]  {p['host']}:{p['port']} is " + ("free" if p["free"] else "[yellow]in use[/]"))

    if not report.problems:
        out.print("[green]no problems found[/]")
        return
    out.print()
    for problem in report.problems:
        colour = "red" if problem.severity == "error" else "yellow"
        out.print(f"[{colour}]{problem.severity}[/]: {problem.what}\n  [dim]fix:[/] {problem.fix}")
    if any(pr.severity == "error" for pr in report.problems):
        raise SystemExit(1)
