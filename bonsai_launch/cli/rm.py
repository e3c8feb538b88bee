"""`bonsai rm PROFILE`: delete a profile's downloaded files and free the space.

Examples:
    bonsai rm ternary-27b            # asks first
    bonsai rm ternary-27b --yes      # for scripts
    bonsai rm demo --json --yes

The whole folder goes: weights, drafter, projector, verification records and partial
downloads. A pull running for the same profile makes rm refuse instead of pulling the floor
from under it.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt

YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def command(
    profile: Annotated[str, typer.Argument(help="Profile whose files to delete (see `bonsai models`).")],
    yes: YesOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Delete the downloaded files of a profile."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.config.profiles import load_all
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.models import store as model_store

    known = load_all()
    stored = model_store.stored_profiles()
    if profile not in known and profile not in stored:
        raise BonsaiError(
            f"{profile!r} is not a known profile and has no folder in {model_store.folder('x').parent}",
            "stored: " + (", ".join(stored) or "nothing yet"),
        )
    folder = model_store.folder(profile)
    size = model_store.folder_size(folder) if folder.exists() else 0
    if not folder.exists():
        if json_output:
            emit_json({"profile": profile, "folder": str(folder), "freed_bytes": 0, "removed": False})
        else:
            console().print(f"nothing to remove: {folder} does not exist", markup=False)
        return
    if not yes:
        if not sys.stdin.isatty():
            raise BonsaiError(
                f"refusing to delete {folder} ({model_store.human(size)}) without confirmation", "add --yes"
            )
        if not typer.confirm(f"Delete {folder} ({model_store.human(size)})?", default=False):
            raise typer.Exit(1)
    with model_store.profile_lock(profile, wait=False):
        freed = model_store.remove(profile)
    if json_output:
        emit_json({"profile": profile, "folder": str(folder), "freed_bytes": freed, "removed": True})
    else:
        console().print(f"removed {folder}: freed {model_store.human(freed)}", markup=False)
