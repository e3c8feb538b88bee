"""The launch plan's plain values: what build_plan returns (LaunchPlan: a ServerPlan for the process
and a ModelPlan for the model it serves), what it takes (PlanInputs), and the argv builder every
part of the plan adds its flags through, with a reason each."""

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


def shown_env(env: Mapping[str, str], mask: str) -> dict[str, str]:
    """The process environment as bonsai shows it: switches with their values, everything else
    (the API key, tokens from the arguments after --) as `mask`. Unknown names stay masked."""
    from bonsai_launch.server.prompt_sample import SLOTS_DEBUG_ENV

    return {k: v if k == SLOTS_DEBUG_ENV else mask for k, v in env.items()}


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
    head_rows: int | None = None  # --spec-draft-head-rows for the draft model (None: llama's default; 0: whole)


@dataclass(frozen=True)
class ServerPlan:
    """The llama-server process: binary, address, key, and the flags that belong to the process
    rather than to a model (its /metrics, its log level, idle sleep). `bonsai start` runs it with
    one model's flags after these; `bonsai serve` runs it as a router whose models come from a
    preset file, so nothing here may depend on which model it serves."""

    binary: str
    host: str
    port: int
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # LLAMA_API_KEY, never on the command line
    reasons: tuple[Reason, ...] = ()  # for --host, --port and the flags below, and the environment
    sleep_idle_seconds: int | None = None
    verbose: bool = False
    metrics: bool = True

    @property
    def args(self) -> tuple[str, ...]:
        """The process's flags, in the order llama-server's help lists them."""
        args = ["--host", self.host, "--port", str(self.port)]
        if self.sleep_idle_seconds:
            args += ["--sleep-idle-seconds", str(self.sleep_idle_seconds)]
        if self.verbose:
            args.append("--verbose")
        if self.metrics:
            args.append("--metrics")
        return tuple(args)

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


@dataclass(frozen=True)
class ModelPlan:
    """One model as llama-server serves it: its files, its flags (model, alias, layers, context,
    slots, speculation, vision, KV, cache, template, the profile's and the user's arguments) with a
    reason each, and what bonsai proves and shows of it. The same value is the tail of `bonsai
    start`'s command line and one section of `bonsai serve`'s preset file."""

    name: str  # what clients put in "model" (llama-server's --alias)
    path: str  # the model file
    args: tuple[str, ...]  # llama-server flags, without the binary
    reasons: tuple[Reason, ...]
    warnings: tuple[str, ...]
    profile: str | None
    ctx: int
    ngl: int
    backend: str
    speculative: SpecPlan | None
    mmproj: str | None = None
    slots: SlotsPlan | None = None
    prompt_cache: dict[str, Any] | None = None
    prompt_sample: dict[str, Any] | None = None  # BONSAI_TUNE_SAMPLE: limit, every_s, path (server/prompt_sample.py)
    tuning: dict[str, Any] | None = None  # BONSAI_SPECULATIVE=auto: the decision and its evidence
    from_passthrough: tuple[str, ...] = ()  # plan values that came from arguments after --
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # secrets from the arguments after --
    memory: dict[str, Any] | None = None  # weights (their path), KV cache, and whether they fit (plan/weights.py)


@dataclass(frozen=True)
class LaunchPlan:
    """What `bonsai start` runs: one process serving one model. Every field a caller reads is the
    server's or the model's; the command line is the server's flags, then the model's."""

    server: ServerPlan
    served: ModelPlan

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.server.binary, *self.server.args, *self.served.args)

    @property
    def env(self) -> dict[str, str]:
        return {**self.server.env, **self.served.env}

    @property
    def reasons(self) -> tuple[Reason, ...]:
        return self.server.reasons + self.served.reasons

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.served.warnings

    binary = property(lambda self: self.server.binary)
    host = property(lambda self: self.server.host)
    port = property(lambda self: self.server.port)
    api_key = property(lambda self: self.server.api_key)
    base_url = property(lambda self: self.server.base_url)
    model = property(lambda self: self.served.path)
    model_name = property(lambda self: self.served.name)
    profile = property(lambda self: self.served.profile)
    ctx = property(lambda self: self.served.ctx)
    ngl = property(lambda self: self.served.ngl)
    backend = property(lambda self: self.served.backend)
    speculative = property(lambda self: self.served.speculative)
    mmproj = property(lambda self: self.served.mmproj)
    slots = property(lambda self: self.served.slots)
    prompt_cache = property(lambda self: self.served.prompt_cache)
    prompt_sample = property(lambda self: self.served.prompt_sample)
    tuning = property(lambda self: self.served.tuning)
    from_passthrough = property(lambda self: self.served.from_passthrough)
    memory = property(lambda self: self.served.memory)

    def on_port(self, port: int) -> LaunchPlan:
        """The same plan on another port (bench and tune give each server a free one)."""
        return dataclasses.replace(self, server=dataclasses.replace(self.server, port=port))

    def with_env(self, extra: Mapping[str, str]) -> LaunchPlan:
        """The same plan with more environment for the process (a fleet member's own variables)."""
        return dataclasses.replace(self, server=dataclasses.replace(self.server, env={**self.server.env, **extra}))

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "command": shlex.join(self.argv),
            "env": shown_env(self.env, "***"),  # secrets (the key, tokens) masked; each is named in the reasons
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
            "speculative": spec_json(self.speculative),
            "slots": self.slots.to_json() if self.slots else None,
            "prompt_cache": self.prompt_cache,
            "prompt_sample": self.prompt_sample,
            "tuning": self.tuning,
            "memory": self.memory,
        }


def spec_json(spec: SpecPlan | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    return {
        "type": spec.spec_type,
        "n_max": spec.n_max,
        "drafter": spec.drafter,
        "draft_ngl": spec.draft_ngl,
        "head_rows": spec.head_rows,
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
    chat_template: Path | None = None  # the guard around the model's template (models/chat_template.py)
    chat_template_missing: bool = False  # the model wants that wrapper, and it is not written yet
    chat_template_guards: tuple[str, ...] = ()  # what it guards: reasoning_effort, late_system (empty: the profile's)
    self_test: Mapping[str, Any] | None = (
        None  # the binary's build self-test verdict (llamacpp/builds/selftest_record.py)
    )
    weights: WeightPath | None = None  # the path the weights take (models/weight_path.py); None: the file as it is
    # What was decided or noticed before planning: inputs of the plan, never patches on it.
    notes: tuple[str, ...] = ()  # the selection's own warnings (settings that lost, doubts about the build)
    tuning: Mapping[str, Any] | None = None  # BONSAI_SPECULATIVE=auto: the decision looked up (decisions/auto.py)


class ArgvBuilder:
    """Collects flags with their reasons so the argv and the explanation never disagree."""

    def __init__(self) -> None:
        self.argv: list[str] = []
        self.reasons: list[Reason] = []
        self.warnings: list[str] = []

    def add(self, flag: str, value: Any | None, why: str) -> None:
        self.argv.append(flag)
        if value is not None:
            self.argv.append(str(value))
        self.reasons.append(Reason(flag, "" if value is None else str(value), why))
