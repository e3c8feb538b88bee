"""Finding the llama-server binary to run and probing what it can do.

BONSAI_LLAMA_SERVER points at any existing binary; otherwise the build installed by
`bonsai build` for the detected backend is used. Probing runs the binary's --help,
--version and --list-devices; the result is cached by path, size and mtime.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bonsai_launch.capabilities import Capabilities, backend_from_devices, parse_devices, parse_help, parse_version
from bonsai_launch.errors import BonsaiError


def find_server(explicit: str | None) -> Path | None:
    """The binary to run, or None when nothing is built yet."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise BonsaiError(f"BONSAI_LLAMA_SERVER={explicit!r} is not a file", "point it at a llama-server binary or unset it")
        return path
    return None


def probe(binary: Path) -> Capabilities:
    def run(*args: str) -> str:
        try:
            done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30)
        except OSError as exc:
            raise BonsaiError(f"{binary} cannot be run ({exc})", "point BONSAI_LLAMA_SERVER at a working llama-server") from None
        return done.stdout + done.stderr

    flags, spec_types = parse_help(run("--help"))
    version, build = parse_version(run("--version"))
    devices = parse_devices(run("--list-devices"))
    return Capabilities(str(binary), version, build, backend_from_devices(devices), spec_types, flags, devices)
