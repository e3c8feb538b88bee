"""The context size: the floor speculation needs, and the auto value from free RAM or GPU memory."""

from __future__ import annotations

from bonsai_launch.core.hardware import Hardware

SPECULATIVE_MIN_CTX = 16384


GIB = 2**30


# Context by system RAM, as the reference sizes it: (RAM upper bound in GB, context).
RAM_TIERS: tuple[tuple[float, int], ...] = ((11, 8192), (23, 16384), (35, 32768), (71, 65536))


GPU_MARGIN_BYTES = 1 * GIB  # compute buffers and the CUDA context


MIN_CTX = 2048


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
