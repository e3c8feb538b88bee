"""Screening draft-free candidates without running them: the plain run's own tokens replayed
through every n-gram candidate (llamacpp/replay.py), each candidate's speed estimated from what
it drafts and gets accepted there and this machine's measured cost of a verify step
(decisions/estimate.py).

Which candidates then get their full measured repeats (`finalists`): the best and the second
best over all prompts (the chosen one and its main competitor, so the report never shows a
verdict-less row for either), and every category's best, so that a candidate ahead on one kind
of work is measured even when the mix favours another. Only those faster than plain in the
replay. The estimates decide what is measured; the decision is made on the measured runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.data import BenchData, ConfigSpec
from bonsai_launch.decisions import estimate as est
from bonsai_launch.llamacpp import replay as rp

ALL = "all"
# A category's best is measured besides the two best overall only when it is this much ahead of
# both there: the bench's smallest noise band; closer than that, they stand for that work too.
AHEAD = 0.05


@dataclass
class Screen:
    """Replayed counts per candidate and prompt, and the estimates made from them."""

    streams: dict[str, rp.Stream]  # by prompt id
    args: dict[str, list[str]]  # candidate -> its replay flags
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)  # candidate -> spec_type, n_max, label
    replays: dict[str, dict[str, rp.Replayed]] = field(default_factory=dict)  # candidate -> prompt id -> counts
    cost: est.CostModel | None = None
    estimates: dict[str, dict[str, est.Estimate]] = field(default_factory=dict)  # config -> category -> estimate
    picked: dict[str, str] = field(default_factory=dict)  # finalist -> why

    def ratio(self, name: str, category: str = ALL) -> float | None:
        plain = self.estimates.get("plain", {}).get(category)
        mine = self.estimates.get(name, {}).get(category)
        if plain is None or mine is None or not plain.tps:
            return None
        return mine.tps / plain.tps

    def to_json(self) -> dict[str, Any]:
        """What a decision keeps: each candidate's flags (the keeper replays the server's own
        traffic through them, server/traffic.py), the cost model and the estimates."""
        return {
            "cost": self.cost.to_json() if self.cost else None,
            "prompts": len(self.streams),
            "candidates": {
                name: {
                    **self.meta.get(name, {}),
                    "args": self.args[name],
                    "estimate": {c: e.to_json() for c, e in self.estimates.get(name, {}).items()},
                    "ratio": _round(self.ratio(name)),
                    "finalist": self.picked.get(name),
                }
                for name in self.args
            },
            "plain": {c: e.to_json() for c, e in self.estimates.get("plain", {}).items()},
        }


def _round(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None


def replayable(specs: Iterable[ConfigSpec]) -> dict[str, list[str]]:
    """The candidates whose launches draft without a model, with their replay flags."""
    out = {}
    for spec in specs:
        args = rp.replay_args(spec.plan.argv) if not spec.baseline and spec.plan is not None else None
        if args is not None:
            out[spec.name] = args
    return out


def run_replays(binary: Path, screen: Screen) -> None:
    """Every candidate over every stream (milliseconds each); raises ReplayUnavailable."""
    tool = rp.tool_for(binary)
    ids = list(screen.streams)
    streams = [screen.streams[i] for i in ids]
    for name, args in screen.args.items():
        screen.replays[name] = dict(zip(ids, rp.replay(tool, args, streams), strict=True))


def measured(data: BenchData, baseline: str) -> tuple[list[est.Measured], list[est.Measured]]:
    """The suite requests measured so far, as the cost model's fit takes them."""
    plain: list[est.Measured] = []
    spec: list[est.Measured] = []
    for r in data.requests:
        if r.phase != "suite" or r.error or not r.predicted_ms or not r.predicted_n:
            continue
        m = est.Measured(r.predicted_ms, r.predicted_n - 1, r.verify_steps or 0, r.drafted or 0, r.accepted or 0)
        (plain if r.config == baseline else spec).append(m)
    return plain, spec


def estimate_all(screen: Screen, prompts: Sequence[suite.Prompt]) -> None:
    """Estimates per category and over all prompts, for plain and every replayed candidate."""
    assert screen.cost is not None
    groups: dict[str, list[str]] = {ALL: []}
    for p in prompts:
        if p.id in screen.streams:
            groups[ALL].append(p.id)
            groups.setdefault(p.category, []).append(p.id)
    screen.estimates = {
        "plain": {
            c: est.plain_estimate((len(screen.streams[i].generated) - 1 for i in ids), screen.cost)
            for c, ids in groups.items()
        }
    }
    for name, by_prompt in screen.replays.items():
        screen.estimates[name] = {
            c: est.estimate([by_prompt[i] for i in ids], screen.cost) for c, ids in groups.items()
        }


# How finalists() words the choice and its main competitor (rounds.py always measures them in full)
OVERALL = ("best over all prompts", "second best over all prompts", "closest to plain")


def finalists(screen: Screen, categories: Sequence[str]) -> dict[str, str]:
    """The candidates to measure fully, in priority order, with why each one: the best two
    over all prompts, and each category's best when it is AHEAD of both there. When none is
    ahead in the replay but some drafts were kept, the closest one: the cost model may be the
    prior's, and its own runs measure it (on a GPU a drafted token costs far less)."""
    names = [n for n in screen.replays if (screen.ratio(n) or 0.0) > 1.0]
    pooled = sorted(names, key=lambda n: screen.ratio(n) or 0.0, reverse=True)
    out: dict[str, str] = {}
    for rank, name in enumerate(pooled[:2]):
        out[name] = f"{'best' if rank == 0 else 'second best'} over all prompts (est. {screen.ratio(name):.2f}x plain)"
    kept = [n for n in screen.replays if (screen.estimates.get(n, {}).get(ALL) or est.Estimate(0, 0)).accepted]
    if not out and kept:  # none ahead with the cost model so far: measure the closest, which also measures the cost
        best = max(kept, key=lambda n: screen.ratio(n) or 0.0)
        out[best] = f"closest to plain (est. {screen.ratio(best) or 0.0:.2f}x plain), measured to check the estimate"
    overall = list(out)
    for category in categories:
        ahead = [n for n in screen.replays if (screen.ratio(n, category) or 0.0) > 1.0]
        if not ahead:
            continue
        leader = max(ahead, key=lambda n: screen.ratio(n, category) or 0.0)
        lead = screen.ratio(leader, category) or 0.0
        if all(lead >= (screen.ratio(n, category) or 0.0) * (1 + AHEAD) for n in overall):
            out.setdefault(leader, f"best on {category} (est. {lead:.2f}x plain)")
    return out


def not_picked(screen: Screen, picked: Mapping[str, str]) -> dict[str, str]:
    """Why each replayed candidate outside the finalists was not measured."""
    out = {}
    for name in screen.replays:
        if name in picked:
            continue
        e = screen.estimates.get(name, {}).get(ALL)
        ratio = screen.ratio(name)
        acc = f", {e.acceptance:.0%} of {e.drafted} drafted accepted" if e and e.acceptance is not None else ""
        what = f"est. {ratio:.2f}x plain" if ratio is not None else "no estimate"
        out[name] = f"replayed on the plain run's tokens: {what}{acc}; behind the finalists in every category"
    return out


def prior_cost(machine: str, build: str, model_sha256: str) -> est.CostModel | None:
    """The cost model the newest decision for this machine, build and model fitted: it orders
    the first measurements better than the built-in prior."""
    from bonsai_launch.decisions.store import load_all

    for d in load_all():
        if (d.key.machine, d.key.build, d.key.model_sha256) == (machine, build, model_sha256):
            cost = est.CostModel.from_json((d.evidence.get("replay") or {}).get("cost"))
            if cost is not None and cost.spec_requests:
                return cost
    return None
