"""`bonsai tune`: a short, bounded measurement of plain against the speculative configurations
this build and model allow, ending in a stored decision.

It measures with the bench's own machinery (bench/servers.py and requests.py: a fresh
llama-server per run, one discarded warm-up request, server-side decode timings;
bench/summary.py: paired ratios and the noise rule), in rounds that fit a time budget
(rounds.py):

1. plain, whose answers' tokens are kept (bench/streams.py);
2. screening: the draft-free candidates by replaying those tokens through each (screen.py, no
   model time), the drafter and MTP candidates by one run each;
3. confirmation: every finalist (the best two, each category's best) three times, paired with
   plain, in alternating order, as many as the budget holds.

Every run sees the same prompts, which are not the bench suite's: `bonsai bench` can then
check a decision on prompts the tuning never saw. Answers are as long as a sample's, else
DEFAULT_MAX_TOKENS. The default budget is BUDGET_RUNS times the first plain run, so it scales
with the model's speed; `--budget` sets it in seconds.
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
from bonsai_launch.decisions.identity import (
    tune_dir,
)
from bonsai_launch.decisions.store import Decision, save
from bonsai_launch.llamacpp import replay as rp
from bonsai_launch.server.client import HTTPX_DEFAULT_TIMEOUT, session
from bonsai_launch.tune import draft_head
from bonsai_launch.tune import screen as tm
from bonsai_launch.tune.decide import decide
from bonsai_launch.tune.rounds import CONFIRM_ROUNDS, Clock, OutOfTime, rounds
from bonsai_launch.tune.subject import TuneRequest, measured_decision, plan_candidates, subject, tuned_model

PROMPTS_FILE = Path(__file__).with_name("prompts.jsonl")
# Default budget, in first-plain-run times. A run of DEFAULT_MAX_TOKENS answers is about twice
# the old 64-token one, and replay screening leaves 3 plain and 2-3 x 3 finalist runs to
# measure (a speculative run is shorter): 8 such runs are the 16 short ones of before on the
# demo model (docs/benchmarks.md, issue 47).
BUDGET_RUNS = 8
# Answer length when the prompts do not say (a sample records each answer's length): at 128
# tokens the candidate the replay ranks first on the bundled prompts and on work outside the
# repository is within 2% of the first on 512-token answers, and ngram-mod (which drafts only
# runs of 48 tokens or more) has room to draft twice (docs/benchmarks.md, issue 47).
DEFAULT_MAX_TOKENS = 128
# A sample's answers, each capped: one 4000-token answer would take the whole budget.
SAMPLE_MAX_TOKENS = 512


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
    clock = Clock(options.budget_s)
    measured: dict[str, int] = defaultdict(int)
    listener.total(len(prompts) * (len(specs) + CONFIRM_ROUNDS * (1 + options.finalists)))
    meta = {c.name: {"spec_type": c.spec_type, "n_max": c.n_max, "label": c.label} for c in subj.candidates}
    screen = tm.Screen({}, tm.replayable(specs), meta) if replay_why is None else None
    whole_head = any(draft_head.is_whole_head(s.flags) for s in others)
    answers: dict[str, rp.Stream] = screen.streams if screen is not None else {}  # plain's tokens
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
                    raise OutOfTime(spec.name)
                requests.run_suite(
                    http, endpoint, spec, bench_options, [prompt], options.temperature, repeat, data, listener
                )
            # the tokens to replay, and to count those past the draft head's cut (tune/draft_head.py)
            if spec.baseline and repeat == 0 and ((screen is not None and screen.args) or whole_head):
                n_ctx = spec.plan.ctx // max(1, options.clients)
                new = data.requests[done_before:]
                answers.update(streams.record(endpoint, prompts, new, bench_options.max_tokens, n_ctx))
        clock.runs.append(time.monotonic() - t0)
        clock.times[spec.name] = clock.runs[-1]
        measured[spec.name] += 1

    budget = f"{options.budget_s:.0f} s" if options.budget_s else f"{BUDGET_RUNS} x the first plain run"
    listener.note(
        f"tuning {subj.model.name}: plain against {', '.join(s.name for s in others)} "
        f"({len(prompts)} prompts, {lengths}, {options.clients} client(s) at once; "
        f"budget {budget})"
    )
    notes: list[str] = []
    try:
        rounds(
            plain,
            others,
            measure,
            clock,
            data,
            skipped,
            notes,
            BUDGET_RUNS,
            options.finalists,
            prompts,
            listener,
            screen,
            request.binary,
            prior,
            answers,
            frozenset(options.configs or ()),
        )
    except OutOfTime as stopped:
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
            # where the MTP layer drafts from the head's first rows: how much of plain's answers lies past them
            "draft_head": draft_head.evidence(answers) if whole_head else None,
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
