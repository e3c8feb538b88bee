"""Which llama.cpp build a profile runs on, and which of its files that build loads.

Bonsai files come for two flavours of llama.cpp: mainline (upstream; the pinned sdist) and
PrismML's fork (release tags `prism-bNNNNN-<commit>`). Each profile file says which builds
load it (`builds:` mainline, fork, any or legacy) and the lowest fork release known to load it.
The functions here are pure: they take a build's kind and a profile and answer which file, or
why none. Finding and making builds stays in bonsai_launch.llamacpp.builds; this module only reads what
their manifests say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import BonsaiError

MAINLINE = "mainline"
FORK = "fork"
FORK_BUILD_COMMAND = "bonsai build --source prismml"
_RELEASE_TAG = re.compile(r"^prism-b(\d+)-")
# the patch of our series that folds Bonsai 2 files (vendor/llama.cpp/patches/)
FOLD_PATCH = "0010-llama-prism-hadamard-fold.patch"


@dataclass(frozen=True)
class BuildKind:
    """What matters about a build for file choice: its flavour and, for the fork, its release."""

    flavour: str  # MAINLINE or FORK
    release: int | None = None  # fork release number (prism-b10828-... -> 10828), when known
    # undoes the Hadamard fold of Bonsai 2 files (prism.hadamard.*): the fork does, and our
    # series from patch 0010 on; None for a build not made yet (bonsai makes the current series)
    folds: bool | None = None

    def label(self) -> str:
        if self.flavour == FORK:
            return "PrismML fork build" + (f" b{self.release}" if self.release else " (release unknown)")
        return "mainline llama.cpp build"


def release_of_tag(tag: str) -> int | None:
    """`prism-b10828-a153697` -> 10828; None for anything else (a branch, a commit)."""
    found = _RELEASE_TAG.match(tag or "")
    return int(found.group(1)) if found else None


def kind_of_manifest(manifest: dict[str, Any]) -> BuildKind:
    """A build's kind from its manifest; builds made before flavours were recorded are mainline."""
    source = manifest.get("source", {})
    if source.get("flavour") == FORK:
        return BuildKind(FORK, source.get("release"), folds=True)
    return BuildKind(MAINLINE, folds=FOLD_PATCH in source.get("patches", ()))


def cannot_load(entry: ModelFile, kind: BuildKind) -> str | None:
    """Why a build of `kind` cannot load `entry`, or None when it can."""
    if entry.layout == "legacy":
        return entry.note
    if entry.layout == FORK and kind.flavour != FORK:
        return f"it needs a PrismML fork build (`{FORK_BUILD_COMMAND}`)"
    if entry.layout == MAINLINE and kind.flavour == FORK:
        return "it loads on mainline builds only"
    if entry.folded and kind.flavour == MAINLINE and kind.folds is False:
        return "it is Hadamard-folded, and this build is older than our patch 0010 that undoes the fold: run `bonsai build`"
    if (
        kind.flavour == FORK
        and entry.min_fork_release
        and kind.release is not None
        and kind.release < entry.min_fork_release
    ):
        return f"it needs fork release b{entry.min_fork_release} or newer; this build is b{kind.release}"
    return None


def choose_file(profile: Profile, role: str, kind: BuildKind) -> ModelFile | None:
    """The profile's file for `role` that this build loads: one made for exactly this flavour
    first (PQ2_0 on the fork, not the g64 file both can load), then one for any build, in the
    order the profile lists them."""
    loadable = [f for f in profile.files if f.role == role and cannot_load(f, kind) is None]
    exact = [f for f in loadable if f.layout == kind.flavour]
    candidates = exact or loadable
    return candidates[0] if candidates else None


def why_no_file(profile: Profile, role: str, kind: BuildKind) -> str:
    reasons = [f"{f.name}: {cannot_load(f, kind)}" for f in profile.files if f.role == role]
    return f"profile {profile.name} has no {role} file a {kind.label()} loads (" + "; ".join(reasons) + ")"


def wanted_flavour(profile: Profile | None, layout: str | None) -> str:
    """The flavour to run: BONSAI_LAYOUT when set, else mainline when the profile's weights load
    there (the default profiles stay runnable on the mainline pin), else the fork."""
    if layout:
        return layout
    if profile is None or choose_file(profile, "model", BuildKind(MAINLINE)) is not None:
        return MAINLINE
    return FORK


def fork_release_wanted(profile: Profile) -> int | None:
    """The oldest fork release that loads one of the profile's weights files: a fork build older
    than this runs none of them. None when any release will do, or no fork build loads them."""
    fork_files = [f for f in profile.files if f.role == "model" and f.layout in (FORK, "any")]
    if not fork_files or any(not f.min_fork_release for f in fork_files):
        return None
    return min(f.min_fork_release or 0 for f in fork_files)


def too_old_for(release: int | None, profiles: Iterable[Profile]) -> list[str]:
    """Profiles whose weights a fork build of `release` is too old to load (an unknown release
    is given the benefit of the doubt, as cannot_load does)."""
    if release is None:
        return []
    return [p.name for p in profiles if (wanted := fork_release_wanted(p)) is not None and release < wanted]


def fork_only_files(profiles: Iterable[Profile]) -> list[str]:
    """The catalog's weights files that only a PrismML fork build loads (`builds: fork`): what a
    fork build adds over bonsai's own, which runs every profile's default (Bonsai 2 through the
    fold, patch 0010)."""
    return [f.name for p in profiles for f in p.files if f.role == "model" and f.layout == FORK]


def runnable_profiles(kind: BuildKind, profiles: Iterable[Profile]) -> list[str]:
    """Names of the profiles whose weights this build loads."""
    return [p.name for p in profiles if choose_file(p, "model", kind) is not None]


def builds_text(entry: ModelFile) -> str:
    """How `bonsai models` says which builds load a file."""
    fork = "fork" + (f" ≥ b{entry.min_fork_release}" if entry.min_fork_release else "")
    if entry.folded:
        return f"bonsai's build (fold: patch 0010{', served as Q2_0' if entry.layout == 'any' else ''}) or {fork}"
    return {
        "mainline": "mainline",
        "fork": fork,
        "any": f"mainline or {fork}" if entry.min_fork_release else "any build",
        "legacy": "legacy: refused",
    }[entry.layout]


def refuse_legacy_file(path: Path, origin: str, profiles: Iterable[Profile]) -> None:
    """Refuse a file the catalog knows as legacy (the group-128 ternary Q2_0), with the reason.

    Matched by exact name: the catalog lists the legacy files, and a plain `-Q2_0` name of a
    future repo (group 64 there) is not refused."""
    for profile in profiles:
        for entry in profile.files:
            if entry.layout == "legacy" and entry.name == path.name:
                raise BonsaiError(
                    f"{origin}={str(path)!r} is {entry.note}",
                    f"use the files of `bonsai pull --profile {profile.name}` instead",
                )
