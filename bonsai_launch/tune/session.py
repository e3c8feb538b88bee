"""`bonsai tune`: a short, bounded measurement of plain against the speculative configurations
this build and model allow, ending in a stored decision.

It measures with the bench's own machinery (bench/servers.py and requests.py: a fresh llama-server per run, one
discarded warm-up request, server-side decode timings; bench/summary.py: paired ratios and the
noise rule), in three rounds that fit a time budget:

1. screening: plain, then every candidate once, most promising first (candidates.py). When
   the budget would not leave room for confirmation, the rest is skipped and reported so;
2. and 3. confirmation: plain and the best one or two candidates that beat plain in screening,
   again, in reversed and then original order. Screening counts as the first of the three
   paired runs the noise rule needs.

Every run sees the same prompts, which are not the bench suite's: `bonsai bench` can then
check a decision on prompts the tuning never saw. The default budget is sixteen times the first
plain run (about a minute for the demo model on a laptop CPU), so it scales with the model's
speed; `--budget` sets it in seconds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.bench import data as bench_data
from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench import requests, servers, streams, summary
from bonsai_launch.bench.data import BenchData, BenchOptions, ConfigSpec, Listener, ServerRun, SilentListener
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.decisions import estimate as est
from bonsai_launch.decisions.identity import (
    tune_dir,
)
from bonsai_launch.decisions.store import Decision, save
from bonsai_launch.llamacpp import replay as rp
from bonsai_launch.server.client import HTTPX_DEFAULT_TIMEOUT, session
from bonsai_launch.tune import screen as tm
from bonsai_launch.tune.decide import decide
from bonsai_launch.tune.subject import TuneRequest, measured_decision, plan_candidates, subject, tuned_model

PROMPTS_FILE = Path(__file__).with_name("prompts.jsonl")
# Default budget, in first-plain-run times. A run is now about 2.5 times the old one (answers
# of DEFAULT_MAX_TOKENS, not 64), and replay screening leaves 3 plain and 3 x 2-3 finalist runs
# to measure: 7 such runs are about the 16 short ones of before (docs/benchmarks.md, issue 47).
BUDGET_RUNS = 7
# Answer length when the prompts do not say (the sample records each answer's length): the
# shortest at which the replayed ranking of the n-gram candidates on the bundled prompts is the
# one long answers give (docs/benchmarks.md, issue 47). ngram-mod drafts only runs of 48+ tokens.
DEFAULT_MAX_TOKENS = 192
# A sample's answers, each capped: one 4000-token answer would take the whole budget.
SAMPLE_MAX_TOKENS = 512
MIN_BUDGET_S = 20.0
CONFIRM_ROUNDS = 2


@dataclass(frozen=True)
class TuneOptions:
    budget_s: float | None = None  # None: BUDGET_RUNS x the first plain run
    max_tokens: int | None = None  # None: each prompt's own (a sample's), else DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    prompts_path: str | None = None  # None: the bundled tuning prompts
    configs: tuple[str, ...] | None = None  # only these candidates (plain always)
    finalists: int = 2
    seed: int = 42
    clients: int = 1  # concurrent clients per run (`--parallel N`: N, as many as the launch has slots)


@dataclass
class TuneOutcome:
    decision: Decision
    doc: dict[str, Any]
    paths: dict[str, str]
    stored: Path
    budget_s: float
    elapsed_s: float
    notes: list[str] = field(default_factory=list)


RECENT = "recent"  # --prompts recent: the sample BONSAI_TUNE_SAMPLE keeps of the model's own requests


def load_tuning_prompts(path: str | None, model: Path | None = None) -> tuple[list[suite.Prompt], str]:
    """The prompts and how the decision names them: a file, the bundled ones, or (`recent`) the
    sample of what a server of `model` was sent (server/prompt_sample.py)."""
    if path == RECENT:
        from bonsai_launch.server.prompt_sample import sample_path

        sample = sample_path(model) if model is not None else None
        if sample is None or not sample.is_file():
            raise BonsaiError(
                f"--prompts recent: no sample of recent requests for {model.name if model else 'this model'} yet",
                "start the server with BONSAI_TUNE_SAMPLE=200 (prompts kept), serve your work, then tune again",
            )
        prompts = suite.load_prompts(sample)
        return prompts, f"{len(prompts)} recent requests ({sample})"
    prompts = suite.load_prompts(path or PROMPTS_FILE)
    return prompts, (str(Path(path).expanduser()) if path else "bundled tuning prompts")


def answer_lengths(prompts: list[suite.Prompt], max_tokens: int | None) -> tuple[list[suite.Prompt], str]:
    """Each prompt's answer length, and how the decision names them: --max-tokens for all, else
    each prompt's own (a sample records what the server generated), capped, else the default."""
    if max_tokens is not None:
        return [dataclasses.replace(p, max_tokens=None) for p in prompts], f"{max_tokens} tokens each"
    own = [p.max_tokens for p in prompts if p.max_tokens]
    out = [
        dataclasses.replace(p, max_tokens=min(p.max_tokens or DEFAULT_MAX_TOKENS, SAMPLE_MAX_TOKENS)) for p in prompts
    ]
    if not own:
        return out, f"{DEFAULT_MAX_TOKENS} tokens each"
    sizes = sorted(p.max_tokens or 0 for p in out)
    return out, f"answers as long as the prompts' own ({sizes[0]}-{sizes[-1]} tokens, median {sizes[len(sizes) // 2]})"


def _replay_problem(binary: Path | None) -> str | None:
    """Why draft-free candidates cannot be screened by replay with this binary (None: they can)."""
    if binary is None:
        return "no llama-server"
    try:
        rp.tool_for(binary)
    except rp.ReplayUnavailable as exc:
        return str(exc).splitlines()[0]
    return None


class _OutOfTime(Exception):
    """The budget ran out in the middle of a run: its partial results are dropped."""


class _Clock:
    """Elapsed time against the budget, and how long one server run takes."""

    def __init__(self, budget_s: float | None) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.runs: list[float] = []

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def estimate(self) -> float:
        return max(self.runs) if self.runs else 0.0

    def over(self) -> bool:
        return self.budget_s is not None and self.elapsed > self.budget_s

    def fits(self, runs: int) -> bool:
        return self.budget_s is None or self.elapsed + self.estimate() * runs <= self.budget_s


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


def _rounds(
    plain: ConfigSpec,
    others: list[ConfigSpec],
    measure,
    clock: _Clock,
    data: BenchData,
    skipped: dict[str, str],
    notes: list[str],
    options: TuneOptions,
    prompts: list[suite.Prompt],
    listener: Listener,
    screen: tm.Screen | None,
    binary: Path | None,
    prior: est.CostModel | None,
) -> None:
    """Screening (the draft-free candidates by replay, the others by one run each), then every
    finalist measured three times, paired with plain."""
    measure(plain, 0)
    if clock.budget_s is None:
        clock.budget_s = max(MIN_BUDGET_S, BUDGET_RUNS * clock.runs[0])
        notes.append(f"budget {clock.budget_s:.0f} s: {BUDGET_RUNS} x the first plain run ({clock.runs[0]:.1f} s)")
    replayed = [s for s in others if screen is not None and s.name in screen.args]
    picked = _screen_by_replay(screen, replayed, binary, data, plain, prompts, prior, notes)
    if screen is not None and screen.replays:
        screen.picked = picked
        skipped.update(tm.not_picked(screen, picked))
        run_once = [s for s in others if s.name not in screen.replays]
    else:
        run_once = others
    for spec in run_once:
        if not clock.fits(1 + CONFIRM_ROUNDS * 2):
            skipped[spec.name] = f"budget ({clock.budget_s:.0f} s; raise --budget)"
            continue
        measure(spec, 0)
    ratios = _screening_ratios(data, plain.name)
    by_run = [
        s
        for s in sorted(run_once, key=lambda s: ratios.get(s.name, 0.0), reverse=True)
        if ratios.get(s.name, 0.0) > 1.0
    ][: options.finalists]
    by_replay = sorted((s for s in others if s.name in picked), key=lambda s: list(picked).index(s.name))
    # Keep as many finalists as every round has room for, the least important last: measuring
    # one in round 1 and running out before round 2 would confirm nothing.
    finalists = by_replay + by_run

    def cost(f: list[ConfigSpec]) -> int:
        return sum(1 for s in f if s in by_replay) + CONFIRM_ROUNDS * (1 + len(f))

    while len(finalists) > 1 and not clock.fits(cost(finalists)):
        dropped = finalists.pop()
        skipped[dropped.name] = (
            f"a finalist ({picked.get(dropped.name, 'ahead in screening')}), but the budget ({clock.budget_s:.0f} s) ran out; raise --budget"
        )
    listener.total(len(data.requests) + len(prompts) * cost(finalists))
    for spec in finalists:
        if spec in by_replay:
            measure(spec, 0)
    if screen is not None and screen.replays:  # the verify cost, now measured on the finalists
        screen.cost = est.fit(*tm.measured(data, plain.name), prior=screen.cost)
        tm.estimate_all(screen, prompts)
    for round_number in range(1, CONFIRM_ROUNDS + 1) if finalists else ():
        while len(finalists) > 1 and not clock.fits(1 + len(finalists)):
            finalists.pop()
        if not clock.fits(1 + len(finalists)):
            notes.append(
                f"the budget ({clock.budget_s:.0f} s) ran out before confirmation round {round_number}: "
                "no gain can be confirmed, so plain is kept; raise --budget"
            )
            break
        order = finalists + [plain] if round_number % 2 else [plain] + finalists
        for spec in order:
            measure(spec, round_number)


def check_options(options: TuneOptions) -> None:
    """Refuse options that cannot measure anything; cheap, so callers run it before any download."""
    if options.max_tokens is not None and options.max_tokens < 16:
        raise BonsaiError(f"--max-tokens {options.max_tokens} is too small to measure decode speed", "use 32 or more")
    if options.clients < 1:
        raise BonsaiError(f"{options.clients} clients cannot measure anything", "use 1 or more")
    if options.budget_s is not None and options.budget_s < 5:
        raise BonsaiError(f"--budget {options.budget_s:g} is too short", "give at least 30 seconds, or leave it out")


def run_tune(
    request: TuneRequest,
    options: TuneOptions = TuneOptions(),
    listener: Listener | None = None,
    log_dir: Path | None = None,
) -> TuneOutcome:
    """Measure, decide, store. Every server it starts is stopped, also on errors and Ctrl+C."""
    from bonsai_launch.bench import report
    from bonsai_launch.bench.pipeline import busy_note
    from bonsai_launch.core.paths import logs_dir

    listener = listener or SilentListener()
    check_options(options)
    prompts, prompts_name = load_tuning_prompts(options.prompts_path, tuned_model(request))
    prompts, lengths = answer_lengths(prompts, options.max_tokens)
    replay_why = _replay_problem(request.binary)
    subj = subject(request, prompts, options.configs, replayable=replay_why is None)
    specs, refused = plan_candidates(request, subj.candidates)
    skipped: dict[str, str] = {**refused}
    for name, why in subj.unusable.items():
        skipped.setdefault(name, why)
    plain = next(s for s in specs if s.baseline)
    others = [s for s in specs if not s.baseline]
    if not others:
        raise BonsaiError(
            "no speculative configuration can run with this build and model: "
            + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
            "rebuild with `bonsai build`, or pass --drafter PATH",
        )

    bench_options = BenchOptions(
        configs=tuple(s.name for s in specs),
        temps=(options.temperature,),
        repeats=3,
        max_tokens=options.max_tokens or DEFAULT_MAX_TOKENS,
        tradeoffs=False,
        seed=options.seed,
        prompts_path=options.prompts_path,
        per_category=None,
    )
    data = BenchData("launch", bench_options, specs, prompts)
    data.environment = bench_data.environment(str(request.binary))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = log_dir or (logs_dir() / "tune" / stamp)
    clock = _Clock(options.budget_s)
    measured: dict[str, int] = defaultdict(int)
    listener.total(len(prompts) * (len(specs) + CONFIRM_ROUNDS * (1 + options.finalists)))
    meta = {c.name: {"spec_type": c.spec_type, "n_max": c.n_max, "label": c.label} for c in subj.candidates}
    screen = tm.Screen({}, tm.replayable(specs), meta) if replay_why is None else None
    prior = tm.prior_cost(subj.key.machine, subj.key.build, subj.key.model_sha256) if screen else None

    def measure(spec: ConfigSpec, repeat: int) -> None:
        """One fresh server, all prompts; stopped at the budget (its partial run then dropped)."""
        run = ServerRun(spec.name, repeat, f"temp={options.temperature:g}")
        data.servers.append(run)
        t0, done_before = time.monotonic(), len(data.requests)
        with servers.launched(spec, run, log_dir, listener) as endpoint, session(None, HTTPX_DEFAULT_TIMEOUT) as http:
            requests.warm_up(http, endpoint, spec, bench_options)
            if options.clients > 1:  # the load: every prompt at once through N clients
                requests.run_clients(
                    endpoint, spec, bench_options, prompts, options.temperature, repeat, data, listener, options.clients
                )
            for prompt in prompts if options.clients == 1 else ():
                if clock.over():
                    del data.requests[done_before:]
                    raise _OutOfTime(spec.name)
                requests.run_suite(
                    http, endpoint, spec, bench_options, [prompt], options.temperature, repeat, data, listener
                )
            if spec.baseline and repeat == 0 and screen is not None and screen.args:  # the tokens to replay
                n_ctx = spec.plan.ctx // max(1, options.clients)
                new = data.requests[done_before:]
                screen.streams.update(streams.record(endpoint, prompts, new, bench_options.max_tokens, n_ctx))
        clock.runs.append(time.monotonic() - t0)
        measured[spec.name] += 1

    budget = f"{options.budget_s:.0f} s" if options.budget_s else f"{BUDGET_RUNS} x the first plain run"
    listener.note(
        f"tuning {subj.model.name}: plain against {', '.join(s.name for s in others)} "
        f"({len(prompts)} prompts, {lengths}, {options.clients} client(s) at once; "
        f"budget {budget})"
    )
    notes: list[str] = []
    try:
        _rounds(
            plain,
            others,
            measure,
            clock,
            data,
            skipped,
            notes,
            options,
            prompts,
            listener,
            screen,
            request.binary,
            prior,
        )
    except _OutOfTime as stopped:
        notes.append(
            f"the budget ({clock.budget_s:.0f} s) ran out while measuring {stopped}: its partial run was "
            "dropped; without three paired runs no gain is confirmed, so plain is kept; raise --budget"
        )
        for spec in others:
            if not measured.get(spec.name):
                skipped.setdefault(spec.name, f"budget ({clock.budget_s:.0f} s; raise --budget)")
    data.finished = time.time()
    data.environment["load_average_end"] = bench_data.loadavg()
    busy = busy_note(data.environment)
    if busy:
        notes.append(busy)
    data.notes.extend(notes)

    doc = summary.summarize(data)
    choice, table = decide(doc, skipped)
    out_dir = tune_dir() / "reports" / stamp
    paths = report.write_reports(doc, out_dir)
    first = plain.plan
    decision = measured_decision(
        subj,
        doc,
        choice,
        table,
        "tune",
        prompts_name,
        len(prompts),
        {
            "report": paths.get("json"),
            "duration_s": round(clock.elapsed, 1),
            "budget_s": round(clock.budget_s or 0, 1),
            "max_tokens": options.max_tokens or DEFAULT_MAX_TOKENS,
            "answer_lengths": lengths,
            "temperature": options.temperature,
            "replay": screen.to_json() if screen is not None and screen.replays else {"unavailable": replay_why},
            "clients": options.clients,
            "runs": dict(measured),
            "notes": notes,
            "conditions": {
                "ctx": first.ctx,
                "ngl": first.ngl,
                "backend": first.backend,
                "passthrough": list(request.passthrough),
            },
        },
    )
    stored = save(decision)
    return TuneOutcome(decision, doc, paths, stored, clock.budget_s or 0.0, clock.elapsed, notes)
