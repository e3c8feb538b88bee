"""The bench options the suite's real-server benches share: one greedy pass over a few prompts,
no trade-off rounds (seconds, not minutes, on tiny models)."""

from __future__ import annotations

from typing import Any


def one_pass(configs: tuple[str, ...] = ("plain", "speculative"), **overrides: Any):
    from bonsai_launch.bench.data import BenchOptions

    fields: dict[str, Any] = dict(
        configs=configs,
        categories=("code", "math"),
        per_category=2,
        temps=(0.0,),
        repeats=1,
        max_tokens=32,
        tradeoffs=False,
    )
    return BenchOptions(**{**fields, **overrides})
