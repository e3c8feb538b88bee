"""Options that recur across commands, declared once so every command spells them the same."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile name (see `bonsai models`); env BONSAI_PROFILE.")]
FamilyOpt = Annotated[Optional[str], typer.Option("--family", help="ternary or bonsai; env BONSAI_FAMILY.")]
SizeOpt = Annotated[Optional[str], typer.Option("--size", help="27B, 8B, 4B or 1.7B; env BONSAI_MODEL.")]
