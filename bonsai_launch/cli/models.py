"""`bonsai models`: the profile catalog and which files are present locally.

Examples:
    bonsai models
    bonsai models --json
"""

from __future__ import annotations

from bonsai_launch.cli._options import JsonOpt


def command(json_output: JsonOpt = False) -> None:
    """List every profile: family, size, files, drafter, and what is downloaded."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.launch_inputs import local_path
    from bonsai_launch.profiles import load_all

    catalog = []
    for profile in load_all().values():
        files = []
        for f in profile.files:
            path = local_path(profile, f.name)
            files.append({"role": f.role, "name": f.name, "layout": f.layout, "present": path.is_file(),
                          "path": str(path), "size": path.stat().st_size if path.is_file() else f.size})
        catalog.append({"profile": profile.name, "family": profile.family, "size": profile.size,
                        "description": profile.description, "source": profile.repo or f"pypi:{profile.pypi_package}",
                        "drafter": next((f.name for f in profile.files if f.role == "drafter"), None),
                        "draft_free_type": profile.draft_free_type, "files": files})
    if json_output:
        emit_json(catalog)
        return
    from rich.table import Table

    table = Table(title="bonsai profiles")
    for col in ("profile", "family", "size", "files", "speculation"):
        table.add_column(col)
    for entry in catalog:
        lines = [f"{'[green]✓[/]' if f['present'] else '[dim]·[/]'} {f['role']}: {f['name']}"
                 + (f" [dim]({f['layout']})[/]" if f["layout"] != "any" else "") for f in entry["files"]]
        spec = entry["drafter"] and "drafter" or entry["draft_free_type"] or "-"
        table.add_row(entry["profile"], entry["family"], entry["size"], "\n".join(lines), spec)
    console().print(table)
