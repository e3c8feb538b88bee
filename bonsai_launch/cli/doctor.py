"""`bonsai doctor`: is this machine ready to build and run llama-server? Each problem has a fix.

Examples:
    bonsai doctor
    bonsai doctor --json | jq '.problems'
"""

from __future__ import annotations

from bonsai_launch.cli._options import JsonOpt


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def command(json_output: JsonOpt = False) -> None:
    """Hardware, toolchains, builds and their capabilities, models present, the default port."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.doctor import gather

    report = gather()
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
        if not any(entry.get("flavour") == "fork" for entry in report.builds):
            out.print(
                "[dim]no PrismML fork build: the Bonsai 2 and 2.5 profiles and PQ2_0 files need one "
                "(`bonsai build --source prismml`)[/]"
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
