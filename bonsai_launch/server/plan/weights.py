"""The memory a launch needs: the weights the chosen path holds (models/weight_path.py), the KV
cache of the planned context, and whether they fit this machine, on the CPU or the first GPU.

The context's auto value comes from the RAM tier (context.py); on a CPU build it is then capped
so that the weights, the KV cache and a reserve fit in RAM, as free GPU memory caps it when
offloading (plan_context: one model's -c, fitted to its slots too). Sized from the bytes the server holds, not the file's: a PTQ1_0 file served as its
Q2_0 repack holds 29% more than it weighs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bonsai_launch.core.hardware import Hardware
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.models.weight_path import gb
from bonsai_launch.server.plan.context import (
    GIB,
    GPU_MARGIN_BYTES,
    MIN_CTX,
    SPECULATIVE_MIN_CTX,
    auto_ctx_from_ram,
    gpu_ctx_limit,
)

if TYPE_CHECKING:
    from bonsai_launch.server.plan.types import ArgvBuilder, PlanInputs

# What RAM holds besides the weights and the KV cache: the system and the other programs, and
# llama-server's compute buffers (the logits of one ubatch alone are 0.5 GB at a 248k vocabulary).
RAM_RESERVE_BYTES = 2 * GIB


def backend_of(caps: Capabilities | None, hardware: Hardware | None) -> str:
    """The probed build's backend; without a build, what this machine's hardware suggests."""
    if caps is not None:
        return caps.backend
    if hardware is not None and hardware.gpus:
        return "cuda"
    if hardware is not None and hardware.metal:
        return "metal"
    return "cpu"


def gpu_layers(setting: int | None, backend: str) -> int:
    """The -ngl a plan passes: BONSAI_NGL when set, else nothing offloaded on a CPU build and
    every layer on a GPU one."""
    return gpu_layers_and_why(setting, "", backend, probed=True)[0]


def gpu_layers_and_why(setting: int | None, source: str, backend: str, probed: bool) -> tuple[int, str]:
    """gpu_layers' value and the plan's reason for it, decided once: `source` names where the
    setting came from, `probed` whether the backend is the build's (else the hardware's guess)."""
    if setting is not None:
        return setting, f"BONSAI_NGL/--ngl ({source})"
    if backend == "cpu":
        return 0, "CPU build: nothing to offload" if probed else "no GPU detected"
    return 99, f"{backend} backend: offload all layers"


def head_on_cpu(backend: str, ngl: int, layers: int | None) -> bool:
    """Whether the CPU computes the LM head at this -ngl: a CPU build, or GPU layers that stop
    short of the output layer (llama.cpp offloads it only with more GPU layers than the model's
    blocks). Patches 0015-0016 cut the draft head by default only there."""
    return backend == "cpu" or ngl == 0 or (layers is not None and ngl <= layers)


def held_bytes(inputs: PlanInputs, with_drafter: bool) -> int:
    """The weights' bytes in memory: the chosen path's (the file's when no path was chosen), and
    the drafter's when it is loaded."""
    weights = inputs.weights.weight_bytes if inputs.weights is not None else inputs.model.file_size
    return weights + (inputs.drafter.file_size if with_drafter and inputs.drafter is not None else 0)


def ram_ctx_limit(hardware: Hardware, weights_bytes: int, kv_per_token: int | None) -> int | None:
    """The largest context whose KV cache fits in RAM beside the weights and the reserve, or None."""
    if not kv_per_token or not hardware.ram_bytes:
        return None
    available = hardware.ram_bytes - weights_bytes - RAM_RESERVE_BYTES
    return max(0, available // kv_per_token) // 1024 * 1024


def fit_to_ram(inputs: PlanInputs, ctx: int, why: str, weights: int, b: ArgvBuilder) -> tuple[int, str]:
    """An auto context on a CPU build, capped by what RAM holds beside the weights."""
    kv = inputs.model.kv_bytes_per_token(_kv_value_bytes(inputs))
    limit = ram_ctx_limit(inputs.hardware, weights, kv)
    if limit is None or limit >= ctx:
        return ctx, why
    ram = f"{inputs.hardware.ram_gb:.0f} GB RAM"
    if limit < MIN_CTX:
        b.warnings.append(
            f"the weights ({gb(weights)}) leave too little of this machine's {ram} for a KV cache: context set "
            f"to {MIN_CTX}; the server may not start or may swap (a smaller codec, BONSAI_KV4=1, or more RAM)"
        )
        return MIN_CTX, f"auto: the minimum; the weights ({gb(weights)}) nearly fill the {ram}"
    return (
        limit,
        f"auto: limited by {ram} after the weights ({gb(weights)}) and a {RAM_RESERVE_BYTES // GIB} GiB reserve",
    )


def _kv_value_bytes(inputs: PlanInputs) -> float:
    return 0.5625 if inputs.settings["kv4"] else 2.0


def memory(inputs: PlanInputs, ctx: int, ngl: int, with_drafter: bool) -> dict[str, Any]:
    """What the launch holds and where: weights (path and bytes), the KV cache of `ctx` tokens,
    the memory it goes to and whether it fits, with a sentence for people."""
    weights = held_bytes(inputs, with_drafter)
    kv_per_token = inputs.model.kv_bytes_per_token(_kv_value_bytes(inputs)) or 0
    kv = kv_per_token * ctx
    gpu = inputs.hardware.gpus[0] if ngl > 0 and inputs.hardware.gpus else None
    where, room = (
        (f"{gpu.name}'s free memory", gpu.free_bytes - GPU_MARGIN_BYTES)
        if gpu is not None
        else ("RAM", inputs.hardware.ram_bytes - RAM_RESERVE_BYTES)
    )
    path = inputs.weights
    fits = weights + kv <= room
    shown = path.describe() if path is not None else f"{gb(weights)} of weights"
    verdict = "fits in" if fits else "does NOT fit in"
    reserve = f"{GPU_MARGIN_BYTES // GIB} GiB" if gpu is not None else f"{RAM_RESERVE_BYTES // GIB} GiB"
    sentence = (
        f"{shown}; KV cache {gb(kv)} for {ctx} tokens; {gb(weights + kv)} in all, "
        f"{verdict} the {gb(max(room, 0))} of {where} beyond a {reserve} reserve"
    )
    return {
        "weights": path.to_json() if path is not None else {"weight_bytes": weights},
        "held_bytes": weights,
        "kv_bytes": kv,
        "ctx": ctx,
        "where": "gpu" if gpu is not None else "ram",
        "room_bytes": room,
        "fits": fits,
        "summary": sentence,
    }


def plan_context(
    inputs: PlanInputs, speculative: bool, ngl: int, slot_count: int | None, b: ArgvBuilder
) -> tuple[int, int]:
    """-c, and each slot's share of it: explicit wins; else the RAM tier, capped by free GPU
    memory when offloading; speculation's floor; then fitted to the slots. Returns (ctx, per slot)."""
    from bonsai_launch.server import slots as slot_rules
    from bonsai_launch.server.plan.server import setting_why

    s, profile = inputs.settings, inputs.profile
    ctx_setting = s.get("ctx") or 0
    floor_why = "speculation: at least 16384 (requests re-prefill, the model thinks before answering)"
    if ctx_setting > 0:
        ctx = ctx_setting
        ctx_why = f"set explicitly ({s.source('ctx')})"
        if speculative and s.source("ctx") == "profile" and ctx < SPECULATIVE_MIN_CTX:
            ctx, ctx_why = SPECULATIVE_MIN_CTX, floor_why
        elif speculative and ctx < SPECULATIVE_MIN_CTX:
            b.warnings.append(
                f"context {ctx} ({setting_why(s, 'ctx', 'explicit').replace('set by', 'set by the')}) is "
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
            ctx, ctx_why = fit_to_ram(inputs, ctx, ctx_why, held_bytes(inputs, speculative), b)
        else:
            weights = held_bytes(inputs, speculative)
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
        if speculative and ctx < SPECULATIVE_MIN_CTX:
            ctx, ctx_why = SPECULATIVE_MIN_CTX, floor_why
    per_slot_ctx = ctx
    if slot_count is not None and slot_count > 1:
        explicit_ctx = ctx_setting > 0 and s.source("ctx") != "profile"
        minimum, label = (
            (SPECULATIVE_MIN_CTX, "the speculative minimum per slot")
            if speculative
            else (MIN_CTX, "the minimum per slot")
        )
        fitted = slot_rules.context_for_slots(slot_count, bool(s["kv_unified"]), minimum, ctx, explicit_ctx, label)
        ctx_why = fitted.why if fitted.ctx != ctx else f"{ctx_why}; {fitted.why}"
        ctx, per_slot_ctx = fitted.ctx, fitted.per_slot
        if fitted.warning:
            b.warnings.append(fitted.warning)
        kv = inputs.model.kv_bytes_per_token(0.5625 if s["kv4"] else 2.0)
        held = held_bytes(inputs, speculative)
        limit = gpu_ctx_limit(inputs.hardware, held, kv) if ngl > 0 else ram_ctx_limit(inputs.hardware, held, kv)
        if limit is not None and ctx > limit:
            b.warnings.append(
                f"{slot_count} slots need a {ctx}-token KV cache, more than the about {limit} tokens "
                f"{'free GPU memory' if ngl > 0 else 'RAM beside the weights'} holds; use fewer slots, "
                "BONSAI_KV_UNIFIED=1 or BONSAI_KV4=1"
            )
    b.add("-c", ctx, ctx_why)
    return ctx, per_slot_ctx
