"""Finding the llama-server binary to run and probing what it can do.

BONSAI_LLAMA_SERVER points at any existing binary; otherwise the build installed by
`bonsai build` for the detected backend is used. Probing runs the binary's --help,
--version and --list-devices; the result is cached by path, size and mtime, so a binary is
run once per change, not once per `bonsai start`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path

from bonsai_launch.capabilities import Capabilities, backend_from_devices, parse_devices, parse_help_full, parse_version
from bonsai_launch.errors import BonsaiError
from bonsai_launch.llama_options import parse_option_table
from bonsai_launch.paths import bonsai_home

PROBE_SCHEMA = 2  # 2: the option table


def find_server(explicit: str | None) -> Path | None:
    """The binary to run: `explicit` (BONSAI_LLAMA_SERVER) if given, else the installed build
    for the detected backend, else None when nothing is built yet."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise BonsaiError(f"BONSAI_LLAMA_SERVER={explicit!r} is not a file", "point it at a llama-server binary or unset it")
        return path
    from bonsai_launch.build.builder import find_installed

    return find_installed("auto")


def _cache_file(binary: Path) -> Path:
    name = hashlib.sha256(str(binary).encode()).hexdigest()[:20]
    return bonsai_home() / "probes" / f"{name}.json"


def _run(binary: Path, *args: str) -> str:
    try:
        done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        raise BonsaiError(f"{binary} {' '.join(args)} did not finish in 60 s",
                          "point BONSAI_LLAMA_SERVER at a working llama-server") from None
    except OSError as exc:
        raise BonsaiError(f"{binary} cannot be run ({exc})", "point BONSAI_LLAMA_SERVER at a working llama-server") from None
    return done.stdout + done.stderr


def probe_uncached(binary: Path) -> Capabilities:
    help_text = _run(binary, "--help")
    flags, spec_types, removed = parse_help_full(help_text)
    if not flags:
        raise BonsaiError(f"{binary} --help lists no options: it does not look like llama-server",
                          "point BONSAI_LLAMA_SERVER at a llama-server binary, or run `bonsai build`")
    version, build = parse_version(_run(binary, "--version"))
    devices = parse_devices(_run(binary, "--list-devices")) if "--list-devices" in flags else ()
    return Capabilities(str(binary), version, build, backend_from_devices(devices), spec_types, flags, devices, removed,
                        parse_option_table(help_text))


def probe(binary: Path) -> Capabilities:
    """What `binary` can do; cached by its resolved path, size and mtime."""
    binary = Path(binary)
    real = binary.resolve()
    try:
        st = real.stat()
    except OSError as exc:
        raise BonsaiError(f"{binary} cannot be read ({exc})", "point BONSAI_LLAMA_SERVER at a llama-server binary") from None
    stamp = {"schema": PROBE_SCHEMA, "path": str(real), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache = _cache_file(real)
    try:
        data = json.loads(cache.read_text())
        if {k: data.get(k) for k in stamp} == stamp:
            return dataclasses.replace(Capabilities.from_json(data["capabilities"]), binary=str(binary))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    caps = probe_uncached(binary)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({**stamp, "capabilities": caps.to_json()}, indent=1))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs a re-probe next time
    return caps
