"""Which file of a repository a profile entry means: a pure function over the repo's listing.

A profile names a file exactly or by patterns, most preferred first (`*-PQ2_0.gguf` before
`*-PTQ1_0.gguf`). The first pattern that matches exactly one file wins; a pattern that matches
several is ambiguous and stops the pull (the preference order cannot choose between them), and
when none matches the message lists the closest names the repository has. Nothing here talks
to the hub: `bonsai pull` lists the repository at the edge (hub.list_files) and hands the
listing in, and the result goes to the lock (lock.py).
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, replace

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.models.hub import RemoteFile, RemoteListing

SHOWN = 4  # closest names listed when nothing matches


@dataclass(frozen=True)
class Resolved:
    """A profile entry with the repository file it resolved to."""

    entry: ModelFile  # the profile's entry, its `name` set to the chosen file
    remote: RemoteFile
    pattern: str | None  # the pattern that chose it; None for an exact name


def closest(wanted: tuple[str, ...], names: list[str], shown: int = SHOWN) -> str:
    """The repo's names most like what was wanted, for a message: 'a, b, c (and 4 more)'."""
    ggufs = [n for n in names if n.endswith(".gguf")] or list(names)
    if not ggufs:
        return "no files at all"
    plain = [w.replace("*", "").replace("?", "") for w in wanted]

    def score(name: str) -> float:
        return max(difflib.SequenceMatcher(None, w, name).ratio() for w in plain)

    ranked = sorted(ggufs, key=lambda n: (-score(n), n))
    text = ", ".join(ranked[:shown])
    return text + (f" (and {len(ranked) - shown} more)" if len(ranked) > shown else "")


def _where(profile: Profile, entry: ModelFile) -> str:
    return f"profile {profile.name}'s {entry.role}"


def _own_profile_fix(profile: Profile, what: str) -> str:
    return (
        f"{what} in a copy of {profile.source_file.name} in a folder named by BONSAI_PROFILES_DIR "
        "(it replaces the built-in profile), or pass --revision with one that has the file"
    )


def resolve_entry(profile: Profile, entry: ModelFile, listing: RemoteListing) -> Resolved:
    """The file `entry` means in `listing`; ActionFailed (one line: repo, what was looked for,
    what exists, the fix) when it names none, or several."""
    repo, names = listing.repo, sorted(listing.files)
    at = f"{repo} at revision {listing.revision}"
    if not entry.patterns:
        if entry.name in listing.files:
            return Resolved(entry, listing.files[entry.name], None)
        raise ActionFailed(
            f"{entry.name} is not in {at} (HTTP 404); closest there: {closest((entry.name,), names)}",
            f"the profile {profile.source_file} names a file the repo does not have: fix the profile, "
            "or pass --revision with one that has it",
        )
    for pattern in entry.patterns:
        matches = sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))
        if len(matches) == 1:
            return Resolved(replace(entry, name=matches[0]), listing.files[matches[0]], pattern)
        if len(matches) > 1:
            raise ActionFailed(
                f"{len(matches)} files in {at} match {pattern} ({_where(profile, entry)}): {', '.join(matches)}; "
                "bonsai does not guess between them",
                _own_profile_fix(profile, "name the one you want (`name:` instead of `pattern:`)"),
            )
    raise ActionFailed(
        f"no file in {at} matches {entry.wanted} ({_where(profile, entry)}); it has: {closest(entry.patterns, names)}",
        _own_profile_fix(profile, "give the right name (`name:`) or pattern"),
    )


def resolve_all(profile: Profile, entries: list[ModelFile], listing: RemoteListing) -> list[Resolved]:
    """Every entry resolved, in order; the first that cannot be stops with its message. Two
    entries resolving to one file (a pattern catching another role's file) are refused too."""
    resolved = [resolve_entry(profile, e, listing) for e in entries]
    seen: dict[str, Resolved] = {}
    for r in resolved:
        other = seen.setdefault(r.entry.name, r)
        if other is not r:
            raise ActionFailed(
                f"{r.entry.name} in {listing.repo} is both profile {profile.name}'s {other.entry.role} "
                f"({other.entry.wanted}) and its {r.entry.role} ({r.entry.wanted})",
                _own_profile_fix(profile, "make the patterns tell the files apart"),
            )
    return resolved
