"""The launch plan: a pure function from what we know to the exact llama-server command.

Inputs are plain values (settings, profile, inspected GGUF headers, hardware, binary
capabilities); the output is a frozen LaunchPlan with the argv, the extra environment and a
reason for every non-default flag. Nothing here touches processes, disk or the network, so
`bonsai start --dry-run` and `bonsai start` share this one code path and tests can drive it
with tables of cases.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import Profile
from bonsai_launch.config.settings import Settings
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.hardware import Hardware
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.models.gguf import GGUFInfo, check_pair
from bonsai_launch.server import prompt_cache
from bonsai_launch.server import slots as slot_rules
from bonsai_launch.server.passthrough import Passthrough, fold_settings, split_known
from bonsai_launch.server.slots import SlotChoice, SlotsPlan

SPECULATIVE_MIN_CTX = 16384
GIB = 2**30
# Context by system RAM, as the reference sizes it: (RAM upper bound in GB, context).
RAM_TIERS: tuple[tuple[float, int], ...] = ((11, 8192), (23, 16384), (35, 32768), (71, 65536))
GPU_MARGIN_BYTES = 1 * GIB  # compute buffers and the CUDA context
MIN_CTX = 2048
SLOW_VISION_BACKENDS = ("cpu", "metal", "vulkan")
# Plan flags a passthrough argument may not repeat, with the bonsai setting to use instead.
PLAN_FLAG_SETTINGS = {
    "--cache-type-k": "BONSAI_KV4",
    "--cache-type-v": "BONSAI_KV4",
    "--spec-draft-type-k": "BONSAI_KV4",
    "--spec-draft-type-v": "BONSAI_KV4",
    "--mmproj": "BONSAI_VISION (the profile's projector)",
    "--mmproj-offload": "BONSAI_MMPROJ_CPU",
    "--image-max-tokens": "BONSAI_IMAGE_MAX_TOKENS",
    "--chat-template-kwargs": "BONSAI_REASONING_EFFORT",
}


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
    tuning: dict[str, Any] | None = None  # BONSAI_SPECULATIVE=auto: the decision and its evidence
    model_name: str = ""  # what clients put in "model" (llama-server's --alias)
    from_passthrough: tuple[str, ...] = ()  # plan values that came from arguments after --

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
            "env": {k: "***" for k in self.env},  # the plan's environment holds only secrets
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
            "tuning": self.tuning,
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auto_ctx_from_ram(hardware: Hardware, ceiling: int) -> int:
    for limit_gb, ctx in RAM_TIERS:
        if hardware.ram_gb <= limit_gb:
            return min(ctx, ceiling)
    return ceiling


def gpu_ctx_limit(hardware: Hardware, weights_bytes: int, kv_per_token: int | None) -> int | None:
    """The largest context whose KV cache fits in the first GPU's free memory, or None."""
    if not hardware.gpus or not kv_per_token:
        return None
    available = hardware.gpus[0].free_bytes - weights_bytes - GPU_MARGIN_BYTES
    return max(0, available // kv_per_token) // 1024 * 1024


class _Builder:
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


def _backend(inputs: PlanInputs) -> str:
    if inputs.capabilities is not None:
        return inputs.capabilities.backend
    if inputs.hardware.gpus:
        return "cuda"
    if inputs.hardware.metal:
        return "metal"
    return "cpu"


def check_host(settings: Settings) -> None:
    """Where it listens: one TCP address; beyond loopback only with the opt-in and a key."""
    host = settings["host"]
    origin = "-- --host" if settings.source("host") == "passthrough" else "BONSAI_HOST"
    if "," in host or host.endswith(".sock"):
        raise BonsaiError(
            f"{origin}={host!r}: bonsai serves on one TCP address (it checks and reports that address)",
            "give one address, e.g. 127.0.0.1, or run a second server for another address",
        )
    if not is_loopback(host) and not settings["allow_remote"]:
        raise BonsaiError(
            f"{origin}={host!r} is not a loopback address and remote access is not allowed",
            "set BONSAI_ALLOW_REMOTE=1 (an API key is then required) or use 127.0.0.1",
        )
    if not is_loopback(host) and not settings.get("api_key"):
        raise BonsaiError(
            f"{origin}={host!r} is reachable from the network but no API key is set",
            "set BONSAI_API_KEY, or let `bonsai start` generate one",
        )


def _why(s: Settings, key: str, default_why: str) -> str:
    source = s.source(key)
    return {
        "passthrough": "from the arguments after --",
        "flag": "set by flag",
        "env": "set by environment",
        "profile": "set by the profile",
    }.get(source, default_why)


def build_plan(inputs: PlanInputs) -> LaunchPlan:
    passthrough = inputs.passthrough
    passthrough.check_refused()
    # Owned options after -- count as the matching settings, so every rule below applies once.
    inputs = dataclasses.replace(inputs, settings=fold_settings(inputs.settings, passthrough))
    s = inputs.settings
    caps = inputs.capabilities
    profile = inputs.profile
    b = _Builder(inputs.binary)
    backend = _backend(inputs)

    check_host(s)
    host, port = s["host"], s["port"]
    env: dict[str, str] = {}
    if s.get("api_key"):
        # Enforced whatever the host (loopback is shared by every user of the machine); through
        # the environment, so the key never shows in `ps` output.
        env["LLAMA_API_KEY"] = s["api_key"]
        b.reasons.append(Reason("LLAMA_API_KEY", "***", f"an API key is required ({_why(s, 'api_key', 'generated')})"))

    alias = passthrough.plan_value("alias")
    # llama-server keeps aliases in a sorted set and serves the first as the model's name.
    model_name = (
        min(a.strip() for a in alias.split(",")) if alias else profile.name if profile else inputs.model.path.stem
    )
    b.add("-m", inputs.model.path, f"model{' of profile ' + profile.name if profile else ''}")
    b.add(
        "--alias",
        alias or model_name,
        "from the arguments after --" if alias else 'the name clients see in /v1/models and put in "model"',
    )
    b.add(
        "--host",
        host,
        ("loopback only" if is_loopback(host) else "BONSAI_ALLOW_REMOTE=1") + f" ({_why(s, 'host', 'default')})",
    )
    b.add(
        "--port",
        port,
        f"from {s.source('port')}" if s.source("port") != "passthrough" else "from the arguments after --",
    )

    # GPU layers: the user's choice, else everything on a usable GPU.
    if s.get("ngl") is not None:
        ngl = s["ngl"]
        ngl_why = f"BONSAI_NGL/--ngl ({s.source('ngl')})"
    elif backend == "cpu":
        ngl = 0
        ngl_why = "CPU build: nothing to offload" if caps else "no GPU detected"
    else:
        ngl = 99
        ngl_why = f"{backend} backend: offload all layers"
    b.add("-ngl", ngl, ngl_why)

    spec = _speculation(inputs, ngl, b)
    # -np after -- is folded into BONSAI_PARALLEL's setting (source "passthrough").
    slot_choice = slot_rules.choose_slots(s.get("parallel"), s.source("parallel"), spec is not None)

    # Context: explicit wins; else RAM tier, capped by free GPU memory when offloading.
    ctx_setting = s.get("ctx") or 0
    if ctx_setting > 0:
        ctx = ctx_setting
        ctx_why = f"set explicitly ({s.source('ctx')})"
        if spec and s.source("ctx") == "profile" and ctx < SPECULATIVE_MIN_CTX:
            ctx, ctx_why = (
                SPECULATIVE_MIN_CTX,
                "speculation: at least 16384 (requests re-prefill, the model thinks before answering)",
            )
        elif spec and ctx < SPECULATIVE_MIN_CTX:
            b.warnings.append(
                f"context {ctx} ({_why(s, 'ctx', 'explicit').replace('set by', 'set by the')}) is "
                f"below {SPECULATIVE_MIN_CTX}, the floor bonsai uses with speculation: "
                "long answers will run out of context"
            )
    else:
        ceiling = profile.max_auto_ctx if profile else 131072
        if inputs.model.context_length:
            ceiling = min(ceiling, inputs.model.context_length)
        ctx = auto_ctx_from_ram(inputs.hardware, ceiling)
        ctx_why = f"auto: {inputs.hardware.ram_gb:.0f} GB RAM tier"
        if ngl > 0:
            weights = inputs.model.file_size + (inputs.drafter.file_size if inputs.drafter and spec else 0)
            kv = inputs.model.kv_bytes_per_token(0.5625 if s["kv4"] else 2.0)
            limit = gpu_ctx_limit(inputs.hardware, weights, kv)
            if limit is not None and limit < ctx:
                ctx = max(MIN_CTX, limit)
                ctx_why = f"auto: limited by free GPU memory ({inputs.hardware.gpus[0].free_bytes / GIB:.1f} GiB)"
                if limit < MIN_CTX:
                    b.warnings.append(
                        f"the model barely fits in GPU memory; context set to {MIN_CTX}; "
                        "lower BONSAI_NGL if loading fails"
                    )
        if spec and ctx < SPECULATIVE_MIN_CTX:
            ctx, ctx_why = (
                SPECULATIVE_MIN_CTX,
                "speculation: at least 16384 (requests re-prefill, the model thinks before answering)",
            )
    per_slot_ctx = ctx
    if slot_choice.count is not None and slot_choice.count > 1:
        explicit_ctx = ctx_setting > 0 and s.source("ctx") != "profile"
        minimum, label = (
            (SPECULATIVE_MIN_CTX, "the speculative minimum per slot") if spec else (MIN_CTX, "the minimum per slot")
        )
        fitted = slot_rules.context_for_slots(
            slot_choice.count, bool(s["kv_unified"]), minimum, ctx, explicit_ctx, label
        )
        ctx_why = fitted.why if fitted.ctx != ctx else f"{ctx_why}; {fitted.why}"
        ctx, per_slot_ctx = fitted.ctx, fitted.per_slot
        if fitted.warning:
            b.warnings.append(fitted.warning)
        kv = inputs.model.kv_bytes_per_token(0.5625 if s["kv4"] else 2.0)
        limit = gpu_ctx_limit(inputs.hardware, inputs.model.file_size, kv) if ngl > 0 else None
        if limit is not None and ctx > limit:
            b.warnings.append(
                f"{slot_choice.count} slots need a {ctx}-token KV cache, more than the about {limit} tokens "
                "free GPU memory holds; use fewer slots, BONSAI_KV_UNIFIED=1 or BONSAI_KV4=1"
            )
    b.add("-c", ctx, ctx_why)
    slots_plan = _slots(inputs, spec, slot_choice, per_slot_ctx, b)
    if spec is None:
        # Without speculation no rule sizes them: -ub/-b after -- go to llama-server as given, once.
        for name, flag in (("ubatch", "-ub"), ("batch", "-b")):
            value = passthrough.plan_int(name)
            if value is not None:
                b.add(flag, value, "from the arguments after --")

    if s["kv4"]:
        _require_flag(caps, "--cache-type-k", "BONSAI_KV4=1")
        b.add("--cache-type-k", "q4_0", "BONSAI_KV4=1")
        b.add("--cache-type-v", "q4_0", "BONSAI_KV4=1")
        if spec and spec.drafter:
            _require_flag(caps, "--spec-draft-type-k", "BONSAI_KV4=1 with a drafter")
            b.add(
                "--spec-draft-type-k",
                "q4_0",
                "BONSAI_KV4=1: the drafter's KV cache too (the reference crashed without it)",
            )
            b.add("--spec-draft-type-v", "q4_0", "BONSAI_KV4=1: the drafter's KV cache too")

    cache, cache_warnings = prompt_cache.cache_flags(
        s.get("cache_ram"),
        s.get("ctx_checkpoints"),
        s.get("cache_idle_slots"),
        {k: s.source(k) for k in ("cache_ram", "ctx_checkpoints", "cache_idle_slots")},
    )
    for item in cache:
        _require_flag(caps, item.flag, item.setting)
        b.add(item.flag, item.value, item.why)
    b.warnings.extend(cache_warnings)

    mmproj = _vision(inputs, backend, b)

    if s["verbose"]:
        b.add("--verbose", None, "BONSAI_LLAMA_VERBOSE=1")
    b.add("--metrics", None, "expose /metrics so `bonsai verify` and `bonsai bench` can read speculative counters")

    if s.get("reasoning_effort"):
        from bonsai_launch.config.profiles import reasoning_effort_kwargs

        b.add(
            "--chat-template-kwargs",
            reasoning_effort_kwargs(profile, s["reasoning_effort"]),
            f"BONSAI_REASONING_EFFORT ({s.source('reasoning_effort')}), through the chat template",
        )

    rest = passthrough.rest()
    table = passthrough.table
    planned = {table.canonical(r.flag): r for r in b.reasons if r.flag.startswith("-")} if table else {}
    given = {a.canonical for a in rest}
    for arg in rest:
        # Never twice in the argv: llama-server would take the last value, unseen by the plan.
        if arg.canonical in planned and arg.canonical != "--metrics":
            r = planned[arg.canonical]
            setting = PLAN_FLAG_SETTINGS.get(arg.canonical, "the bonsai setting behind it")
            raise BonsaiError(
                f"-- {arg.shown} conflicts with {r.flag} {r.value}, which bonsai sets ({r.why})",
                f"use {setting} instead",
            )
    if profile and profile.server_args:
        # The profile's server arguments are defaults: an argument after -- replaces them.
        kept = [w for name, words in split_known(profile.server_args, table) if name not in given for w in words]
        b.argv.extend(kept)
        if kept:
            b.reasons.append(Reason("profile", " ".join(kept), f"sampling and chat settings of profile {profile.name}"))
    passed = [w for a in rest if not (a.canonical == "--metrics" and "--metrics" in planned) for w in a.argv]
    if passed:
        b.argv.extend(passed)
        b.reasons.append(Reason("--", " ".join(passed), "passed through to llama-server"))
    secrets = passthrough.secret_env()
    env.update(secrets)
    for name in secrets:
        b.reasons.append(Reason(name, "***", "a secret from the arguments after --, moved to the environment"))

    from_passthrough = tuple(
        sorted(
            {k for k, r in s.values.items() if r.source == "passthrough"}
            | {n for n in ("ubatch", "batch", "alias") if passthrough.plan_value(n)}
        )
    )
    return LaunchPlan(
        argv=tuple(str(a) for a in b.argv),
        env=env,
        reasons=tuple(b.reasons),
        warnings=tuple(b.warnings),
        profile=profile.name if profile else None,
        model=str(inputs.model.path),
        host=host,
        port=port,
        ctx=ctx,
        ngl=ngl,
        backend=backend,
        speculative=spec,
        mmproj=str(mmproj) if mmproj else None,
        slots=slots_plan,
        prompt_cache=prompt_cache.describe(s.get("cache_ram"), s.get("ctx_checkpoints"), s.get("cache_idle_slots")),
        model_name=model_name,
        from_passthrough=from_passthrough,
    )


def _slots(inputs: PlanInputs, spec: SpecPlan | None, choice: SlotChoice, per_slot_ctx: int, b: _Builder) -> SlotsPlan:
    """-np, -kvu and, with speculation, -ub/-b (slots.py has the rules and the facts behind them)."""
    s, caps, passthrough = inputs.settings, inputs.capabilities, inputs.passthrough
    if choice.count is None:
        b.reasons.append(Reason("-np", "auto", choice.why))
        if s.is_explicit("kv_unified"):
            b.warnings.append(
                "BONSAI_KV_UNIFIED has no effect without BONSAI_PARALLEL: llama-server's automatic slots "
                "already share one KV pool"
            )
        return SlotsPlan(None, True, None)
    count = choice.count
    why = choice.why
    if spec is not None and count > 1:
        why += "; speculation on every slot: " + slot_rules.refuse_unless_build_can(
            caps.shared_drafting if caps else None, caps.binary if caps else inputs.binary, count, spec.spec_type
        )
    b.add("-np", count, why)
    kv_unified = bool(s["kv_unified"]) and count > 1
    if kv_unified:
        _require_flag(caps, "-kvu", "BONSAI_KV_UNIFIED=1")
        b.add("-kvu", None, "BONSAI_KV_UNIFIED=1: the slots share one KV pool")
    elif s["kv_unified"] and s.is_explicit("kv_unified"):
        b.warnings.append("BONSAI_KV_UNIFIED=1 has no effect with one slot")
    if spec is None:
        return SlotsPlan(count, kv_unified, per_slot_ctx)
    # The draft length and -ub/-b: the n-gram draft options pass through to llama-server (read
    # here for the rule); -ub/-b after -- are the plan's to place, once.
    option_values: dict[str, int] = {}
    for option, _ in slot_rules.NGRAM_DRAFT_LENGTH.values():
        value = passthrough.last_int(option) if option else None
        if option and value is not None:
            option_values[option] = value
    draft, _ = slot_rules.draft_length(spec.spec_type, spec.n_max, option_values)
    given = {"-ub": passthrough.plan_int("ubatch"), "-b": passthrough.plan_int("batch")}
    sizing = slot_rules.size_batches(count, spec.spec_type, draft, given["-ub"], given["-b"])
    for flag, added, effective, why in (
        ("-ub", sizing.ubatch_flag, sizing.ubatch, sizing.ubatch_why),
        ("-b", sizing.batch_flag, sizing.batch, sizing.batch_why),
    ):
        if added is not None:
            b.add(flag, added, "speculation: " + why)
        elif given[flag] is not None:
            b.add(flag, given[flag], "from the arguments after --; speculation: " + why)
        else:  # llama-server's default: explained, not repeated
            b.reasons.append(Reason(flag, str(effective), "speculation: " + why))
    return SlotsPlan(count, kv_unified, per_slot_ctx, draft, sizing.need, sizing.ubatch, sizing.batch)


def _require_flag(caps: Capabilities | None, flag: str, setting: str) -> None:
    if caps is not None and not caps.accepts(flag):
        raise BonsaiError(
            f"{setting} needs {flag}, which {caps.binary} does not accept",
            "rebuild with `bonsai build --force`, or unset the setting",
        )


def _require_spec_type(caps: Capabilities | None, spec_type: str) -> None:
    if caps is not None and caps.spec_types and spec_type not in caps.spec_types:
        raise BonsaiError(
            f"speculative type {spec_type} is not supported by {caps.binary} (it knows {', '.join(sorted(caps.spec_types))})",
            "run `bonsai build` to build the pinned llama.cpp, or point BONSAI_LLAMA_SERVER at a newer binary",
        )


def _require_log_snr(caps: Capabilities | None, drafter: GGUFInfo) -> None:
    if caps is not None and drafter.drafter is not None and drafter.drafter.log_snr and not caps.dspark_log_snr:
        raise BonsaiError(
            f"{drafter.path.name} uses log-SNR conditioning, which {caps.binary} does not implement "
            "(it would refuse the file: wrong number of tensors)",
            "run `bonsai build` to build the pinned llama.cpp with bonsai's log-SNR patch, or unset BONSAI_LLAMA_SERVER",
        )


def _speculation(inputs: PlanInputs, ngl: int, b: _Builder) -> SpecPlan | None:
    s = inputs.settings
    if not s["speculative"]:
        for key, env in (("spec_type", "BONSAI_SPEC_TYPE"), ("spec_nmax", "BONSAI_SPEC_NMAX")):
            if s.is_explicit(key):
                b.warnings.append(f"{env} is set but speculation is off; it has no effect (set BONSAI_SPECULATIVE=1)")
        if inputs.drafter is not None:
            b.warnings.append(
                f"drafter {inputs.drafter.path.name} is given but speculation is off; "
                "it is not loaded (set BONSAI_SPECULATIVE=1 or --speculative)"
            )
        return None

    wanted_type = s.get("spec_type")
    drafter = inputs.drafter
    if wanted_type and wanted_type.startswith("ngram"):
        drafter = None  # an explicit draft-free type needs no drafter
    if wanted_type == "none":
        raise BonsaiError("BONSAI_SPEC_TYPE='none' contradicts BONSAI_SPECULATIVE=1", "unset one of them")

    if drafter is not None:
        problems = check_pair(inputs.model, drafter)
        if problems:
            raise BonsaiError(
                "drafter does not fit the target: " + "; ".join(problems),
                f"replace {drafter.path.name} with the drafter made for {inputs.model.path.name}",
            )
        assert drafter.drafter is not None and drafter.drafter.block_size is not None
        needed = "draft-dspark" if drafter.drafter.kind == "dspark" else "draft-dflash"
        if wanted_type and wanted_type != needed:
            raise BonsaiError(
                f"BONSAI_SPEC_TYPE={wanted_type!r} does not match the drafter {drafter.path.name}, which needs {needed}",
                f"unset BONSAI_SPEC_TYPE or set it to {needed}",
            )
        _require_spec_type(inputs.capabilities, needed)
        _require_log_snr(inputs.capabilities, drafter)
        block = drafter.drafter.block_size
        if s.get("spec_nmax") is not None and s["spec_nmax"] != block:
            raise BonsaiError(
                f"BONSAI_SPEC_NMAX={s['spec_nmax']} differs from the drafter's block size {block} "
                f"({drafter.path.name})",
                "unset BONSAI_SPEC_NMAX: n-max always equals the block size",
            )
        if inputs.profile and inputs.profile.drafter_warning:
            b.warnings.append(inputs.profile.drafter_warning)
        b.add("-md", drafter.path, "speculation: the drafter")
        b.add("--spec-type", needed, f"the drafter is a {drafter.drafter.kind} model")
        b.add("--spec-draft-n-max", block, f"the drafter's block size, read from {drafter.path.name}")
        b.add("-ngld", ngl, "drafter GPU layers follow the target's" + (" (CPU)" if ngl == 0 else ""))
        return SpecPlan(needed, block, str(drafter.path), ngl)

    draft_free = wanted_type or (inputs.profile.draft_free_type if inputs.profile else None)
    if not draft_free:
        name = inputs.profile.name if inputs.profile else "this model"
        why = f" ({inputs.drafter_unavailable})" if inputs.drafter_unavailable else ""
        raise BonsaiError(
            f"BONSAI_SPECULATIVE=1 but {name} has no usable drafter and no draft-free mode{why}",
            "pass --drafter PATH, or set BONSAI_SPEC_TYPE=ngram-mod for draft-free n-gram speculation",
        )
    if not draft_free.startswith("ngram"):
        raise BonsaiError(f"BONSAI_SPEC_TYPE={draft_free!r} needs a drafter model", "pass --drafter PATH")
    _require_spec_type(inputs.capabilities, draft_free)
    b.add(
        "--spec-type", draft_free, "draft-free n-gram speculation" + (" (profile default)" if not wanted_type else "")
    )
    n_max = s.get("spec_nmax")
    if n_max is not None:
        for flag, value in ngram_length_flags(draft_free, n_max):
            _require_flag(inputs.capabilities, flag, "BONSAI_SPEC_NMAX")
            b.add(
                flag, value, f"BONSAI_SPEC_NMAX ({s.source('spec_nmax')}): {draft_free} drafts at most {n_max} tokens"
            )
        if draft_free not in NGRAM_LENGTH_FLAGS:
            b.warnings.append(f"BONSAI_SPEC_NMAX has no effect on {draft_free}, whose draft length is fixed")
    return SpecPlan(draft_free, n_max)


# The n-gram types ignore --spec-draft-n-max (b11434 reads it for draft models only): each has
# its own length flag. ngram-mod also drops drafts shorter than its n-min (default 48).
NGRAM_LENGTH_FLAGS = {t: option for t, (option, _default) in slot_rules.NGRAM_DRAFT_LENGTH.items() if option}
NGRAM_MOD_DEFAULT_N_MIN = 48


def ngram_length_flags(spec_type: str, n_max: int) -> list[tuple[str, int]]:
    """The flags that cap an n-gram type's draft length at n_max."""
    flag = NGRAM_LENGTH_FLAGS.get(spec_type)
    if flag is None:
        return []
    flags = [(flag, n_max)]
    if spec_type == "ngram-mod":
        flags.append(("--spec-ngram-mod-n-min", min(n_max, NGRAM_MOD_DEFAULT_N_MIN)))
    return flags


def _vision(inputs: PlanInputs, backend: str, b: _Builder) -> Path | None:
    s = inputs.settings
    if inputs.mmproj is None or not s["vision"]:
        for key, env in (("mmproj_cpu", "BONSAI_MMPROJ_CPU"), ("image_max_tokens", "BONSAI_IMAGE_MAX_TOKENS")):
            if s.is_explicit(key):
                b.warnings.append(f"{env} is set but no vision projector is loaded; it has no effect")
        return None
    b.add(
        "--mmproj",
        inputs.mmproj,
        f"vision projector ({s.source('mmproj')})" if s.get("mmproj") else "vision projector of the profile",
    )
    if s["mmproj_cpu"]:
        b.add("--no-mmproj-offload", None, "BONSAI_MMPROJ_CPU=1")
    if s.get("image_max_tokens") is not None:
        b.add("--image-max-tokens", s["image_max_tokens"], f"set explicitly ({s.source('image_max_tokens')})")
    elif inputs.profile and inputs.profile.vision_cap_on_slow_backends and backend in SLOW_VISION_BACKENDS:
        b.add("--image-max-tokens", 1024, f"{backend} backend: cap image tokens as the reference does")
    return inputs.mmproj


def render_command(argv: tuple[str, ...] | list[str], shell: str = "posix", env: dict[str, str] | None = None) -> str:
    """The command line to paste into a shell: POSIX sh or PowerShell."""
    if shell == "powershell":
        from bonsai_launch.core import shell as powershell

        return powershell.render(argv, env)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + shlex.join(argv)
