"""Speed from replayed acceptance: what a draft-free candidate would decode at on a stream,
from what it drafts and gets accepted there (llamacpp/replay.py) and this machine's cost of a
verify step. Pure.

The cost model has two numbers, both measured on this machine and model by `bonsai tune`:
`step_ms`, the time of one plain decode step, and `kappa`, what each drafted token adds to a
verify step, in plain steps. A stream a candidate decodes in p plain steps and s verify steps
carrying d drafted tokens then takes step_ms * (p + s + kappa * d). kappa is large where the
output layer is a large part of the model (Gemma 3 270M: 168M of its 268M weights are the
vocabulary, computed for every verified token) and small on a GPU.

The fit: step_ms from plain runs (decode time over steps), kappa from speculative runs, whose
steps and drafted tokens the server counts: kappa = sum(ms / step_ms - p - s) / sum(d).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Before any speculative run of this machine and model is measured: the demo model's kappa on
# the development machine (docs/benchmarks.md, issue 47). It orders the first measurements
# only; the decision is made on measured runs and the fit replaces it.
PRIOR_KAPPA = 0.3


class Counts(Protocol):
    @property
    def plain_steps(self) -> int: ...
    @property
    def spec_steps(self) -> int: ...
    @property
    def drafted(self) -> int: ...
    @property
    def accepted(self) -> int: ...


@dataclass(frozen=True)
class CostModel:
    step_ms: float  # one plain decode step
    kappa: float  # one drafted token in a verify step, in plain steps
    plain_requests: int = 0  # how many requests each part was fitted on (0: a prior)
    spec_requests: int = 0

    def ms(self, c: Counts) -> float:
        return self.step_ms * (c.plain_steps + c.spec_steps + self.kappa * c.drafted)

    def to_json(self) -> dict[str, Any]:
        return {
            "step_ms": round(self.step_ms, 4),
            "kappa": round(self.kappa, 4),
            "plain_requests": self.plain_requests,
            "spec_requests": self.spec_requests,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> CostModel | None:
        if not data or not data.get("step_ms"):
            return None
        return cls(
            float(data["step_ms"]),
            float(data.get("kappa", PRIOR_KAPPA)),
            int(data.get("plain_requests", 0)),
            int(data.get("spec_requests", 0)),
        )


@dataclass(frozen=True)
class Measured:
    """One measured request: decode time and what the server counted."""

    ms: float
    tokens: int  # generated tokens after the first
    spec_steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def plain_steps(self) -> int:
        return max(0, self.tokens - self.spec_steps - self.accepted)


def fit(plain: Iterable[Measured], spec: Iterable[Measured], prior: CostModel | None = None) -> CostModel | None:
    """The cost model from measured requests; kappa stays the prior's until a speculative
    request drafted something. None without a plain request."""
    plain = [m for m in plain if m.tokens > 0 and m.ms > 0]
    if not plain:
        return prior
    step_ms = sum(m.ms for m in plain) / sum(m.tokens for m in plain)
    spec = [m for m in spec if m.drafted > 0 and m.ms > 0]
    drafted = sum(m.drafted for m in spec)
    if not drafted:
        kappa = prior.kappa if prior is not None else PRIOR_KAPPA
        return CostModel(step_ms, kappa, len(plain), prior.spec_requests if prior else 0)
    extra = sum(m.ms / step_ms - m.plain_steps - m.spec_steps for m in spec)
    return CostModel(step_ms, max(0.0, extra / drafted), len(plain), len(spec))


@dataclass(frozen=True)
class Estimate:
    """A candidate's replayed figures over some streams, with the speed the cost model gives."""

    tokens: int
    ms: float
    drafted: int = 0
    accepted: int = 0

    @property
    def tps(self) -> float:
        return 1000.0 * self.tokens / self.ms if self.ms > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "est_tps": round(self.tps, 2),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4) if self.acceptance is not None else None,
        }


def estimate(replays: Sequence[Counts], cost: CostModel) -> Estimate:
    tokens = sum(r.plain_steps + r.spec_steps + r.accepted for r in replays)
    return Estimate(
        tokens,
        sum(cost.ms(r) for r in replays),
        sum(r.drafted for r in replays),
        sum(r.accepted for r in replays),
    )


def plain_estimate(token_counts: Iterable[int], cost: CostModel) -> Estimate:
    """Plain decoding of streams of these many tokens (after the first)."""
    tokens = sum(token_counts)
    return Estimate(tokens, cost.step_ms * tokens)
