"""The fleet file (remote members) and how local replicas share the machine. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.core.errors import BonsaiError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMBER_KEYS = {"url", "name", "api_key_env", "parallel", "timeout"}

# The variable that selects a replica's GPU, per llama.cpp backend.
DEVICE_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "hip": "HIP_VISIBLE_DEVICES", "vulkan": "GGML_VK_VISIBLE_DEVICES"}


@dataclass(frozen=True)
class RemoteMember:
    name: str
    url: str
    api_key_env: str | None
    parallel: int = 1
    timeout: float | None = None  # seconds the proxy waits on one request to it (None: the fleet's default)


def parse_fleet_file(path: Path) -> list[RemoteMember]:
    """members: [{url, api_key_env, name?, parallel?}]. Errors name the file, entry and fix."""
    import yaml

    where = f"--hosts {path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BonsaiError(f"{where}: no such file", "write a fleet file; see docs/serving-a-team.md") from None
    except yaml.YAMLError as exc:
        raise BonsaiError(f"{where}: not valid YAML ({exc})", "fix the file; see docs/serving-a-team.md") from None
    members = (data or {}).get("members") if isinstance(data, dict) else None
    if not isinstance(members, list) or not members:
        raise BonsaiError(
            f"{where}: needs a non-empty 'members' list",
            "e.g. members: [{url: 'http://gpu-box:8080', api_key_env: GPU_BOX_KEY}]",
        )
    out: list[RemoteMember] = []
    for i, entry in enumerate(members):
        label = f"{where}: members[{i}]"
        if not isinstance(entry, dict):
            raise BonsaiError(f"{label} is not a mapping", "give url and api_key_env")
        unknown = sorted(set(entry) - _MEMBER_KEYS)
        if unknown:
            raise BonsaiError(
                f"{label}: unknown key(s) {', '.join(unknown)}", f"allowed: {', '.join(sorted(_MEMBER_KEYS))}"
            )
        url = str(entry.get("url") or "").rstrip("/")
        if not re.match(r"^https?://[^/\s]+", url):
            raise BonsaiError(
                f"{label}: url={entry.get('url')!r} is not an http(s) URL", "e.g. url: http://gpu-box:8080"
            )
        if url.endswith("/v1"):
            url = url[:-3]
        key_env = entry.get("api_key_env")
        if key_env is not None and not _ENV_NAME.match(str(key_env)):
            raise BonsaiError(
                f"{label}: api_key_env={key_env!r} is not an environment variable name",
                "name the variable that holds the member's key, e.g. GPU_BOX_KEY",
            )
        parallel = entry.get("parallel", 1)
        if not isinstance(parallel, int) or parallel < 1:
            raise BonsaiError(f"{label}: parallel={parallel!r} must be a whole number >= 1", "its llama-server's -np")
        timeout = entry.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise BonsaiError(
                f"{label}: timeout={timeout!r} must be a number of seconds > 0",
                "the longest one answer from this member may take, e.g. timeout: 120",
            )
        name = str(entry.get("name") or re.sub(r"[^A-Za-z0-9_.-]+", "-", url.split("://", 1)[1]))
        out.append(RemoteMember(name, url, str(key_env) if key_env else None, parallel, timeout))
    names = [m.name for m in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BonsaiError(f"{where}: member name(s) used twice: {', '.join(dupes)}", "give each member its own name")
    return out


def parse_gpus(text: str | None) -> list[str] | None:
    """--gpus 0,1 -> ["0", "1"]."""
    if text is None:
        return None
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if not ids or not all(re.match(r"^[0-9]+$", i) for i in ids):
        raise BonsaiError(f"--gpus={text!r} is not a list of device numbers", "e.g. --gpus 0,1")
    return ids


@dataclass(frozen=True)
class ReplicaShare:
    """What one local replica gets: extra llama-server arguments and environment."""

    args: tuple[str, ...]
    env: dict[str, str]
    label: str  # for the user: "GPU 1" or "threads 2, cores 2,3"
    cores: tuple[int, ...] = ()  # CPU replicas on Linux: the cores its threads are held to


def replica_shares(
    replicas: int, backend: str, *, gpus: list[str] | None, threads: int | None, cpus: list[int], pin: bool = True
) -> list[ReplicaShare]:
    """GPUs by device list (replica i on gpus[i mod len]), or CPU threads split so replicas do
    not fight over cores: T threads each (default: the usable cores `cpus` split evenly), and,
    with `pin` (Linux), each replica's threads held to its own cores when they fit."""
    if replicas < 1:
        raise BonsaiError(f"--replicas={replicas} must be at least 1", "e.g. --replicas 2")
    if gpus is not None and threads is not None:
        raise BonsaiError(
            f"--gpus={','.join(gpus)} and --threads-per-replica={threads} both given",
            "GPU replicas get a device each; CPU replicas split the cores: give one of them",
        )
    if gpus is not None:
        var = DEVICE_ENV.get(backend)
        if var is None:
            raise BonsaiError(
                f"--gpus={','.join(gpus)}: this llama-server's backend is {backend!r}, which has no device list",
                "drop --gpus (CPU replicas split the cores), or build for CUDA/HIP/Vulkan",
            )
        return [ReplicaShare((), {var: gpus[i % len(gpus)]}, f"GPU {gpus[i % len(gpus)]}") for i in range(replicas)]
    if threads is not None and threads < 1:
        raise BonsaiError(f"--threads-per-replica={threads} must be at least 1", "e.g. --threads-per-replica 4")
    if threads is None and backend not in ("cpu",):
        return [ReplicaShare((), {}, backend) for _ in range(replicas)]  # GPU offload: llama.cpp's defaults
    t = threads or max(1, len(cpus) // replicas)
    shares = []
    for i in range(replicas):
        args: tuple[str, ...] = ("--threads", str(t), "--threads-batch", str(t))
        label = f"threads {t}"
        own: tuple[int, ...] = ()
        if pin and t * replicas <= len(cpus):
            # Held to its own cores by bonsai (pin_threads), not by llama-server's --cpu-mask:
            # with one thread b11434 computes on its main thread, which that mask never reaches.
            own = tuple(cpus[i * t : (i + 1) * t])
            label += f", cores {','.join(map(str, own))}"
        shares.append(ReplicaShare(args, {}, label, own))
    return shares


def pin_threads(pid: int, cores: tuple[int, ...]) -> bool:
    """Hold every thread of `pid` to `cores` (Linux). Threads it starts later inherit the
    affinity of the thread that starts them. False where that is not possible."""
    import os

    if not cores or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return False
    done = False
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
            done = True
        except OSError:  # a thread that just ended
            pass
    return done


def usable_cpus() -> list[int]:
    """The cores this process may run on (a container's cpuset), in order."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))
