"""The launch plan's plain values: what build_plan returns (LaunchPlan), what it takes (PlanInputs),
and the argv builder every part of the plan adds its flags through, with a reason each."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import Profile
from bonsai_launch.config.settings import Settings
from bonsai_launch.core.hardware import Hardware
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.models.gguf import GGUFInfo
from bonsai_launch.models.weight_path import WeightPath
from bonsai_launch.server.passthrough import Passthrough
from bonsai_launch.server.slots import SlotsPlan


@dataclass(frozen=True)
class Reason:
    flag: str
    value: str
    why: str


@dataclass(frozen=True)
class SpecPlan:
    spec_type: str
    n_max: int | None
    drafter: str | None = None
    draft_ngl: int | None = None


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    env: dict[str, str]
    reasons: tuple[Reason, ...]
    warnings: tuple[str, ...]
    profile: str | None
    model: str
    host: str
    port: int
    ctx: int
    ngl: int
    backend: str
    speculative: SpecPlan | None
    mmproj: str | None = None
    slots: SlotsPlan | None = None
    prompt_cache: dict[str, Any] | None = None
    prompt_sample: dict[str, Any] | None = None  # BONSAI_TUNE_SAMPLE: limit, every_s, path (server/prompt_sample.py)
    tuning: dict[str, Any] | None = None  # BONSAI_SPECULATIVE=auto: the decision and its evidence
    model_name: str = ""  # what clients put in "model" (llama-server's --alias)
    from_passthrough: tuple[str, ...] = ()  # plan values that came from arguments after --
    memory: dict[str, Any] | None = None  # weights (their path), KV cache, and whether they fit (plan/weights.py)

    @property
    def binary(self) -> str:
        return self.argv[0]

    @property
    def api_key(self) -> str | None:
        """The key bonsai's own clients send (the first, when several are set)."""
        keys = self.env.get("LLAMA_API_KEY")
        return keys.split(",")[0].strip() if keys else None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "command": shlex.join(self.argv),
            "env": {k: "***" for k in self.env},  # secrets (the key, tokens); a switch is named in the reasons
            "reasons": [{"flag": r.flag, "value": r.value, "why": r.why} for r in self.reasons],
            "warnings": list(self.warnings),
            "profile": self.profile,
            "model": self.model,
            "mmproj": self.mmproj,
            "host": self.host,
            "port": self.port,
            "url": self.base_url,
            "ctx": self.ctx,
            "model_name": self.model_name,
            "api_key_required": "LLAMA_API_KEY" in self.env,
            "from_passthrough": list(self.from_passthrough),
            "ngl": self.ngl,
            "backend": self.backend,
            "speculative": None
            if self.speculative is None
            else {
                "type": self.speculative.spec_type,
                "n_max": self.speculative.n_max,
                "drafter": self.speculative.drafter,
                "draft_ngl": self.speculative.draft_ngl,
            },
            "slots": self.slots.to_json() if self.slots else None,
            "prompt_cache": self.prompt_cache,
            "prompt_sample": self.prompt_sample,
            "tuning": self.tuning,
            "memory": self.memory,
        }


@dataclass(frozen=True)
class PlanInputs:
    settings: Settings
    model: GGUFInfo
    hardware: Hardware
    binary: str
    profile: Profile | None = None
    drafter: GGUFInfo | None = None
    mmproj: Path | None = None
    capabilities: Capabilities | None = None  # None: not probed (dry run without a binary)
    passthrough: Passthrough = dataclasses.field(
        default_factory=Passthrough
    )  # arguments after --, parsed (bonsai_launch.server.passthrough)
    drafter_unavailable: str | None = None  # why the profile's drafter cannot be used here
    chat_template: Path | None = None  # the profile's reasoning-effort wrapper (models/chat_template.py)
    chat_template_missing: bool = False  # the profile wants that wrapper, and it is not written yet
    self_test: Mapping[str, Any] | None = (
        None  # the binary's build self-test verdict (llamacpp/builds/selftest_record.py)
    )
    weights: WeightPath | None = None  # the path the weights take (models/weight_path.py); None: the file as it is


class ArgvBuilder:
    """Collects flags with their reasons so the argv and the explanation never disagree."""

    def __init__(self, binary: str) -> None:
        self.argv: list[str] = [binary]
        self.reasons: list[Reason] = []
        self.warnings: list[str] = []

    def add(self, flag: str, value: Any | None, why: str) -> None:
        self.argv.append(flag)
        if value is not None:
            self.argv.append(str(value))
        self.reasons.append(Reason(flag, "" if value is None else str(value), why))
