"""What a llama-server binary can do, as probed from its own output.

Parsing lives here (pure, tested on real `--help` text); running the binary to get that text
lives in bonsai_launch.llamacpp.binaries, which caches the result by path, size and mtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.options import OptionTable, parse_option_table

_SPEC_TYPES = re.compile(r"\b(none(?:,\s*[a-z0-9][\w-]*)+)")
_VERSION = re.compile(r"version:\s*(\d+)\s*\(([^)]*)\)")
_BUILD = re.compile(r"build\s+(\d+)")


@dataclass(frozen=True)
class Capabilities:
    binary: str
    version: str | None = None  # the `--version` line
    build_number: int | None = None
    backend: str = "cpu"  # cpu, cuda, metal, vulkan, hip
    spec_types: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    devices: tuple[str, ...] = ()
    removed_flags: frozenset[str] = frozenset()  # listed by --help but rejected ("has been removed")
    # One draft context drafts for every slot (llama.cpp #22838); None: not probed (older cache).
    shared_drafting: bool | None = None
    options: OptionTable | None = None  # every option with its spellings and value count
    dspark_log_snr: bool = False  # loads log-SNR DSpark drafters (our patch 0002, or PrismML's fork)
    # serves PTQ1_0 weights natively on the CPU (1.75 bpw, no Q2_0 repack): a build whose ggml has
    # the type (binaries.serves_ptq1_0_on_cpu); models/weight_path.py decides the path from it
    ptq1_0_cpu: bool = False

    def accepts(self, flag: str) -> bool:
        return flag in self.flags

    def to_json(self) -> dict[str, Any]:
        return {
            "binary": self.binary,
            "version": self.version,
            "build_number": self.build_number,
            "backend": self.backend,
            "spec_types": sorted(self.spec_types),
            "flags": sorted(self.flags),
            "devices": list(self.devices),
            "removed_flags": sorted(self.removed_flags),
            "shared_drafting": self.shared_drafting,
            "options": self.options.to_text() if self.options is not None else None,
            "dspark_log_snr": self.dspark_log_snr,
            "ptq1_0_cpu": self.ptq1_0_cpu,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Capabilities:
        return cls(
            binary=data["binary"],
            version=data.get("version"),
            build_number=data.get("build_number"),
            backend=data.get("backend", "cpu"),
            spec_types=frozenset(data.get("spec_types", ())),
            flags=frozenset(data.get("flags", ())),
            devices=tuple(data.get("devices", ())),
            removed_flags=frozenset(data.get("removed_flags", ())),
            shared_drafting=data.get("shared_drafting"),
            options=OptionTable.from_text(data["options"]) if data.get("options") else None,
            dspark_log_snr=bool(data.get("dspark_log_snr", False)),
            ptq1_0_cpu=bool(data.get("ptq1_0_cpu", False)),
        )


def parse_help(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(flags, speculative types) from `llama-server --help`; see parse_help_full."""
    flags, spec_types, _removed = parse_help_full(text)
    return flags, spec_types


def parse_help_full(text: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(accepted flags, speculative types, removed flags) from `llama-server --help`, read from
    its option table (options.parse_option_table). Flags whose description says "has been
    removed" still parse but make the server exit with an error, so they are reported apart.
    The speculative types are the comma list `--spec-type` shows as its value.
    """
    table = parse_option_table(text)
    flags = {name for opt in table.options if not opt.removed for name in opt.names}
    removed = {name for opt in table.options if opt.removed for name in opt.names}
    spec = table.lookup("--spec-type")
    found = _SPEC_TYPES.search(spec.hint) if spec is not None else None
    spec_types = {t.strip() for t in found.group(1).split(",")} if found else set()
    return frozenset(flags), frozenset(spec_types), frozenset(removed - flags)


def parse_shared_drafting(text: str) -> bool:
    """Whether `--spec-type` takes a comma-separated list of types. That came with llama.cpp's
    parallel drafting rework (#22838), which put every slot's drafts in one speculative context;
    before it, and in the PrismML fork before its rebase, DSpark could not run on several slots."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("--spec-type"):
            description = " ".join([line, *(x for x in lines[i + 1 : i + 4] if x.startswith(" "))])
            return "comma-separated list" in description
    return False


def parse_version(text: str) -> tuple[str | None, int | None]:
    """The version line and build number from `llama-server --version` (stderr)."""
    for line in text.splitlines():
        if line.startswith("version:"):
            match = _BUILD.search(line)
            number = _VERSION.search(line)
            build = int(number.group(1)) if number else (int(match.group(1)) if match else None)
            return line.strip(), build
    return None, None


def parse_devices(text: str) -> tuple[str, ...]:
    """Device lines from `--list-devices` (indented `NAME: description` lines)."""
    devices = []
    for line in text.splitlines():
        if line.startswith("  ") and ":" in line:
            devices.append(line.strip())
    return tuple(devices)


# Device names llama.cpp gives each backend (`CUDA0`, `ROCm0`, `MTL0`, `Vulkan0`). Metal's
# never says "metal": matching the word alone took a Metal build for a CPU one (-ngl 0).
_DEVICE_PREFIXES = (
    ("cuda", "cuda"),
    ("rocm", "hip"),
    ("hip", "hip"),
    ("mtl", "metal"),
    ("metal", "metal"),
    ("vulkan", "vulkan"),
)


def backend_from_devices(devices: tuple[str, ...]) -> str:
    names = [d.split(":", 1)[0].strip().lower() for d in devices]
    for prefix, backend in _DEVICE_PREFIXES:
        if any(name.startswith(prefix) for name in names):
            return backend
    joined = " ".join(devices).lower()
    for needle, backend in _DEVICE_PREFIXES:
        if needle != "mtl" and needle in joined:
            return backend
    return "cpu"


def require_flag(caps: Capabilities | None, flag: str, setting: str) -> None:
    """A setting that needs `flag` is refused on a binary that does not accept it."""
    if caps is not None and not caps.accepts(flag):
        raise BonsaiError(
            f"{setting} needs {flag}, which {caps.binary} does not accept",
            "rebuild with `bonsai build --force`, or unset the setting",
        )
