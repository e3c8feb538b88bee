"""`bonsai serve`'s plan: one llama-server process as a router (the ServerPlan `start` would make)
hosting several models, each the ModelPlan `start` would make for it, written into a preset file
(one INI section per model: per-model flags never go on the router's command line, whose flags
every child inherits), and what memory follows use: the cap on loaded models, idle unload, pins
and preload. Pure: the files and the process are server/router.py's.

The preset is llama-server's own format (common/preset.cpp at b11434): a key is an option's
spelling without its dashes, a switch is `true` (a negative spelling such as `no-mmproj-offload`
turns it off), and an option holds one value, so an option a plan gives twice cannot be written.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.server.plan.types import ModelPlan, ServerPlan, shown_env, spec_json

if TYPE_CHECKING:
    from bonsai_launch.llamacpp.options import OptionTable

PRESET_HEADER = "; written by `bonsai serve`: one section per model, the flags `bonsai start` gives it"
_UNSAFE_VALUE = re.compile(r"\n|\r|\s[;#]|^\s|\s$")  # what the preset's INI grammar would cut or misread
_UNSAFE_NAME = re.compile(r"[\[\]:\s;#=,]")


@dataclass(frozen=True)
class ServedModel:
    """One model of a router: its plan and how its memory follows use."""

    plan: ModelPlan
    source: str  # what the user named: a profile, a file, TARGET+DRAFTER
    idle_unload_s: int = 0  # unloaded (its child ends) after this long without a request; 0: never
    pinned: bool = False  # loaded at start, never unloaded (idle time, or the cap on loaded models)
    preload: bool = False  # loaded at start

    @property
    def name(self) -> str:
        return self.plan.name

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {
            "name": p.name,
            "source": self.source,
            "model": p.path,
            "profile": p.profile,
            "ctx": p.ctx,
            "ngl": p.ngl,
            "speculative": spec_json(p.speculative),
            "idle_unload_s": self.idle_unload_s,
            "pinned": self.pinned,
            "preload": self.preload or self.pinned,
            "args": list(p.args),
            "warnings": list(p.warnings),
            "tuning": p.tuning,
        }


@dataclass(frozen=True)
class RouterPlan:
    """What `bonsai serve` runs: the shape supervisor.launch takes (argv, env, address, key)."""

    server: ServerPlan
    models: tuple[ServedModel, ...]
    models_max: int
    preset: str  # the preset file's text
    preset_path: str
    cache_dir: str  # LLAMA_CACHE for the router: empty, so it lists only the models planned here
    name: str  # the instance name (`bonsai ps`, `bonsai stop`)
    env_extra: dict[str, str] = field(default_factory=dict)  # the models' own environment, inherited by every child

    @property
    def argv(self) -> tuple[str, ...]:
        return (
            self.server.binary,
            *self.server.args,
            "--models-preset",
            self.preset_path,
            "--models-max",
            str(self.models_max),
        )

    @property
    def env(self) -> dict[str, str]:
        # The children inherit the router's environment: LLAMA_API_KEY makes each of them demand
        # the key on its own loopback port too (the router strips the option, not the variable).
        return {**self.env_extra, **self.server.env, "LLAMA_CACHE": self.cache_dir}

    host = property(lambda self: self.server.host)
    port = property(lambda self: self.server.port)
    base_url = property(lambda self: self.server.base_url)
    api_key = property(lambda self: self.server.api_key)
    binary = property(lambda self: self.server.binary)
    # What supervisor.launch reads of a one-model plan: a router proves each model when it loads.
    profile = None
    speculative = None
    slots = None
    tuning = None
    prompt_sample = None

    @property
    def model(self) -> str:
        return self.preset_path

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{m.name}: {w}" for m in self.models for w in m.plan.warnings)

    def model_named(self, name: str) -> ServedModel | None:
        return next((m for m in self.models if m.name == name), None)

    def watch_json(self) -> dict[str, Any]:
        """What the router's watcher needs (server/router_watch.py), as JSON for a keeper."""
        return {
            "models": [
                {
                    "name": m.name,
                    "idle_unload_s": m.idle_unload_s,
                    "pinned": m.pinned,
                    "spec_type": m.plan.speculative.spec_type if m.plan.speculative else None,
                    "n_max": m.plan.speculative.n_max if m.plan.speculative else None,
                }
                for m in self.models
            ],
            "models_max": self.models_max,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "command": shlex.join(self.argv),
            "env": shown_env({k: v for k, v in self.env.items() if k != "LLAMA_CACHE"}, "***"),
            "host": self.host,
            "port": self.port,
            "url": self.base_url,
            "api_key_required": "LLAMA_API_KEY" in self.env,
            "models_max": self.models_max,
            "preset_path": self.preset_path,
            "preset": self.preset,
            "models": [m.to_json() for m in self.models],
            "warnings": list(self.warnings),
        }


def name_list(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def idle_times(text: str | None, names: Sequence[str], origin: str = "BONSAI_IDLE_UNLOAD") -> dict[str, int]:
    """`300,coder=3600` -> seconds per model name: a bare number for every model, NAME=N for one."""
    default, own = 0, {}
    for item in name_list(text):
        name, eq, value = item.rpartition("=")
        if not value.isdigit():
            raise BonsaiError(
                f"{origin}={text!r}: {item!r} is not a number of seconds",
                "give seconds for every model (300) and NAME=SECONDS for one (300,coder=3600); 0 never unloads",
            )
        if eq:
            _known(name, names, origin)
            own[name] = int(value)
        else:
            default = int(value)
    return {n: own.get(n, default) for n in names}


def _known(name: str, names: Sequence[str], origin: str) -> None:
    if name not in names:
        raise BonsaiError(f"{origin} names {name!r}, which is not served", f"served: {', '.join(names)}")


def check_names(models: Sequence[tuple[str, ModelPlan]]) -> None:
    """Two models under one name cannot both be served: the router routes by name."""
    seen: dict[str, str] = {}
    for source, plan in models:
        if _UNSAFE_NAME.search(plan.name) or not plan.name:
            raise BonsaiError(
                f"model {plan.name!r} ({source}): a served name cannot hold spaces or any of []:;#=,",
                f"name it: NAME={source}",
            )
        if plan.name in seen:
            named, sep, what = source.partition("=")
            bare = what if sep and "/" not in named and "\\" not in named else source  # NAME=... given: its file
            raise BonsaiError(
                f"two models are named {plan.name!r}: {seen[plan.name]} and {source}",
                f"give one of them another name: NAME={bare}",
            )
        seen[plan.name] = source


def plan_router(
    server: ServerPlan,
    models: Sequence[tuple[str, ModelPlan]],
    settings: Mapping[str, Any],
    table: OptionTable,
    *,
    preset_path: str,
    cache_dir: str,
    name: str,
) -> RouterPlan:
    """The RouterPlan for model plans made by the planner (one per model the user named)."""
    if not models:
        raise BonsaiError("bonsai serve needs at least one model", "name profiles, GGUF files or a folder of them")
    check_names(models)
    names = [p.name for _, p in models]
    idle = idle_times(settings.get("idle_unload"), names)
    pins = name_list(settings.get("pin"))
    preload_text = settings.get("preload")
    preload = names if (preload_text or "").strip() == "all" else name_list(preload_text)
    for n in (*pins, *preload):
        _known(n, names, "BONSAI_PIN" if n in pins else "BONSAI_PRELOAD")
    models_max = settings.get("models_max")
    models_max = 4 if models_max is None else int(models_max)
    at_start = set(pins) | set(preload)
    if models_max and len(at_start) > models_max:
        raise BonsaiError(
            f"{len(at_start)} models are pinned or preloaded ({', '.join(sorted(at_start))}), more than "
            f"BONSAI_MODELS_MAX={models_max} can hold at once",
            "raise BONSAI_MODELS_MAX (--models-max) or pin/preload fewer",
        )
    served = tuple(
        ServedModel(plan, source, 0 if plan.name in pins else idle[plan.name], plan.name in pins, plan.name in preload)
        for source, plan in models
    )
    env: dict[str, str] = {}
    for m in served:
        env.update(m.plan.env)
    return RouterPlan(server, served, models_max, render_preset(served, table), preset_path, cache_dir, name, env)


def render_preset(models: Sequence[ServedModel], table: OptionTable) -> str:
    lines = [PRESET_HEADER, "version = 1", ""]
    for m in models:
        lines.append(f"[{m.name}]")
        lines += [f"{key} = {value}" for key, value in preset_items(m.name, m.plan.args, table)]
        if m.pinned or m.preload:
            lines.append("load-on-startup = true")
        lines.append("")
    return "\n".join(lines)


def preset_items(name: str, args: Sequence[str], table: OptionTable) -> list[tuple[str, str]]:
    """A model plan's flags as preset keys and values, in the plan's order. The alias is left
    out: the section's name is the model's name, and the router sets it."""
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        spelled = args[i]
        opt = table.lookup(spelled)
        if opt is None or opt.values > 1:
            why = "is not an option of this llama-server" if opt is None else "takes two values"
            raise BonsaiError(
                f"model {name!r}: {spelled} {why}, and a preset cannot hold it", "leave it out of the model's arguments"
            )
        if opt.canonical in seen:
            raise BonsaiError(
                f"model {name!r}: {opt.canonical} is given twice, and a preset holds one value per option",
                "give it once",
            )
        seen.add(opt.canonical)
        if opt.values == 0:
            items.append((spelled.lstrip("-"), "true"))  # a negative spelling as its key turns the switch off
            i += 1
            continue
        value = args[i + 1] if i + 1 < len(args) else ""
        if _UNSAFE_VALUE.search(value) or value == "":
            raise BonsaiError(
                f"model {name!r}: {spelled} {value!r} cannot be written in a preset file (line breaks, "
                "surrounding spaces, or ' ;'/' #', which start a comment there)",
                "give the value without them",
            )
        if opt.canonical != "--alias":
            items.append((opt.canonical.lstrip("-"), value))
        i += 2
    return items
