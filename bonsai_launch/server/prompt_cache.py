"""Prompt-cache settings for long, repeated chats: which llama-server flags, and why.

A chat client sends the whole conversation with every turn. llama-server answers turn 2+ fast
only when it finds the earlier turns in a cache:
- the slot's own KV cache (same slot, `cache_prompt: true`, which llama-server assumes by default);
- the prompt cache in RAM (`--cache-ram` MiB), which keeps conversations that lost their slot,
  restored on the next turn; `--cache-idle-slots` saves an idle slot there when another
  conversation takes it (it needs the RAM cache);
- context checkpoints (`--ctx-checkpoints` per slot): hybrid and sliding-window models (Bonsai 27B,
  Gemma 3) cannot trim their cache to a shared prefix, so without checkpoints every turn re-reads
  the whole history. `--cache-reuse` (chunk shifting) does not work for them at all.

The reference launcher recommends `--cache-ram 4096 --ctx-checkpoints 32 --cache-idle-slots` for
long chats and warns against `--cache-ram 0 --ctx-checkpoints 0` as a workaround
(../shared/reference/bonsai-demo-latest.md section 5). llama.cpp b11434 already defaults to
8192 MiB, 32 checkpoints and idle-slot caching, so bonsai passes nothing unless a setting asks
for it. Measured with `bonsai bench --interleave-conversations` on the demo (docs/benchmarks.md,
"Prompt cache in long chats"): the cache cut turn 4's first token from 0.46 s (475 tokens
evaluated again) to 0.22 s (157), 4096 MiB did as well as 8192, and speculation did not change
it; so llama-server's defaults stay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA_CACHE_RAM_MIB = 8192
LLAMA_CTX_CHECKPOINTS = 32


@dataclass(frozen=True)
class CacheFlag:
    flag: str
    value: str | None
    why: str
    setting: str  # the BONSAI_* variable that asked for it


def cache_flags(
    cache_ram: int | None, ctx_checkpoints: int | None, idle_slots: bool | None, sources: dict[str, str]
) -> tuple[list[CacheFlag], list[str]]:
    """(flags to pass, warnings) for the prompt-cache settings; None means llama-server's default."""
    flags: list[CacheFlag] = []
    warnings: list[str] = []
    if cache_ram is not None:
        meaning = "no limit" if cache_ram < 0 else ("off" if cache_ram == 0 else f"{cache_ram} MiB")
        flags.append(
            CacheFlag(
                "--cache-ram",
                str(cache_ram),
                f"prompt cache in RAM: {meaning} (BONSAI_CACHE_RAM, {sources['cache_ram']})",
                "BONSAI_CACHE_RAM",
            )
        )
    if ctx_checkpoints is not None:
        flags.append(
            CacheFlag(
                "--ctx-checkpoints",
                str(ctx_checkpoints),
                f"context checkpoints per slot (BONSAI_CTX_CHECKPOINTS, {sources['ctx_checkpoints']})",
                "BONSAI_CTX_CHECKPOINTS",
            )
        )
    if idle_slots is not None:
        flags.append(
            CacheFlag(
                "--cache-idle-slots" if idle_slots else "--no-cache-idle-slots",
                None,
                f"BONSAI_CACHE_IDLE_SLOTS={'1' if idle_slots else '0'} ({sources['cache_idle_slots']})",
                "BONSAI_CACHE_IDLE_SLOTS",
            )
        )
    if cache_ram == 0 and ctx_checkpoints == 0:
        warnings.append(
            "BONSAI_CACHE_RAM=0 with BONSAI_CTX_CHECKPOINTS=0 turns off every prefix reuse: each turn of a "
            "chat re-reads the whole conversation (use it only to diagnose numeric differences)"
        )
    if cache_ram == 0 and idle_slots:
        warnings.append("BONSAI_CACHE_IDLE_SLOTS=1 needs the RAM prompt cache, which BONSAI_CACHE_RAM=0 turns off")
    return flags, warnings


def describe(cache_ram: int | None, ctx_checkpoints: int | None, idle_slots: bool | None) -> dict[str, Any]:
    """The effective prompt-cache settings for `--dry-run --json` (llama-server's defaults filled in)."""
    return {
        "cache_ram_mib": LLAMA_CACHE_RAM_MIB if cache_ram is None else cache_ram,
        "ctx_checkpoints": LLAMA_CTX_CHECKPOINTS if ctx_checkpoints is None else ctx_checkpoints,
        "cache_idle_slots": True if idle_slots is None else idle_slots,
        "from_llama_server_defaults": [
            k
            for k, v in (
                ("cache_ram_mib", cache_ram),
                ("ctx_checkpoints", ctx_checkpoints),
                ("cache_idle_slots", idle_slots),
            )
            if v is None
        ],
    }
