"""What `bonsai fleet up` started, on disk: <BONSAI_HOME>/fleet/fleet.json, beside the router
configs it wrote. Local replicas are also ordinary detached servers in `bonsai ps`; this file
adds how to restart each one and where the proxy is. The master key is never written."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.paths import bonsai_home


def fleet_dir() -> Path:
    return bonsai_home() / "fleet"


def state_path() -> Path:
    return fleet_dir() / "fleet.json"


@dataclass
class MemberState:
    name: str
    url: str
    local: bool
    api_key_env: str | None = None
    parallel: int = 1
    instance: str | None = None  # the local replica's name in `bonsai ps`
    pid: int | None = None
    flags: dict[str, Any] = field(default_factory=dict)  # local: the start flags, to restart it as it was
    args: list[str] = field(default_factory=list)  # local: extra llama-server arguments (threads, cores)
    env: dict[str, str] = field(default_factory=dict)  # local: device selection
    share: str = ""
    cores: list[int] = field(default_factory=list)  # local CPU replicas: the cores its threads are held to
    argv: list[str] = field(default_factory=list)  # local: the llama-server command line, for llama-swap
    timeout: float | None = None  # remote: the fleet file's per-member request timeout


@dataclass
class ProxyState:
    pid: int
    create_time: float
    host: str
    port: int
    log: str
    config: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class FleetState:
    model: str
    profile: str | None
    members: list[MemberState]
    proxy: ProxyState | None = None
    llama_swap: str | None = None
    excluded: list[dict[str, str]] = field(default_factory=list)  # members never healthy: name, url, why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FleetState:
        members = [MemberState(**m) for m in data.get("members", [])]
        proxy = ProxyState(**data["proxy"]) if data.get("proxy") else None
        return cls(data["model"], data.get("profile"), members, proxy, data.get("llama_swap"), data.get("excluded", []))


def load() -> FleetState | None:
    try:
        return FleetState.from_json(json.loads(state_path().read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save(state: FleetState) -> None:
    write_atomic(state_path(), json.dumps(state.to_json(), indent=2) + "\n")


def remove() -> None:
    try:
        state_path().unlink()
    except FileNotFoundError:
        pass


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
