"""What a tuning decision depends on, as short stable strings.

A decision measured on one machine, with one llama-server build, one model file (and
drafter), one prompt set and one set of server settings says nothing certain about any other.
These functions name each input: the machine by its CPU model and GPUs, the build by its
bonsai build key and the binary's sha256, files by their sha256, and the server settings that
change decoding speed (slots, threads, batch sizes, other llama-server arguments) as a short
canonical string. Hashing a 27B model takes seconds, so file hashes are
cached by resolved path, size and mtime in BONSAI_HOME/tune/hashes.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import bonsai_home

HASH_CACHE_SCHEMA = 1


def tune_dir() -> Path:
    return bonsai_home() / "tune"


@dataclass(frozen=True)
class TuneKey:
    """The inputs a decision is valid for. Equal keys: the decision applies."""

    machine: str
    build: str
    model_sha256: str
    drafter_sha256: str | None
    prompts_sha256: str
    # The speed-relevant server settings given beyond the defaults ("" = none): a decision
    # measured with one slot says nothing about four, nor one measured with -t 2 about -t 1.
    conditions: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneKey:
        return cls(
            data["machine"],
            data["build"],
            data["model_sha256"],
            data.get("drafter_sha256"),
            data["prompts_sha256"],
            data.get("conditions", ""),  # decisions stored before conditions were keyed had none
        )

    @property
    def id(self) -> str:
        """A short name for the file that stores this key's decision."""
        fields = self.to_json()
        if not fields["conditions"]:
            del fields["conditions"]  # the ids of decisions stored before this field stay the same
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def launch_part(self) -> tuple[str, str, str, str | None, str]:
        """What must match for `start` to use a decision (any prompt set will do)."""
        return (self.machine, self.build, self.model_sha256, self.drafter_sha256, self.conditions)


def cpu_model() -> str:
    """The CPU's marketing name, e.g. 'Intel(R) Xeon(R) Platinum 8480+'; the architecture when
    the OS does not say."""
    system = platform.system()
    try:
        if system == "Linux":
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
        elif system == "Darwin":
            done = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_id(hardware=None) -> str:
    """`<CPU model> x<logical cores>` plus each GPU's name: what decides the speed of a build."""
    from bonsai_launch.core import hardware as hw_module

    hw = hardware or hw_module.detect()
    text = f"{cpu_model()} x{hw.logical_cores} ({hw.os} {hw.arch})"
    if hw.gpus:
        text += "; GPU " + ", ".join(g.name for g in hw.gpus)
    elif hw.metal:
        text += "; Metal"
    return text


def _cache_path() -> Path:
    return tune_dir() / "hashes.json"


def _pulled_sha256(path: Path, st: os.stat_result) -> str | None:
    """The sha256 `bonsai pull` recorded when it verified this file, if it is unchanged since."""
    from bonsai_launch.core.paths import models_dir
    from bonsai_launch.models import store as model_store

    try:
        if path.parent.parent.resolve() != models_dir().resolve():
            return None
        record = model_store.read_records(path.parent.name).get(path.name)
    except (OSError, BonsaiError):
        return None
    if record is not None and record.size == st.st_size and record.mtime_ns == st.st_mtime_ns:
        return record.sha256
    return None


def file_sha256(path: Path) -> str:
    """sha256 of a file: from `bonsai pull`'s verification record when it has one, else hashed
    and cached by resolved path, size and mtime (a changed file is rehashed)."""
    from bonsai_launch.models.store import sha256_file

    real = Path(path).resolve()
    st = real.stat()
    pulled = _pulled_sha256(Path(path), st)
    if pulled:
        return pulled
    stamp = f"{real}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = _cache_path()
    try:
        cache = json.loads(cache_file.read_text())
        if cache.get("schema") != HASH_CACHE_SCHEMA:
            cache = {}
    except (OSError, ValueError):
        cache = {}
    known = (cache.get("files") or {}).get(stamp)
    if isinstance(known, str):
        return known
    digest = sha256_file(real).hexdigest()
    files = dict(cache.get("files") or {})
    files = {k: v for k, v in files.items() if not k.startswith(f"{real}|")}  # forget older versions
    files[stamp] = digest
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"schema": HASH_CACHE_SCHEMA, "files": files}, indent=1))
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only home only costs a rehash next time
    return digest


def build_id(binary: Path) -> str:
    """`<bonsai build key>:<first 16 hex of the binary's sha256>`; `external:...` for a
    llama-server bonsai did not build. A rebuild that changes the binary changes the id."""
    binary = Path(binary).resolve()
    key = "external"
    manifest = binary.parent.parent / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
        if Path(data.get("binaries", {}).get("llama-server", "")).resolve() == binary:
            key = data.get("key") or key
    except (OSError, ValueError, AttributeError):
        pass
    return f"{key}:{file_sha256(binary)[:16]}"


def prompts_sha256(prompts) -> str:
    """sha256 of a prompt set (bench Prompt objects): ids, categories and messages, in order."""
    rows = [[p.id, p.category, [list(m) for m in p.messages]] for p in prompts]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode("utf-8")).hexdigest()


# llama-server options that do not change how fast tokens are decoded (logging, the web UI,
# endpoints, TLS, timeouts): a decision measured without them holds with them. Every other
# option passed after `--` is part of the conditions.
SPEED_NEUTRAL_OPTIONS = frozenset(
    {
        "--offline",
        "--verbosity",
        "--tags",
        "--path",
        "--api-prefix",
        "--ui-config",
        "--ui-config-file",
        "--ui-mcp-proxy",
        "--ui",
        "--ssl-key-file",
        "--ssl-cert-file",
        "--timeout",
        "--threads-http",
        "--metrics",
        "--props",
        "--slots",
        "--slot-save-path",
        "--media-path",
    }
)


def server_conditions(settings, passthrough) -> str:
    """The server settings a launch gives beyond the defaults that change decoding speed, as one
    canonical string: explicit slots (--parallel / BONSAI_PARALLEL / `-- -np`), the batch sizes
    and every other llama-server argument passed after `--` but the speed-neutral ones. Host,
    port, key, context and -ngl are not here: they do not change decode speed, or (-ngl) the
    launch warns when it differs from the measurement."""
    parts: list[str] = []
    if settings.is_explicit("parallel") and settings["parallel"] is not None:
        parts.append(f"--parallel {settings['parallel']}")
    for name, option in (("ubatch", "--ubatch-size"), ("batch", "--batch-size")):
        value = passthrough.plan_value(name)
        if value is not None:
            parts.append(f"{option} {value}")
    for arg in passthrough.rest():
        if arg.canonical in SPEED_NEUTRAL_OPTIONS or arg.canonical.startswith("--log"):
            continue
        parts.append(" ".join((arg.canonical, *arg.values)))
    return " ".join(parts)
