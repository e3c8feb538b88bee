"""What `bonsai serve` is asked to serve, and each model's plan, made by the one planner.

A source is what the user names on the command line:
    demo                        a profile (its files are fetched as `bonsai start` fetches them)
    ./model.gguf                a local GGUF file, served under its file name's stem
    ./target.gguf+./draft.gguf  a target with its drafter: speculation on, as --drafter does
    ./models/                   every model in a folder (projectors and drafters are skipped)
    chat=SOURCE                 any of these under another name
Each becomes the plan `bonsai start` would make for it (server/inputs.gather_plan with the same
settings and arguments after --); a refusal names the model it is about.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError


@dataclass(frozen=True)
class Source:
    shown: str  # as the user wrote it (the folder's file for a folder)
    name: str | None = None  # NAME= given
    profile: str | None = None
    model: str | None = None
    drafter: str | None = None


def parse_sources(words: Sequence[str], known_profiles: Sequence[str]) -> list[Source]:
    """The user's words as sources; a folder expands to its models, in name order."""
    out: list[Source] = []
    for word in words:
        name, eq, rest = word.partition("=")
        if not eq or "/" in name or os.sep in name or not name:
            name, rest = "", word
        target, plus, drafter = rest.partition("+")
        path = Path(target).expanduser()
        if not plus and target in known_profiles and not path.exists():
            out.append(Source(word, name or None, profile=target))
        elif path.is_dir() and not plus:
            found = folder_models(path)
            if not found:
                raise BonsaiError(f"{word}: the folder holds no model .gguf file", "name GGUF files or profiles")
            if name and len(found) > 1:
                raise BonsaiError(f"{word}: one name for {len(found)} models", "name the files one by one: NAME=FILE")
            out += [Source(str(f), name or None, model=str(f)) for f in found]
        elif path.is_file() or target.endswith(".gguf"):
            if not path.is_file():
                raise BonsaiError(f"{word}: {target} is not a file", "name an existing .gguf file")
            if plus and not Path(drafter).expanduser().is_file():
                raise BonsaiError(f"{word}: drafter {drafter} is not a file", "name an existing drafter .gguf file")
            out.append(
                Source(word, name or None, model=str(path), drafter=str(Path(drafter).expanduser()) if plus else None)
            )
        else:
            raise BonsaiError(
                f"{word!r} is neither a profile, a .gguf file nor a folder",
                f"profiles: {', '.join(known_profiles)} (`bonsai models`); or a path to a GGUF file",
            )
    return out


def folder_models(folder: Path) -> list[Path]:
    """The folder's models: every .gguf that is neither a vision projector nor a drafter."""
    from bonsai_launch.models.gguf import inspect_gguf

    found = []
    for path in sorted(folder.glob("*.gguf")):
        if "mmproj" in path.name.lower():
            continue
        try:
            if inspect_gguf(path).drafter is not None:
                continue
        except BonsaiError:
            pass  # an unreadable file is the planner's to refuse, by name
        found.append(path)
    return found


def model_flags(source: Source, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The settings flags for one source: the user's, with the profile it names, and speculation on
    for a target named with its drafter."""
    own = dict(flags)
    if source.profile:
        own["profile"] = source.profile
    if source.drafter and own.get("speculative") is None:
        own["speculative"] = True
    return own


def plan_models(
    sources: Sequence[Source],
    flags: Mapping[str, Any],
    passthrough: tuple[str, ...],
    binary: Path | None,
    env: Mapping[str, str],
    *,
    repack: bool = False,
) -> list[tuple[str, Any]]:
    """(source as shown, ModelPlan) for every source, in order."""
    from bonsai_launch.server.inputs import gather_plan

    out = []
    for source in sources:
        args = passthrough + (("--alias", source.name) if source.name else ())
        try:
            plan = gather_plan(
                model_flags(source, flags), source.model, source.drafter, args, binary, env=env, repack=repack
            )
        except BonsaiError as exc:
            raise type(exc)(f"model {source.name or source.shown}: {exc.message}", exc.fix, exc.exit_code) from None
        out.append((source.shown, plan.served))
    return out


def fetch_files(sources: Sequence[Source], flags: Mapping[str, Any], env: Mapping[str, str], layout: str) -> None:
    """The profiles' missing files, as `bonsai start` fetches them (drafter when speculating)."""
    from bonsai_launch.server.inputs import select
    from bonsai_launch.server.prepare import fetch_profile_files

    for source in sources:
        if source.profile is None:
            continue
        selection = select(model_flags(source, flags), env)
        s = selection.settings
        fetch_profile_files(
            selection.profile,
            layout=layout,
            want_drafter=bool(s["speculative"]),
            want_vision=bool(s["vision"]) and not s.get("mmproj"),
        )
