"""The rounds of a tuning session against its budget: the first plain run, screening (the
draft-free candidates by replaying that run's tokens, tune/screen.py; the others by one run
each), then each finalist's three paired runs, as many finalists as the budget holds, the most
important first. Under the default budget the best and the second best over all prompts (the
choice and its main competitor), whether the replay or a run screened them, always get theirs:
the budget grows for them, with a note.
`measure(spec, repeat)` (session.py) runs one fresh server over every prompt.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench import summary
from bonsai_launch.bench.data import BenchData, ConfigSpec, Listener
from bonsai_launch.decisions import estimate as est
from bonsai_launch.llamacpp import replay as rp
from bonsai_launch.tune import draft_head
from bonsai_launch.tune import screen as tm

MIN_BUDGET_S = 20.0
CONFIRM_ROUNDS = 2


class OutOfTime(Exception):
    """The budget ran out in the middle of a run: its partial results are dropped."""


class Clock:
    """Elapsed time against the budget, and how long one server run takes."""

    def __init__(self, budget_s: float | None) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.runs: list[float] = []
        self.times: dict[str, float] = {}  # each configuration's last run
        self.grown_from: float | None = None  # the default budget before it grew for the best two

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def estimate(self) -> float:
        return max(self.runs) if self.runs else 0.0

    def over(self) -> bool:
        return self.budget_s is not None and self.elapsed > self.budget_s

    def fits(self, runs: int) -> bool:
        return self.budget_s is None or self.elapsed + self.estimate() * runs <= self.budget_s

    def fits_s(self, seconds: float) -> bool:
        return self.budget_s is None or self.elapsed + seconds <= self.budget_s


def _screening_ratios(data: BenchData, baseline: str) -> dict[str, float]:
    """Pooled decode speed of each configuration's first run over plain's."""
    by: dict[str, list] = defaultdict(list)
    for r in data.requests:
        if r.repeat == 0 and r.phase == "suite":
            by[r.config].append(r)
    base = summary.aggregate(by.get(baseline, [])).get("decode_tps")
    ratios = {}
    for name, reqs in by.items():
        tps = summary.aggregate(reqs).get("decode_tps")
        if name != baseline and tps and base:
            ratios[name] = tps / base
    return ratios


def _screen_by_replay(
    screen: tm.Screen | None,
    replayed: list[ConfigSpec],
    binary: Path | None,
    data: BenchData,
    plain: ConfigSpec,
    prompts: list[suite.Prompt],
    prior: est.CostModel | None,
    notes: list[str],
) -> dict[str, str]:
    """Replay the plain run's tokens through the draft-free candidates; the finalists (with
    why), or {} when no replay can be made (every candidate is then screened by a run)."""
    if screen is None or not replayed or binary is None or not screen.streams:
        return {}
    try:
        tm.run_replays(binary, screen)
    except rp.ReplayUnavailable as exc:
        notes.append(f"no replay screening ({str(exc).splitlines()[0]}): every candidate ran once instead")
        screen.replays.clear()
        return {}
    screen.cost = est.fit(*tm.measured(data, plain.name), prior=prior)
    tm.estimate_all(screen, prompts)
    return tm.finalists(screen, suite.categories_of(prompts))


def rounds(
    plain: ConfigSpec,
    others: list[ConfigSpec],
    measure,
    clock: Clock,
    data: BenchData,
    skipped: dict[str, str],
    notes: list[str],
    budget_runs: int,
    max_by_run: int,
    prompts: list[suite.Prompt],
    listener: Listener,
    screen: tm.Screen | None,
    binary: Path | None,
    prior: est.CostModel | None,
    answers: Mapping[str, rp.Stream] | None = None,
    named: frozenset[str] = frozenset(),
) -> None:
    """Screening (the draft-free candidates by replay, the others by one run each), then every
    finalist measured three times, paired with plain."""
    default_budget = clock.budget_s is None
    measure(plain, 0)
    if clock.budget_s is None:
        clock.budget_s = max(MIN_BUDGET_S, budget_runs * clock.runs[0])
        notes.append(f"budget {clock.budget_s:.0f} s: {budget_runs} x the first plain run ({clock.runs[0]:.1f} s)")
    replayed = [s for s in others if screen is not None and s.name in screen.args]
    picked = _screen_by_replay(screen, replayed, binary, data, plain, prompts, prior, notes)
    if screen is not None and screen.replays:
        screen.picked = picked
        skipped.update(tm.not_picked(screen, picked))
        run_once = [s for s in others if s.name not in screen.replays]
    else:
        run_once = others
    run_once = _without_needless_whole_head(run_once, answers or {}, named, skipped)
    twins = [s for s in run_once if draft_head.is_whole_head(s.flags) and s.name not in named]
    run_once = [s for s in run_once if s not in twins]
    if twins and default_budget and clock.budget_s is not None:  # the cut's cost is real on this text
        clock.budget_s += clock.runs[0]
        notes.append(
            f"budget {clock.budget_s:.0f} s: one more plain run's time, for one run with the whole draft head "
            "(plain's answers reach past the head's cut)"
        )
    # the configurations a whole-head twin may belong to go first: the twin is chosen from their
    # screening and runs right after them, on the time the default budget grew by for it (behind
    # the others, a drafter with an n-gram type beside it, the budget had gone before it ran)
    siblings = {draft_head.cut_sibling(t.name) for t in twins}
    first = [s for s in run_once if s.name in siblings]
    room = _screening_room(default_budget)
    _screen_once(first, measure, clock, room, skipped)
    twin = _whole_head_twin(twins, first, data, plain, skipped)
    then = [*([twin] if twin is not None else []), *(s for s in run_once if s.name not in siblings)]
    _screen_once(then, measure, clock, room, skipped)
    run_once = [*first, *then]
    ratios = _screening_ratios(data, plain.name)
    by_run = [
        s
        for s in sorted(run_once, key=lambda s: ratios.get(s.name, 0.0), reverse=True)
        if ratios.get(s.name, 0.0) > 1.0
    ][:max_by_run]
    by_replay = [s for s in others if s.name in picked]
    ranked, why = _ranked(by_replay, by_run, picked, screen, ratios)
    if screen is not None and screen.replays:
        screen.picked = {n: w for n, w in why.items() if n in screen.replays}
    # the choice and its main competitor: never left with a `?` under the default budget (issue 47)
    must = {s.name for s in ranked[:2] if why[s.name].startswith(tm.OVERALL)} if default_budget else set()
    finalists = _fitting(ranked, by_replay, plain, measure, clock, skipped, why, must)
    listener.total(len(data.requests) + len(prompts) * CONFIRM_ROUNDS * (1 + len(finalists)))
    if screen is not None and screen.replays:  # the verify cost, now measured on the finalists
        screen.cost = est.fit(*tm.measured(data, plain.name), prior=screen.cost)
        tm.estimate_all(screen, prompts)
    for round_number in range(1, CONFIRM_ROUNDS + 1) if finalists else ():
        rest = CONFIRM_ROUNDS - round_number + 1
        while (
            len(finalists) > 1
            and finalists[-1].name not in must
            and not clock.fits_s(_left(finalists, plain, clock, rest))
        ):
            finalists.pop()
        _make_room([s for s in finalists if s.name in must], plain, clock, rest)
        if not clock.fits_s(_left(finalists, plain, clock, 1)):
            notes.append(
                f"the budget ({clock.budget_s:.0f} s) ran out before confirmation round {round_number}: "
                "no gain can be confirmed, so plain is kept; raise --budget"
            )
            break
        order = finalists + [plain] if round_number % 2 else [plain] + finalists
        for spec in order:
            measure(spec, round_number)
    if clock.grown_from is not None:
        notes.append(
            f"budget grown from {clock.grown_from:.0f} s to {clock.budget_s:.0f} s so that the best two over all "
            "prompts (the choice and its main competitor) got their three runs each"
        )


def _ranked(
    by_replay: list[ConfigSpec],
    by_run: list[ConfigSpec],
    picked: Mapping[str, str],
    screen: tm.Screen | None,
    ratios: Mapping[str, float],
) -> tuple[list[ConfigSpec], dict[str, str]]:
    """The finalists in one order, with why each: the best two over all prompts whichever way
    they were screened (a replayed candidate by its estimate, any other by its one run), then each
    category's best from the replay, then the rest, best first. Ranking the replay's picks ahead of
    every run-screened candidate left a drafter-with-n-gram pair that screened 2.69x unconfirmed
    while the replay's 2.22x won (docs/benchmarks.md)."""
    score: dict[str, float] = {s.name: ratios.get(s.name, 0.0) for s in by_run}
    for s in by_replay:
        if picked[s.name].startswith(tm.OVERALL):
            score[s.name] = (screen.ratio(s.name) if screen is not None else None) or 0.0
    overall = sorted((s for s in [*by_replay, *by_run] if s.name in score), key=lambda s: score[s.name], reverse=True)
    why = dict(picked)
    for rank, spec in enumerate(overall):
        how = "est. in the replay" if spec in by_replay else "in its screening run"
        place = ("best", "second best")[rank] + " over all prompts" if rank < 2 else "ahead of plain in screening"
        if score[spec.name] > 1.0 or spec not in by_replay:
            why[spec.name] = f"{place} ({how}: {score[spec.name]:.2f}x plain)"
    by_category = [s for s in by_replay if s.name not in score]
    return [*overall[:2], *by_category, *overall[2:]], why


def _without_needless_whole_head(
    specs: list[ConfigSpec], answers: Mapping[str, rp.Stream], named: frozenset[str], skipped: dict[str, str]
) -> list[ConfigSpec]:
    """The whole-draft-head variants only where plain's answers (their tokens, by prompt) have
    enough tokens past the cut to lose by it (tune/draft_head.py), or where --configs names them."""
    why = draft_head.skip_why(answers)
    if why is None:
        return specs
    out = []
    for spec in specs:
        if draft_head.is_whole_head(spec.flags) and spec.name not in named:
            skipped[spec.name] = why
        else:
            out.append(spec)
    return out


def _screening_room(default_budget: bool) -> int:
    """Runs a screening run needs left in the budget. Under the default budget the best two are
    confirmed whatever it costs (the budget grows for them), so the screening may use the budget
    up: asking room for their rounds too left the last candidates listed unscreened, and on the
    synthetic 2B those (draft-mtp with ngram-mod beside it) were the best, at 3.27x against 1.86x.
    Under --budget a candidate is screened only when its confirmation fits as well."""
    return 1 if default_budget else 1 + CONFIRM_ROUNDS * 2


def _screen_once(specs: list[ConfigSpec], measure, clock: Clock, room: int, skipped: dict[str, str]) -> None:
    """One screening run each while `room` runs still fit the budget; the rest skipped, with why."""
    for spec in specs:
        if clock.fits(room):
            measure(spec, 0)
        else:
            skipped[spec.name] = f"budget ({clock.budget_s:.0f} s; raise --budget)"


def _whole_head_twin(
    twins: list[ConfigSpec], screened: list[ConfigSpec], data: BenchData, plain: ConfigSpec, skipped: dict[str, str]
) -> ConfigSpec | None:
    """The whole-head twin worth one screening run: that of the configuration (MTP length or
    drafter) that screened best with the cut. The head's rows change each draft's cost and the
    share of tokens it can draft; a run per twin would cost more than the choice it could change.
    The other twins are left out, with why."""
    if not twins:
        return None
    ratios = _screening_ratios(data, plain.name)
    sibling = {t.name: draft_head.cut_sibling(t.name) for t in twins}
    measured = {s.name for s in screened} & set(ratios)
    ranked = sorted((t for t in twins if sibling[t.name] in measured), key=lambda t: ratios[sibling[t.name]])
    twin = ranked[-1] if ranked else twins[0]
    for other in twins:
        if other is not twin:
            skipped[other.name] = (
                f"the whole head was screened with the best configuration with the cut only ({twin.name})"
            )
    return twin


def _run_s(spec: ConfigSpec, finalists: list[ConfigSpec], clock: Clock) -> float:
    """A run's expected length: its own last one, else the finalists' measured so far, else plain's."""
    if spec.name in clock.times:
        return clock.times[spec.name]
    seen = [clock.times[s.name] for s in finalists if s.name in clock.times]
    return sum(seen) / len(seen) if seen else clock.runs[0]


def _left(finalists: list[ConfigSpec], plain: ConfigSpec, clock: Clock, rounds: int) -> float:
    """Seconds still needed: round 0 of the finalists not measured yet, then `rounds` rounds of all."""
    first = sum(_run_s(s, finalists, clock) for s in finalists if s.name not in clock.times)
    return first + rounds * (_run_s(plain, [], clock) + sum(_run_s(s, finalists, clock) for s in finalists))


def _fitting(
    finalists: list[ConfigSpec],
    by_replay: list[ConfigSpec],
    plain: ConfigSpec,
    measure,
    clock: Clock,
    skipped: dict[str, str],
    picked: dict[str, str],
    must: set[str] | frozenset[str] = frozenset(),
) -> list[ConfigSpec]:
    """Round 0 of each finalist, most important first, while every confirmation round of those
    kept still fits the budget (measuring one and running out before its last round confirms
    nothing); the runs measured so far tell how long the rest takes. The `must` ones are kept
    whatever the budget: it grows for them."""

    def drop(spec: ConfigSpec) -> None:
        why = picked.get(spec.name, "ahead in screening")
        skipped[spec.name] = f"a finalist ({why}), but the budget ({clock.budget_s:.0f} s) ran out; raise --budget"

    kept: list[ConfigSpec] = []
    for spec in finalists:
        if spec.name in must:
            _make_room([s for s in [*kept, spec] if s.name in must], plain, clock, CONFIRM_ROUNDS)
        elif kept and not clock.fits_s(_left([*kept, spec], plain, clock, CONFIRM_ROUNDS)):
            drop(spec)
            continue
        if spec in by_replay:
            measure(spec, 0)
        kept.append(spec)
    while len(kept) > 1 and kept[-1].name not in must and not clock.fits_s(_left(kept, plain, clock, CONFIRM_ROUNDS)):
        drop(kept.pop())
    return kept


def _make_room(specs: list[ConfigSpec], plain: ConfigSpec, clock: Clock, rounds: int) -> None:
    """Grow the budget so these finalists' remaining rounds fit, with a margin of one plain run
    (a run the budget stops is dropped)."""
    if not specs or clock.budget_s is None:
        return
    need = clock.elapsed + _left(specs, plain, clock, rounds) + _run_s(plain, [], clock)
    if need > clock.budget_s:
        clock.grown_from = clock.grown_from or clock.budget_s
        clock.budget_s = need
