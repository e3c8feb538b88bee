"""build_plan: settings, model, hardware and binary become the argv, in one order: host and key,
context, slots, speculation, vision, then the arguments after -- (checked against what the plan
set). Each part adds its flags with a reason through the ArgvBuilder (types.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bonsai_launch.config.settings import Settings
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.builds import selftest_record
from bonsai_launch.llamacpp.capabilities import require_flag
from bonsai_launch.server import prompt_cache
from bonsai_launch.server import slots as slot_rules
from bonsai_launch.server.passthrough import fold_settings, split_known
from bonsai_launch.server.plan.context import GIB, MIN_CTX, SPECULATIVE_MIN_CTX, auto_ctx_from_ram, gpu_ctx_limit
from bonsai_launch.server.plan.host import check_host, is_loopback
from bonsai_launch.server.plan.speculation import plan_speculation
from bonsai_launch.server.plan.types import ArgvBuilder, LaunchPlan, PlanInputs, Reason, SpecPlan
from bonsai_launch.server.plan.weights import backend_of, fit_to_ram, held_bytes, memory, ram_ctx_limit
from bonsai_launch.server.slots import SlotChoice, SlotsPlan

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
    "--sleep-idle-seconds": "BONSAI_SLEEP_IDLE_SECONDS",
}


def _why(s: Settings, key: str, default_why: str) -> str:
    source = s.source(key)
    return {
        "passthrough": "from the arguments after --",
        "flag": "set by flag",
        "env": "set by environment",
        "profile": "set by the profile",
    }.get(source, default_why)


def _prompt_sample(inputs: PlanInputs, env: dict[str, str], b: ArgvBuilder) -> dict | None:
    """BONSAI_TUNE_SAMPLE: llama-server shows each slot's last prompt in /slots only with
    LLAMA_SERVER_SLOTS_DEBUG=1; the restarting process samples them (server/prompt_sample.py)."""
    from bonsai_launch.server.prompt_sample import SLOTS_DEBUG_ENV, sample_path

    s = inputs.settings
    limit = s.get("tune_sample") or 0
    if not limit:
        return None
    env[SLOTS_DEBUG_ENV] = "1"
    b.reasons.append(
        Reason(
            SLOTS_DEBUG_ENV,
            "1",
            f"BONSAI_TUNE_SAMPLE={limit} ({s.source('tune_sample')}): /slots shows each slot's last prompt, "
            "sampled for `bonsai tune --prompts recent`",
        )
    )
    return {"limit": limit, "every_s": s.get("watch_seconds") or 0, "path": str(sample_path(inputs.model.path))}


def build_plan(inputs: PlanInputs) -> LaunchPlan:
    passthrough = inputs.passthrough
    passthrough.check_refused()
    # Owned options after -- count as the matching settings, so every rule below applies once.
    inputs = dataclasses.replace(inputs, settings=fold_settings(inputs.settings, passthrough))
    s = inputs.settings
    caps = inputs.capabilities
    profile = inputs.profile
    b = ArgvBuilder(inputs.binary)
    backend = backend_of(caps, inputs.hardware)

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

    spec = plan_speculation(inputs, ngl, b)
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
        if ngl == 0:  # the weights' path decides how much RAM is left for the KV cache
            ctx, ctx_why = fit_to_ram(inputs, ctx, ctx_why, held_bytes(inputs, spec is not None), b)
        else:
            weights = held_bytes(inputs, spec is not None)
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
        held = held_bytes(inputs, spec is not None)
        limit = gpu_ctx_limit(inputs.hardware, held, kv) if ngl > 0 else ram_ctx_limit(inputs.hardware, held, kv)
        if limit is not None and ctx > limit:
            b.warnings.append(
                f"{slot_choice.count} slots need a {ctx}-token KV cache, more than the about {limit} tokens "
                f"{'free GPU memory' if ngl > 0 else 'RAM beside the weights'} holds; use fewer slots, "
                "BONSAI_KV_UNIFIED=1 or BONSAI_KV4=1"
            )
    b.add("-c", ctx, ctx_why)
    held_memory = memory(inputs, ctx, ngl, spec is not None and spec.drafter is not None)
    if not held_memory["fits"]:
        b.warnings.append("memory: " + held_memory["summary"])
    slots_plan = _slots(inputs, spec, slot_choice, per_slot_ctx, b)
    _self_test_workaround(inputs, slot_choice, b)
    if spec is None:
        # Without speculation no rule sizes them: -ub/-b after -- go to llama-server as given, once.
        for name, flag in (("ubatch", "-ub"), ("batch", "-b")):
            value = passthrough.plan_int(name)
            if value is not None:
                b.add(flag, value, "from the arguments after --")

    if s["kv4"]:
        require_flag(caps, "--cache-type-k", "BONSAI_KV4=1")
        b.add("--cache-type-k", "q4_0", "BONSAI_KV4=1")
        b.add("--cache-type-v", "q4_0", "BONSAI_KV4=1")
        if spec and spec.drafter:
            require_flag(caps, "--spec-draft-type-k", "BONSAI_KV4=1 with a drafter")
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
        require_flag(caps, item.flag, item.setting)
        b.add(item.flag, item.value, item.why)
    b.warnings.extend(cache_warnings)

    if s.get("sleep_idle_seconds"):
        require_flag(caps, "--sleep-idle-seconds", "BONSAI_SLEEP_IDLE_SECONDS")
        b.add(
            "--sleep-idle-seconds",
            str(s["sleep_idle_seconds"]),
            f"BONSAI_SLEEP_IDLE_SECONDS ({s.source('sleep_idle_seconds')}): unload the model when idle",
        )

    sample = _prompt_sample(inputs, env, b)

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

    _chat_template(inputs, b, {a.canonical for a in passthrough.rest()})

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
        prompt_sample=sample,
        prompt_cache=prompt_cache.describe(s.get("cache_ram"), s.get("ctx_checkpoints"), s.get("cache_idle_slots")),
        model_name=model_name,
        from_passthrough=from_passthrough,
        memory=held_memory,
    )


HYBRID_ARCHS = frozenset({"qwen35", "qwen35moe"})  # gated delta-net + attention: every Bonsai 27B and Bonsai 2


def _self_test_workaround(inputs: PlanInputs, choice: SlotChoice, b: ArgvBuilder) -> None:
    """A build whose self-test saw 2 concurrent sequences on a hybrid target answer wrong (the
    AMX batched-matmul bug, shared/reference/hybrid-targets.md) runs hybrid targets on 2+ slots
    (llama-server's auto is 4) with --no-repack, its known workaround; said in one line."""
    line = selftest_record.hybrid_workaround(inputs.self_test)
    if line is None or inputs.model.architecture not in HYBRID_ARCHS:
        return
    if choice.count is not None and choice.count < 2:
        return
    if any(a.canonical in ("--no-repack", "--repack") for a in inputs.passthrough.args):
        return  # the user decided repacking after --: theirs to keep
    b.add("--no-repack", None, line)
    b.warnings.append(line)


def _slots(
    inputs: PlanInputs, spec: SpecPlan | None, choice: SlotChoice, per_slot_ctx: int, b: ArgvBuilder
) -> SlotsPlan:
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
        require_flag(caps, "-kvu", "BONSAI_KV_UNIFIED=1")
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
        planned = [int(r.value) for r in b.reasons if r.flag == option]  # the plan's own (per slot)
        if option and (value is not None or planned):
            option_values[option] = value if value is not None else planned[-1]
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


def _vision(inputs: PlanInputs, backend: str, b: ArgvBuilder) -> Path | None:
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


def _chat_template(inputs: PlanInputs, b: ArgvBuilder, given: set[str]) -> None:
    """The profile's wrapper around the model's own chat template (models/chat_template.py): a
    request's reasoning_effort the template refuses is answered at the profile's fallback."""
    profile = inputs.profile
    if profile is None or profile.reasoning_effort_fallback is None:
        return
    takes, fallback = ", ".join(profile.reasoning_efforts), profile.reasoning_effort_fallback
    if given & {"--chat-template", "--chat-template-file"}:
        b.warnings.append(
            f"your chat template after -- replaces profile {profile.name}'s wrapper: a request's reasoning_effort "
            f"other than {takes} reaches the template as sent"
        )
    elif inputs.chat_template is not None:
        require_flag(inputs.capabilities, "--chat-template-file", f"profile {profile.name}'s chat template wrapper")
        b.add(
            "--chat-template-file",
            str(inputs.chat_template),
            f"the model's own chat template behind a guard: a request's reasoning_effort other than {takes} "
            f"(Open WebUI, Cline and Kilo send high, which fails) is answered at {fallback}",
        )
    elif inputs.chat_template_missing:
        b.warnings.append(
            f"profile {profile.name}'s chat template wrapper is not written yet (`bonsai pull --profile "
            f"{profile.name}` writes it): a request with reasoning_effort high will fail"
        )
