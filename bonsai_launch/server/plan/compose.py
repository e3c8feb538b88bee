"""build_plan: settings, model, hardware and binary become a LaunchPlan: the process (plan/server.py:
host, port, key, /metrics) and the model it serves (plan_model: name, layers, context, slots,
speculation, KV, cache, vision, template, then the arguments after --, checked against what the
plan set). Each part adds its flags with a reason through the ArgvBuilder (types.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.builds import selftest_record
from bonsai_launch.llamacpp.capabilities import require_flag
from bonsai_launch.server import prompt_cache
from bonsai_launch.server import slots as slot_rules
from bonsai_launch.server.passthrough import fold_settings, split_known
from bonsai_launch.server.plan.server import plan_server
from bonsai_launch.server.plan.speculation import plan_speculation
from bonsai_launch.server.plan.types import ArgvBuilder, LaunchPlan, ModelPlan, PlanInputs, Reason, SpecPlan
from bonsai_launch.server.plan.weights import backend_of, gpu_layers_and_why, memory, plan_context
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
    """The process (plan/server.py) and the model it serves (plan_model), from one set of inputs."""
    inputs.passthrough.check_refused()
    # Owned options after -- count as the matching settings, so every rule below applies once.
    inputs = dataclasses.replace(inputs, settings=fold_settings(inputs.settings, inputs.passthrough))
    server = plan_server(inputs.settings, inputs.binary, inputs.capabilities)
    return LaunchPlan(server, plan_model(inputs, server.reasons))


def plan_model(inputs: PlanInputs, process_reasons: tuple[Reason, ...] = ()) -> ModelPlan:
    """One model's flags: name, layers, context, slots, speculation, KV, cache, vision, template, then
    the profile's and the user's arguments (checked against what the plan and the process set:
    `process_reasons`). Settings must have the passthrough folded in (build_plan does)."""
    passthrough = inputs.passthrough
    s = inputs.settings
    caps = inputs.capabilities
    profile = inputs.profile
    b = ArgvBuilder()
    backend = backend_of(caps, inputs.hardware)
    env: dict[str, str] = {}

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

    # GPU layers: the user's choice, else everything on a usable GPU (weights.gpu_layers_and_why).
    set_ngl = s.get("ngl")
    source = s.source("ngl") if set_ngl is not None else ""
    ngl, ngl_why = gpu_layers_and_why(set_ngl, source, backend, probed=caps is not None)
    b.add("-ngl", ngl, ngl_why)

    spec = plan_speculation(inputs, ngl, b)
    # -np after -- is folded into BONSAI_PARALLEL's setting (source "passthrough").
    slot_choice = slot_rules.choose_slots(s.get("parallel"), s.source("parallel"), spec is not None)
    ctx, per_slot_ctx = plan_context(inputs, spec is not None, ngl, slot_choice.count, b)
    held_memory = memory(inputs, ctx, ngl, spec is not None and spec.drafter is not None)
    if not held_memory["fits"]:
        b.warnings.append("memory: " + held_memory["summary"])
    slots_plan = _slots(inputs, spec, slot_choice, per_slot_ctx, b)
    _self_test_workaround(inputs, slot_choice, b)
    _load_mode(inputs, ngl, b)
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

    sample = _prompt_sample(inputs, env, b)
    mmproj = _vision(inputs, backend, b)

    if s.get("reasoning_effort"):
        from bonsai_launch.config.profiles import reasoning_effort_kwargs

        b.add(
            "--chat-template-kwargs",
            reasoning_effort_kwargs(profile, s["reasoning_effort"]),
            f"BONSAI_REASONING_EFFORT ({s.source('reasoning_effort')}), through the chat template",
        )

    _chat_template(inputs, b, {a.canonical for a in passthrough.rest()})
    _rest(inputs, b, process_reasons)
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
    reasons, warnings, tuning = _tuning(inputs, tuple(b.reasons), (*b.warnings, *inputs.notes), ngl)
    return ModelPlan(
        name=model_name,
        path=str(inputs.model.path),
        args=tuple(str(a) for a in b.argv),
        reasons=reasons,
        warnings=warnings,
        profile=profile.name if profile else None,
        ctx=ctx,
        ngl=ngl,
        backend=backend,
        speculative=spec,
        mmproj=str(mmproj) if mmproj else None,
        slots=slots_plan,
        prompt_sample=sample,
        prompt_cache=prompt_cache.describe(s.get("cache_ram"), s.get("ctx_checkpoints"), s.get("cache_idle_slots")),
        tuning=tuning,
        from_passthrough=from_passthrough,
        memory=held_memory,
        env=env,
    )


def _rest(inputs: PlanInputs, b: ArgvBuilder, process_reasons: tuple[Reason, ...]) -> None:
    """The profile's server arguments (defaults: one after -- replaces them), then the arguments
    after -- that no setting owns, each refused when it repeats a flag the plan set."""
    passthrough, profile = inputs.passthrough, inputs.profile
    rest = passthrough.rest()
    table = passthrough.table
    planned = (
        {table.canonical(r.flag): r for r in (*process_reasons, *b.reasons) if r.flag.startswith("-")} if table else {}
    )
    given = {a.canonical for a in rest}
    for arg in rest:
        # Never twice in the argv: llama-server would take the last value, unseen by the plan.
        if arg.canonical in planned and arg.canonical != "--metrics":
            r = planned[arg.canonical]
            setting = PLAN_FLAG_SETTINGS.get(arg.canonical, "the bonsai setting behind it")
            shown = f"{r.flag} {r.value}" if r.value else r.flag
            raise BonsaiError(
                f"-- {arg.shown} conflicts with {shown}, which bonsai sets ({r.why})", f"use {setting} instead"
            )
    if profile and profile.server_args:
        kept = [w for name, words in split_known(profile.server_args, table) if name not in given for w in words]
        b.argv.extend(kept)
        if kept:
            b.reasons.append(Reason("profile", " ".join(kept), f"sampling and chat settings of profile {profile.name}"))
    passed = [w for a in rest if not (a.canonical == "--metrics" and "--metrics" in planned) for w in a.argv]
    if passed:
        b.argv.extend(passed)
        b.reasons.append(Reason("--", " ".join(passed), "passed through to llama-server"))


def _tuning(
    inputs: PlanInputs, reasons: tuple[Reason, ...], warnings: tuple[str, ...], ngl: int
) -> tuple[tuple[Reason, ...], tuple[str, ...], dict[str, Any] | None]:
    """BONSAI_SPECULATIVE=auto: the decision explained among the reasons, and what about it the
    user must know (none found; measured with other GPU layers)."""
    info = inputs.tuning
    if info is None:
        return reasons, warnings, None
    from bonsai_launch.decisions.auto import AUTO

    why = info["message"].removeprefix("BONSAI_SPECULATIVE=auto: ")
    if info["status"] != "found":
        warnings += (info["message"],)
    measured = info.get("conditions") or {}
    if info["status"] == "found" and measured.get("ngl") is not None and measured["ngl"] != ngl:
        warnings += (
            (
                f"the tuning decision {info['id']} was measured with -ngl {measured['ngl']}, this start uses "
                f"-ngl {ngl}: re-tune (`{info['hint']}`) if speed matters"
            ),
        )
    return reasons + (Reason("BONSAI_SPECULATIVE", AUTO, why),), warnings, dict(info)


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


# The types the CPU backend copies into its repack buffer at load on x86: Bonsai's (patches 0011,
# 0013) and, in the sixteen-row tiles since 0020-0026, those of users' own files (Q4_0, Q4_K,
# Q5_0, Q5_K, Q6_K, Q8_0). Upstream's ARM layouts copy most of the latter too. Where a type is
# not copied, reading the file once holds what the map would.
CPU_REPACKED_CODECS = frozenset({"Q1_0", "Q2_0", "PTQ1_0", "Q4_0", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0"})


def _load_mode(inputs: PlanInputs, ngl: int, b: ArgvBuilder) -> None:
    """--load-mode none on a CPU launch of a file whose codec the CPU backend copies into its repack
    buffer: a memory-mapped file would stay resident beside the copy (a 27B PTQ1_0: 9.5 GiB of RSS
    for a 4.7 GiB file, 5.0 with the file read once; a 1.7B Q4_K_M: 2168 MiB against 1374, for
    0.5 s more load; docs/benchmarks.md). Not when the user set the loading or repacking after --,
    or the build lacks the flag."""
    served = inputs.weights.served if inputs.weights is not None else None
    if ngl != 0 or served not in CPU_REPACKED_CODECS:
        return
    if inputs.capabilities is None or not inputs.capabilities.accepts("--load-mode"):
        return
    given = ("--load-mode", "-lm", "--no-repack", "--repack", "--mmap", "--no-mmap", "--mlock")
    if any(a.canonical in given for a in inputs.passthrough.args) or "--no-repack" in b.argv:
        return
    b.add(
        "--load-mode",
        "none",
        f"{served} weights are copied into the CPU backend's repack buffer: read the file once, "
        "not kept mapped beside the copy",
    )


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
    """The guard around the model's own chat template (models/chat_template.py): a request's
    reasoning_effort the template refuses is answered at the profile's fallback, and a system or
    developer message after the first turn, which Qwen3.5/3.6's template refuses, as a user message."""
    profile = inputs.profile
    guards = inputs.chat_template_guards or (
        ("reasoning_effort",) if profile is not None and profile.reasoning_effort_fallback else ()
    )
    if not guards:
        return
    effort = "reasoning_effort" in guards and profile is not None
    takes = ", ".join(profile.reasoning_efforts) if profile is not None else ""
    fallback = profile.reasoning_effort_fallback if profile is not None else None
    whose = f"profile {profile.name}'s wrapper" if effort and profile is not None else "bonsai's guard"
    if given & {"--chat-template", "--chat-template-file"}:
        lost = [f"a request's reasoning_effort other than {takes} reaches the template as sent"] if effort else []
        if "late_system" in guards:
            lost.append("a system message after the first turn reaches it as sent (and is refused)")
        b.warnings.append(f"your chat template after -- replaces {whose}: " + "; ".join(lost))
    elif inputs.chat_template is not None:
        require_flag(inputs.capabilities, "--chat-template-file", f"the chat template guard ({', '.join(guards)})")
        why = ["the model's own chat template behind a guard"]
        if effort:
            why.append(
                f"a request's reasoning_effort other than {takes} (Open WebUI, Cline and Kilo send high, which "
                f"fails) is answered at {fallback}"
            )
        if "late_system" in guards:
            why.append(
                "a system or developer message after the first turn (coding agents send them; the template "
                "refuses them) is passed as a user message in its place"
            )
        b.add(
            "--chat-template-file", str(inputs.chat_template), ": ".join(why[:2]) + "".join(f"; {w}" for w in why[2:])
        )
    elif inputs.chat_template_missing and effort and profile is not None:
        b.warnings.append(
            f"profile {profile.name}'s chat template wrapper is not written yet (`bonsai pull --profile "
            f"{profile.name}` writes it): a request with reasoning_effort high will fail"
        )
    elif inputs.chat_template_missing:
        b.warnings.append(
            "the model's chat template refuses a system message after the first turn; `bonsai start` writes "
            "the guard that passes it as a user message"
        )
