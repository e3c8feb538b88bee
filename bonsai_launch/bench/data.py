"""What a bench run is made of and produces: its options, the configurations it compares, the raw
measurements per server and per load round, and who hears about its progress."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.measure import (
    RequestResult,
)
from bonsai_launch.core.errors import BonsaiError

SPECIAL_CONFIGS = ("plain", "speculative", "auto")  # auto: the stored tuning decision (bonsai tune)


SPEC_CONFIG_TYPES = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-dspark",
    "draft-dflash",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
)


READY_TIMEOUT = 600.0


@dataclass(frozen=True)
class BenchOptions:
    configs: tuple[str, ...] = ("plain", "speculative")
    categories: tuple[str, ...] | None = None
    temps: tuple[float, ...] = (0.0, 0.7)
    repeats: int = 3
    max_tokens: int = 128
    concurrency: tuple[int, ...] = (1, 4)
    parallel: tuple[int, ...] | None = None  # slot counts: each config's concurrency rounds run once per count
    per_category: int | None = None  # prompts per category (None: all)
    turns: int = 4  # multi-turn conversation length
    interleave: bool = False  # multi-turn: turn 1 of every conversation, then turn 2 of every one... (prompt cache)
    conversations: int | None = None  # how many bundled conversations (None: all)
    tradeoff_tokens: int = 48  # max tokens per multi-turn / concurrency request
    api: str = "chat"  # chat | completion
    seed: int = 42
    quick: bool = False
    tradeoffs: bool = True
    prompts_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


QUICK = dict(per_category=2, temps=(0.0,), max_tokens=96, concurrency=(1, 2), conversations=1, tradeoff_tokens=32)


@dataclass
class ConfigSpec:
    """One configuration under test."""

    name: str
    baseline: bool = False
    spec_type: str | None = None  # what the server speculates with (None: nothing)
    flags: dict[str, Any] = field(default_factory=dict)  # launch mode: settings flags
    url: str | None = None  # URL mode
    plan: Any = None  # launch mode: the LaunchPlan (port replaced per server)
    slot_plans: dict[int, Any] = field(default_factory=dict)  # --parallel: a LaunchPlan per slot count

    @property
    def label(self) -> str:
        return self._label(self.spec_type)

    def _label(self, spec_type: str | None) -> str:
        if self.name in ("speculative", "auto") and (spec_type or self.name == "auto"):
            return f"{self.name} ({spec_type or 'plain'})"
        return self.name

    def slot_labels(self) -> dict[str, str]:
        """The label per --parallel slot count: auto runs the decision tuned for each count,
        which may be another type than the default launch's (auto on 4 slots: ngram-map-k4v)."""
        out = {}
        for n, plan in sorted(self.slot_plans.items()):
            out[str(n)] = self._label(plan.speculative.spec_type if plan.speculative else None)
        return out

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "label": self.label,
            "baseline": self.baseline,
            "spec_type": self.spec_type,
        }
        if self.url:
            data["url"] = self.url
        if self.plan is not None:
            argv = list(self.plan.argv)
            for i, arg in enumerate(argv[:-1]):
                if arg == "--port":
                    argv[i + 1] = "<free port>"  # every server gets its own
            data["argv"] = argv
            data["ctx"] = self.plan.ctx
            data["speculative"] = self.plan.to_json()["speculative"]
            data["slots"] = effective_slots(self.plan)
        if self.slot_plans:
            data["slot_argv"] = {str(n): _argv_without_port(p) for n, p in sorted(self.slot_plans.items())}
            data["slot_labels"] = self.slot_labels()
        return data

    def plan_for_slots(self, slots: int | None) -> Any:
        return self.slot_plans.get(slots, self.plan) if slots is not None else self.plan


def _argv_without_port(plan) -> list[str]:
    argv = list(plan.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--port":
            argv[i + 1] = "<free port>"
    return argv


def effective_slots(plan) -> int | None:
    slots = getattr(plan, "slots", None)
    if slots is None:
        return None
    return slots.count or 4  # llama-server's auto


@dataclass
class ServerRun:
    """One server lifetime (launch mode) or one pass over a server (URL mode)."""

    config: str
    repeat: int
    purpose: str  # "temp=0.0", "trade-offs"
    slots: int | None = None  # the server's slots, when known
    pid: int | None = None
    startup_s: float | None = None  # spawn -> /health 200 (launch mode)
    peak_rss_bytes: int | None = None
    peak_gpu_bytes: int | None = None
    log: str | None = None
    spec_proof: dict[str, Any] | None = None  # launch mode: the liveness probe of a speculative server

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LoadRun:
    """One concurrency level on one server: `level` clients at once."""

    config: str
    repeat: int
    level: int
    requests: int
    tokens: int
    wall_s: float
    errors: int
    slots: int | None = None  # the server's slots (None: unknown, URL mode)

    @property
    def throughput(self) -> float | None:
        return self.tokens / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["throughput_tps"] = self.throughput
        return data


@dataclass
class BenchData:
    mode: str  # launch | url
    options: BenchOptions
    configs: list[ConfigSpec]
    prompts: list[suite.Prompt]
    requests: list[RequestResult] = field(default_factory=list)
    servers: list[ServerRun] = field(default_factory=list)
    loads: list[LoadRun] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def baseline(self) -> ConfigSpec | None:
        return next((c for c in self.configs if c.baseline), None)


class Listener(Protocol):
    """Progress callbacks; the CLI draws a progress bar, tests pass nothing."""

    def total(self, n: int) -> None: ...

    def step(self, text: str) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def note(self, text: str) -> None: ...


class SilentListener:
    """The listener when nobody listens."""

    def total(self, n: int) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def parse_config_names(text: str | Sequence[str]) -> tuple[str, ...]:
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if not names:
        raise BonsaiError("--configs is empty", "for example --configs plain,speculative,ngram-map-k")
    for name in names:
        # several types at once are joined by '+' (ngram-simple+ngram-mod): the list is split at commas
        if name not in SPECIAL_CONFIGS and not all(t in SPEC_CONFIG_TYPES for t in name.split("+")):
            raise BonsaiError(
                f"--configs: {name!r} is not a known configuration",
                "use plain, speculative or a speculative type: "
                + ", ".join(SPEC_CONFIG_TYPES)
                + " (several at once joined by +: ngram-simple+ngram-mod)",
            )
    if len(set(names)) != len(names):
        raise BonsaiError("--configs names a configuration twice", "list each once")
    if len(names) < 2 and names[0] != "plain":
        names.insert(0, "plain")  # a speculative run means nothing without its baseline
    return tuple(names)


def not_drafting_note(requests: list[RequestResult], config: str) -> str | None:
    """URL mode cannot probe a server it did not start; the measured requests are judged by
    the rule of `bonsai start`/`verify` instead: live only when tokens were drafted."""
    counted = [r for r in requests if r.config == config and r.drafted is not None and not r.error]
    if counted and sum(r.drafted or 0 for r in counted) == 0:
        return (
            f"{config} drafted no tokens in any of its {len(counted)} requests: speculative decoding is NOT live "
            "there, so its numbers are those of plain decoding"
        )
    return None


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def environment(binary: str | None) -> dict[str, Any]:
    """What the numbers were measured on, so a reader can compare like with like."""
    from bonsai_launch import __version__
    from bonsai_launch.core import hardware

    hw = hardware.detect()
    env: dict[str, Any] = {
        "bonsai_version": __version__,
        "python": platform.python_version(),
        "hardware": hw.to_json(),
        "load_average_start": loadavg(),
    }
    if binary:
        from bonsai_launch.llamacpp.binaries import probe

        try:
            caps = probe(Path(binary))
            env["llama_server"] = {
                "binary": binary,
                "version": caps.version,
                "build": caps.build_number,
                "backend": caps.backend,
            }
        except BonsaiError:
            env["llama_server"] = {"binary": binary}
    extra = {k: v for k, v in os.environ.items() if k.startswith("LLAMA_ARG_")}
    if extra:
        env["llama_arg_env"] = extra  # llama-server reads these: they change what ran
    return env
