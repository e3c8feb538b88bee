"""Finding the llama-server binary to run and probing what it can do.

Which binary a launch runs is llamacpp/choice.py's one answer (choose_server); this module
checks a named binary exists and probes it. Probing runs the binary's --help,
--version and --list-devices; the result is cached by path, size and mtime, and by a summary of
the GPU devices visible (core/hardware.device_fingerprint), so a binary is run once per change,
not once per `bonsai start`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import subprocess
from pathlib import Path

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import bonsai_home, exe_name
from bonsai_launch.llamacpp.capabilities import (
    Capabilities,
    backend_from_devices,
    parse_devices,
    parse_help_full,
    parse_shared_drafting,
    parse_version,
)
from bonsai_launch.llamacpp.options import parse_option_table

PROBE_SCHEMA = 7  # 2: shared_drafting; 3: dspark_log_snr; 4: the option table; 5: flags read from it; 6: ptq1_0_cpu; 7: and its x86 kernels


def resolve_explicit(explicit: str, platform: str | None = None) -> Path | None:
    """BONSAI_LLAMA_SERVER as users write it: the binary, or on Windows the binary without
    `.exe` (as PowerShell lets them type it). None when no such file exists. A folder is
    BONSAI_LLAMA_BIN's job (server_choice.explicit_binary)."""
    path = Path(explicit).expanduser()
    if path.is_file():
        return path
    with_exe = path.with_name(exe_name(path.name, platform))
    return with_exe if with_exe.is_file() else None


def explicit_server(explicit: str, platform: str | None = None) -> Path:
    """The binary BONSAI_LLAMA_SERVER names (on Windows `.exe` may be left out); refused when missing."""
    path = resolve_explicit(explicit, platform)
    if path is None:
        raise BonsaiError(
            f"BONSAI_LLAMA_SERVER={explicit!r} is not a file",
            f"point it at a {exe_name('llama-server', platform)} binary (BONSAI_LLAMA_BIN at its folder), or unset it",
        )
    return path


def _cache_file(binary: Path) -> Path:
    name = hashlib.sha256(str(binary).encode()).hexdigest()[:20]
    return bonsai_home() / "probes" / f"{name}.json"


def _run(binary: Path, *args: str) -> str:
    """Output of `binary ARGS`. UTF-8 whatever the locale (Windows' is often cp1252; device
    names are UTF-8); text mode turns Windows' CRLF into plain newlines."""
    try:
        done = subprocess.run(
            [str(binary), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            encoding="utf-8",
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        raise BonsaiError(
            f"{binary} {' '.join(args)} did not finish in 60 s", "point BONSAI_LLAMA_SERVER at a working llama-server"
        ) from None
    except OSError as exc:
        raise BonsaiError(
            f"{binary} cannot be run ({exc})", "point BONSAI_LLAMA_SERVER at a working llama-server"
        ) from None
    output = done.stdout + done.stderr
    if done.returncode != 0 and not output.strip():
        # Nothing printed: it did not even start (a missing DLL or shared library, a crash).
        from bonsai_launch.core.process_control import exit_hint

        code = done.returncode
        shown = f"{code:#x}" if code >= 0xC0000000 else str(code)
        hint = exit_hint(code)
        raise BonsaiError(
            f"{binary} {' '.join(args)} exited with code {shown} and printed nothing" + (f" ({hint})" if hint else ""),
            "run it by hand to see why, or point BONSAI_LLAMA_SERVER at a working llama-server",
        )
    return output


def probe_uncached(binary: Path) -> Capabilities:
    help_text = _run(binary, "--help")
    flags, spec_types, removed = parse_help_full(help_text)
    if not flags:
        raise BonsaiError(
            f"{binary} --help lists no options: it does not look like llama-server",
            "point BONSAI_LLAMA_SERVER at a llama-server binary, or run `bonsai build`",
        )
    version, build = parse_version(_run(binary, "--version"))
    devices = parse_devices(_run(binary, "--list-devices")) if "--list-devices" in flags else ()
    return Capabilities(
        str(binary),
        version,
        build,
        backend_from_devices(devices),
        spec_types,
        flags,
        devices,
        removed,
        parse_shared_drafting(help_text),
        parse_option_table(help_text),
        dspark_log_snr=implements_log_snr(binary),
        ptq1_0_cpu=serves_ptq1_0_on_cpu(binary),
    )


# The GGUF key name llama.cpp compiles in when it reads log-SNR DSpark drafters (our patch 0002
# and PrismML's fork use the same name); no option or --help line reveals the feature.
_LOG_SNR_MARK = b"%s.log_snr_conditioning"


# The name ggml gives the weight type PTQ1_0 (PrismML's 1.75-bit ternary, type 143) in its type
# table, as a C string: compiled in only by a build whose ggml has the type (patch 0013; no
# mainline build to date). Its fast CPU kernels are patch 0011's sixteen-row tiles, compiled on
# x86 with AVX2 only, whose repack log line is the second mark: elsewhere (ARM, a build without
# AVX2) the type would run on its scalar reference, so those builds get the file repacked into
# Q2_0 (models/weight_path.py) like every build without the type.
_PTQ1_0_MARK = b"\0ptq1_0\0"
_ROWS16_MARK = b"with %s rows16"


def implements_log_snr(binary: Path) -> bool:
    """Whether `binary` (or the libllama beside it, for shared builds) can load log-SNR drafters."""
    return _compiled_in(binary, _LOG_SNR_MARK, "libllama*")


def serves_ptq1_0_on_cpu(binary: Path) -> bool:
    """Whether `binary`'s ggml (or the libggml beside it) has PTQ1_0 weights and the x86 kernels
    for them, so its CPU backend serves a PTQ1_0 file as it is, at 1.75 bits per weight."""
    return _compiled_in(binary, _PTQ1_0_MARK, "libggml*") and _compiled_in(binary, _ROWS16_MARK, "libggml*")


def _compiled_in(binary: Path, mark: bytes, libraries: str) -> bool:
    real = Path(binary).resolve()
    candidates = [real]
    for folder in (real.parent, real.parent.parent / "lib", real.parent.parent / "lib64"):
        candidates += sorted(folder.glob(libraries)) if folder.is_dir() else []
    for path in candidates:
        try:
            with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data.find(mark) >= 0:
                    return True
        except (OSError, ValueError):
            continue  # unreadable or empty: not evidence either way
    return False


def probe(binary: Path) -> Capabilities:
    """What `binary` can do; cached by its resolved path, size and mtime."""
    binary = Path(binary)
    real = binary.resolve()
    try:
        st = real.stat()
    except OSError as exc:
        raise BonsaiError(
            f"{binary} cannot be read ({exc})", "point BONSAI_LLAMA_SERVER at a llama-server binary"
        ) from None
    from bonsai_launch.core.hardware import device_fingerprint

    # The devices it lists depend on the machine as well as the binary: a GPU build probed
    # before its GPU (or driver) was there must not keep saying "no GPU" after.
    stamp = {
        "schema": PROBE_SCHEMA,
        "path": str(real),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "devices_seen": device_fingerprint(),
    }
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
