"""`bonsai models`: the profile catalog and which files are present locally.

Examples:
    bonsai models
    bonsai models --json

For each profile: its repository (marked when the name is not confirmed). For each file: the
name the profile gives, or the patterns it is resolved by and, once `bonsai pull` resolved them,
the file the lock recorded (BONSAI_HOME/models.lock.json, with its commit); the llama.cpp builds
that load it; present or not, its size (on disk, or as the profile or the lock declares it), and
whether its sha256 was verified (from the record `bonsai pull` keeps; nothing is re-hashed here).
The speculation column shows the drafter's state: absent, downloaded, converted (a legacy
drafter's conversion that is stale, with why) or current (converted for this model by this bonsai).
"""

from __future__ import annotations

from bonsai_launch.cli._options import JsonOpt


def catalog() -> list[dict]:
    from bonsai_launch.config.profiles import load_all
    from bonsai_launch.llamacpp.flavours import builds_text
    from bonsai_launch.models import lock as model_lock
    from bonsai_launch.models import store as model_store

    lock_data = model_lock.read_lock()
    entries = []
    for profile in load_all().values():
        records = model_store.read_records(profile.name)
        locked = model_lock.locked_files(profile, lock_data) if profile.repo else {}
        files = []
        for f in profile.files:
            record = locked.get(f.key)
            f = model_lock.applied(f, locked)
            s = model_store.state(profile.name, f.name, records) if f.name else None
            files.append(
                {
                    "role": f.role,
                    "name": f.name or None,  # None: a pattern `bonsai pull` has not resolved yet
                    "wanted": f.wanted,
                    "patterns": list(f.patterns),
                    "locked": None
                    if record is None
                    else {
                        "name": record.name,
                        "commit": record.commit,
                        "revision": record.revision,
                        "sha256": record.sha256,
                        "size": record.size,
                        "resolved_at": record.resolved_at,
                    },
                    "layout": f.layout,
                    "builds": builds_text(f),
                    "min_fork_release": f.min_fork_release,
                    "note": f.note,
                    "present": bool(s and s.present),
                    "verified": bool(s and s.verified),
                    "size": s.size if s and s.present else record.size if record else f.size,
                    "sha256": s.record.sha256 if s and s.record else record.sha256 if record else f.sha256,
                    "partial_bytes": s.partial_bytes if s else 0,
                    "path": str(s.path) if s else None,
                }
            )
        folder = model_store.folder(profile.name)
        drafter_state = _drafter_state(profile, files)
        entries.append(
            {
                "profile": profile.name,
                "family": profile.family,
                "size": profile.size,
                "description": profile.description,
                "source": profile.repo or f"pypi:{profile.pypi_package}",
                "repo": profile.repo,
                "repo_unconfirmed": profile.repo_unconfirmed or None,
                "lock": str(model_lock.lock_path()) if locked else None,
                "drafter": next((f.wanted for f in profile.files if f.role == "drafter"), None),
                "drafter_state": drafter_state,
                "draft_free_type": profile.draft_free_type,
                "folder": str(folder),
                "disk_bytes": model_store.folder_size(folder) if folder.is_dir() else 0,
                "files": files,
            }
        )
    return entries


def _drafter_state(profile, files: list[dict]) -> dict | None:
    """absent, downloaded, converted (stale: with the reasons) or current, for the drafter that
    needs conversion; absent or downloaded for a drafter used as published."""
    from bonsai_launch.models.drafters import cache as drafter_cache

    entry = next((f for f in profile.files if f.role == "drafter" and drafter_cache.needs_conversion(f)), None)
    if entry is None:
        drafters = [f for f in files if f["role"] == "drafter"]
        if not drafters:
            return None
        return {
            "state": "downloaded" if any(f["present"] for f in drafters) else "absent",
            "converted": None,
            "reasons": [],
        }
    model = profile.file("model", entry.layout)
    target = model_store_path(profile, model.name) if model else None
    st = (
        drafter_cache.profile_drafter_state(profile, entry, target)
        if target
        else drafter_cache.DrafterState("absent", None, None)
    )
    return {
        "state": st.state,
        "converted": str(drafter_cache.profile_output(profile, entry)),
        "reasons": list(st.reasons),
    }


def model_store_path(profile, name: str):
    from bonsai_launch.models import store as model_store

    return model_store.folder(profile.name) / name


def command(json_output: JsonOpt = False) -> None:
    """List every profile: family, size, files (present, size, verified), drafter."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.models.store import human

    entries = catalog()
    if json_output:
        emit_json(entries)
        return
    from rich.table import Table

    table = Table(
        title="bonsai profiles",
        caption="✓ present, sha256 verified   ? present, not verified   · not downloaded\n"
        "(in brackets: the llama.cpp builds that load the file; fork = `bonsai build --source prismml`)\n"
        "→ a pattern and the file `bonsai pull` resolved it to (the lock); ⋯ not resolved yet\n"
        "repository NOT CONFIRMED: inferred, a pull may answer 404",
    )
    for col in ("profile", "family", "size", "repository", "files", "speculation", "on disk"):
        table.add_column(col)
    for entry in entries:
        lines = []
        for f in entry["files"]:
            if f["name"] is None:
                lines.append(
                    f"[dim]⋯[/] {f['role']}: {f['wanted']} [dim]({f['builds']}) to be resolved by `bonsai pull`[/]"
                )
                continue
            if f["verified"]:
                mark, state = "[green]✓[/]", ""
            elif f["present"]:
                mark, state = "[yellow]?[/]", "not verified"
            else:
                mark, state = "[dim]·[/]", "partial " + human(f["partial_bytes"]) if f["partial_bytes"] else ""
            layout = f" [dim]({f['builds']})[/]"
            size = f" {human(f['size'])}" if f["size"] else ""
            shown = f"{f['wanted']} → {f['name']}" if f["patterns"] else f["name"]
            lines.append(f"{mark} {f['role']}: {shown}{layout}{size}" + (f" [dim]{state}[/]" if state else ""))
        spec = (entry["drafter"] and "drafter") or entry["draft_free_type"] or "-"
        if entry["drafter_state"]:
            ds = entry["drafter_state"]
            spec = f"drafter: {ds['state']}" + (
                f"\n[dim]{ds['reasons'][0]}[/]" if ds["state"] == "converted" and ds["reasons"] else ""
            )
        disk = human(entry["disk_bytes"]) if entry["disk_bytes"] else "-"
        repo = entry["source"] + ("\n[yellow]NOT CONFIRMED[/]" if entry["repo_unconfirmed"] else "")
        table.add_row(entry["profile"], entry["family"], entry["size"], repo, "\n".join(lines), spec, disk)
    console().print(table)
