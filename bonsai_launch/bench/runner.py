"""Running a benchmark: which servers, in which order, with which requests.

Launch mode starts one llama-server per configuration itself, one after the other (never two
at once: on a small machine they would steal each other's cores), from plans that differ only
in their speculative settings. Every server lives for one (repeat, configuration,
temperature) group, or for one round of trade-off measurements, because llama.cpp keeps
n-gram and prompt caches for its whole life: a fresh server per group means no prompt is
ever seen twice by the same server. Each server first answers one discarded warm-up request.
The order of configurations alternates between repeats (A B, B A, A B...), so slow drift of
the machine does not favour one side.

URL mode measures servers someone else started (llama.cpp, vLLM, SGLang). It cannot restart
them, so every repeat prefixes the prompts with its own run tag: the prompt cache cannot reuse
an earlier repeat's prompt (draft caches that learn across requests may still carry over;
the report says so).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import httpx

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.measure import (
    Endpoint,
    MemorySampler,
    RequestResult,
    counter_delta,
    pid_listening_on,
    read_metrics,
    served_model,
    spec_counters,
    stream_request,
)
from bonsai_launch.core.errors import ActionFailed, BonsaiError

SPECIAL_CONFIGS = ("plain", "speculative", "auto")  # auto: the stored tuning decision (bonsai tune)
SPEC_CONFIG_TYPES = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-dspark",
    "draft-dflash",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
)
READY_TIMEOUT = 600.0


@dataclass(frozen=True)
class BenchOptions:
    configs: tuple[str, ...] = ("plain", "speculative")
    categories: tuple[str, ...] | None = None
    temps: tuple[float, ...] = (0.0, 0.7)
    repeats: int = 3
    max_tokens: int = 128
    concurrency: tuple[int, ...] = (1, 4)
    parallel: tuple[int, ...] | None = None  # slot counts: each config's concurrency rounds run once per count
    per_category: int | None = None  # prompts per category (None: all)
    turns: int = 4  # multi-turn conversation length
    interleave: bool = False  # multi-turn: turn 1 of every conversation, then turn 2 of every one... (prompt cache)
    conversations: int | None = None  # how many bundled conversations (None: all)
    tradeoff_tokens: int = 48  # max tokens per multi-turn / concurrency request
    api: str = "chat"  # chat | completion
    seed: int = 42
    quick: bool = False
    tradeoffs: bool = True
    prompts_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


QUICK = dict(per_category=2, temps=(0.0,), max_tokens=96, concurrency=(1, 2), conversations=1, tradeoff_tokens=32)


@dataclass
class ConfigSpec:
    """One configuration under test."""

    name: str
    baseline: bool = False
    spec_type: str | None = None  # what the server speculates with (None: nothing)
    flags: dict[str, Any] = field(default_factory=dict)  # launch mode: settings flags
    url: str | None = None  # URL mode
    plan: Any = None  # launch mode: the LaunchPlan (port replaced per server)
    slot_plans: dict[int, Any] = field(default_factory=dict)  # --parallel: a LaunchPlan per slot count

    @property
    def label(self) -> str:
        if self.name in ("speculative", "auto") and (self.spec_type or self.name == "auto"):
            return f"{self.name} ({self.spec_type or 'plain'})"
        return self.name

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "label": self.label,
            "baseline": self.baseline,
            "spec_type": self.spec_type,
        }
        if self.url:
            data["url"] = self.url
        if self.plan is not None:
            argv = list(self.plan.argv)
            for i, arg in enumerate(argv[:-1]):
                if arg == "--port":
                    argv[i + 1] = "<free port>"  # every server gets its own
            data["argv"] = argv
            data["ctx"] = self.plan.ctx
            data["speculative"] = self.plan.to_json()["speculative"]
            data["slots"] = _effective_slots(self.plan)
        if self.slot_plans:
            data["slot_argv"] = {str(n): _argv_without_port(p) for n, p in sorted(self.slot_plans.items())}
        return data

    def plan_for_slots(self, slots: int | None) -> Any:
        return self.slot_plans.get(slots, self.plan) if slots is not None else self.plan


def _argv_without_port(plan) -> list[str]:
    argv = list(plan.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--port":
            argv[i + 1] = "<free port>"
    return argv


def _effective_slots(plan) -> int | None:
    slots = getattr(plan, "slots", None)
    if slots is None:
        return None
    return slots.count or 4  # llama-server's auto


@dataclass
class ServerRun:
    """One server lifetime (launch mode) or one pass over a server (URL mode)."""

    config: str
    repeat: int
    purpose: str  # "temp=0.0", "trade-offs"
    slots: int | None = None  # the server's slots, when known
    pid: int | None = None
    startup_s: float | None = None  # spawn -> /health 200 (launch mode)
    peak_rss_bytes: int | None = None
    peak_gpu_bytes: int | None = None
    log: str | None = None
    spec_proof: dict[str, Any] | None = None  # launch mode: the liveness probe of a speculative server

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LoadRun:
    """One concurrency level on one server: `level` clients at once."""

    config: str
    repeat: int
    level: int
    requests: int
    tokens: int
    wall_s: float
    errors: int
    slots: int | None = None  # the server's slots (None: unknown, URL mode)

    @property
    def throughput(self) -> float | None:
        return self.tokens / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["throughput_tps"] = self.throughput
        return data


@dataclass
class BenchData:
    mode: str  # launch | url
    options: BenchOptions
    configs: list[ConfigSpec]
    prompts: list[suite.Prompt]
    requests: list[RequestResult] = field(default_factory=list)
    servers: list[ServerRun] = field(default_factory=list)
    loads: list[LoadRun] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def baseline(self) -> ConfigSpec | None:
        return next((c for c in self.configs if c.baseline), None)


class Listener(Protocol):
    """Progress callbacks; the CLI draws a progress bar, tests pass nothing."""

    def total(self, n: int) -> None: ...

    def step(self, text: str) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def note(self, text: str) -> None: ...


class SilentListener:
    """The listener when nobody listens."""

    def total(self, n: int) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def note(self, text: str) -> None:
        pass


# -- planning ---------------------------------------------------------------------------------


def parse_config_names(text: str | Sequence[str]) -> tuple[str, ...]:
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if not names:
        raise BonsaiError("--configs is empty", "for example --configs plain,speculative,ngram-map-k")
    for name in names:
        if name not in SPECIAL_CONFIGS and name not in SPEC_CONFIG_TYPES:
            raise BonsaiError(
                f"--configs: {name!r} is not a known configuration",
                "use plain, speculative or a speculative type: " + ", ".join(SPEC_CONFIG_TYPES),
            )
    if len(set(names)) != len(names):
        raise BonsaiError("--configs names a configuration twice", "list each once")
    if len(names) < 2 and names[0] != "plain":
        names.insert(0, "plain")  # a speculative run means nothing without its baseline
    return tuple(names)


def config_flags(name: str, base_flags: dict[str, Any]) -> dict[str, Any]:
    """The settings flags of one configuration: the user's flags with only the speculative
    settings replaced."""
    flags = dict(base_flags)
    if name == "plain":
        flags.update(speculative=False, spec_type=None, spec_nmax=None)
    elif name == "speculative":
        flags.update(speculative=True)
    elif name == "auto":
        flags.update(speculative="auto", spec_type=None, spec_nmax=None)
    else:
        flags.update(speculative=True, spec_type=name)
    return flags


def plan_configs(
    names: Sequence[str],
    base_flags: dict[str, Any],
    model: str | None,
    drafter: str | None,
    passthrough: tuple[str, ...],
    binary: Path,
    parallel: Sequence[int] | None = None,
) -> list[ConfigSpec]:
    """A LaunchPlan per configuration (and, with `parallel`, per slot count), with one context
    size for all of them: the largest any of them asks for, so the KV cache (and its memory) is
    the same on every side."""
    from bonsai_launch.server.inputs import gather_plan

    def build(ctx: int | None) -> list[ConfigSpec]:
        specs = []
        for name in names:
            flags = config_flags(name, base_flags)
            flags["port"] = 8080  # replaced by a free port for every server
            if ctx is not None:
                flags["ctx"] = ctx
            plan = gather_plan(flags, model, drafter, passthrough, binary)
            spec_type = plan.speculative.spec_type if plan.speculative else None
            slot_plans = {
                n: gather_plan({**flags, "parallel": n}, model, drafter, passthrough, binary) for n in parallel or ()
            }
            specs.append(ConfigSpec(name, name == "plain", spec_type, flags, plan=plan, slot_plans=slot_plans))
        return specs

    specs = build(base_flags.get("ctx") or None)
    ctxs = {p.ctx for s in specs for p in (s.plan, *s.slot_plans.values())}
    if len(ctxs) > 1:
        specs = build(max(ctxs))
    if not any(s.baseline for s in specs):
        specs[0].baseline = True
    for s in specs:
        if s.name == "auto":
            tuning = s.plan.tuning or {}
            if tuning.get("status") != "found":
                raise BonsaiError(
                    "configuration auto has no tuning decision to run: "
                    + tuning.get("message", "").removeprefix("BONSAI_SPECULATIVE=auto: "),
                    f"run `{tuning.get('hint', 'bonsai tune')}` first",
                )
            continue
        if s.name != "plain" and s.spec_type is None:
            raise BonsaiError(
                f"configuration {s.name} would run without speculation", "check the profile and --drafter"
            )
    return specs


def _with_port(plan, port: int):
    argv = list(plan.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--port":
            argv[i + 1] = str(port)
    return dataclasses.replace(plan, argv=tuple(argv), port=port)


# -- one server -------------------------------------------------------------------------------


@contextmanager
def launched(
    spec: ConfigSpec, run: ServerRun, log_dir: Path, listener: Listener, api: str = "chat"
) -> Iterator[Endpoint]:
    """Start the configuration's server (for `run.slots` slots when --parallel planned them) on
    a free port, wait until ready, sample its memory, and always stop it."""
    from bonsai_launch.server.process import ServerProcess, free_port

    base_plan = spec.plan_for_slots(run.slots)
    if run.slots is None:
        run.slots = _effective_slots(base_plan)
    attempts = 2  # a free port can be taken by someone else between our check and the bind
    for attempt in range(attempts):
        plan = _with_port(base_plan, free_port())
        slots_tag = f"-np{run.slots}" if spec.slot_plans else ""
        log = log_dir / f"{spec.name}-r{run.repeat + 1}-{run.purpose.replace('=', '')}{slots_tag}.log"
        listener.step(f"{spec.label}: starting llama-server ({run.purpose}, repeat {run.repeat + 1})")
        t0 = time.perf_counter()
        proc = ServerProcess.spawn(plan.argv, env=plan.env, log_path=log, base_url=plan.base_url)
        try:
            proc.wait_ready(READY_TIMEOUT)
        except ActionFailed as exc:
            proc.stop()
            bind_failed = any("couldn't bind" in line for line in proc.log_tail(20))
            if bind_failed and attempt + 1 < attempts:
                continue
            if proc.returncode == -signal.SIGILL:
                # Seen with an unpatched b11434 built by GCC 12 on an AMX CPU: the AMX kernels of
                # the repacked weights crash on the first matrix multiply (bonsai build patches it).
                raise ActionFailed(
                    exc.message,
                    "llama-server hit an illegal CPU instruction; rebuild with "
                    "`bonsai build --force`, or skip weight repacking with "
                    f"`bonsai bench ... -- --no-repack`; full log: {log}",
                ) from None
            raise
        run.startup_s = time.perf_counter() - t0
        run.pid, run.log = proc.pid, str(log)
        if plan.speculative is not None:
            _prove_live(spec, run, plan, proc, log, listener)
        try:
            with MemorySampler(proc.pid) as sampler:
                yield Endpoint(plan.base_url, api=api, api_key=plan.api_key)  # a key the user set is enforced
        finally:
            run.peak_rss_bytes, run.peak_gpu_bytes = sampler.peak_rss, sampler.peak_gpu
            if not proc.alive():
                proc.stop()
                raise ActionFailed(proc.exit_message("during the benchmark"), f"full log: {log}")
            proc.stop()
        return


def _prove_live(spec: ConfigSpec, run: ServerRun, plan, proc, log: Path, listener: Listener) -> None:
    """The rule `bonsai start` applies (live only when the probe drafted tokens): measuring a
    speculative configuration that does not speculate would report plain speed as its own."""
    from bonsai_launch.server import liveness as speculation_probe

    listener.step(f"{spec.label}: checking speculative decoding")
    try:
        proof = speculation_probe.prove(
            plan.base_url, plan.speculative.spec_type, plan.speculative.n_max, log, plan.env.get("LLAMA_API_KEY")
        )
    except BaseException:
        proc.stop()
        raise
    run.spec_proof = proof.to_json()
    if not proof.live:
        proc.stop()
        raise ActionFailed(
            f"{spec.label}: {proof.summary()}",
            f"fix the drafter or its settings, or leave this configuration out of --configs; full log: {log}",
        )


@contextmanager
def attached(spec: ConfigSpec, run: ServerRun, api: str, api_key: str | None) -> Iterator[Endpoint]:
    """URL mode: measure a running server; its memory only when it listens on this machine
    and the OS lets us see the process."""
    assert spec.url is not None
    parsed = urlparse(spec.url)
    pid = None
    if parsed.hostname in ("127.0.0.1", "localhost", "::1") and parsed.port:
        pid = pid_listening_on(parsed.port)
    run.pid = pid
    with httpx.Client(trust_env=False) as http:
        model = served_model(http, Endpoint(spec.url, api_key=api_key))
    endpoint = Endpoint(spec.url, api=api, model=model, api_key=api_key)
    if pid is None:
        yield endpoint
        return
    with MemorySampler(pid) as sampler:
        try:
            yield endpoint
        finally:
            run.peak_rss_bytes, run.peak_gpu_bytes = sampler.peak_rss, sampler.peak_gpu


# -- requests ---------------------------------------------------------------------------------


def _salted(messages: list[dict[str, str]], salt: str) -> list[dict[str, str]]:
    if not salt:
        return messages
    out = [dict(m) for m in messages]
    for m in out:
        if m["role"] == "user":
            m["content"] = f"{salt} {m['content']}"
            break
    return out


def _send(
    http: httpx.Client,
    endpoint: Endpoint,
    result: RequestResult,
    messages: list[dict[str, str]],
    max_tokens: int,
    seed: int,
) -> RequestResult:
    text = None
    if endpoint.api == "completion":
        text = suite.Prompt(
            result.prompt_id, result.category, tuple((m["role"], m["content"]) for m in messages)
        ).completion_text()
    return stream_request(http, endpoint, result, messages=messages, text=text, max_tokens=max_tokens, seed=seed)


def warm_up(http: httpx.Client, endpoint: Endpoint, spec: ConfigSpec, options: BenchOptions) -> None:
    """One request whose numbers are thrown away: the first request pays for lazy
    allocations and cold caches that no later request sees."""
    w = suite.warmup_prompt()
    result = _send(
        http,
        endpoint,
        RequestResult(spec.name, w.id, w.category, 0.0, -1, phase="warm-up"),
        w.chat_messages(),
        16,
        options.seed,
    )
    if result.error:
        raise ActionFailed(
            f"the warm-up request to {spec.label} at {endpoint.base_url} failed: {result.error}",
            "check that the server answers /v1/chat/completions (or pass --api completion)",
        )


def run_suite(
    http: httpx.Client,
    endpoint: Endpoint,
    spec: ConfigSpec,
    options: BenchOptions,
    prompts: list[suite.Prompt],
    temperature: float,
    repeat: int,
    data: BenchData,
    listener: Listener,
    salt: str = "",
) -> None:
    """The measured prompts, one at a time, reading the speculative counters around each."""
    before = spec_counters(read_metrics(http, endpoint))
    for prompt in prompts:
        listener.step(f"{spec.label}: {prompt.category} {prompt.id} (T={temperature:g}, repeat {repeat + 1})")
        result = RequestResult(spec.name, prompt.id, prompt.category, temperature, repeat)
        _send(http, endpoint, result, _salted(prompt.chat_messages(), salt), options.max_tokens, options.seed)
        after = spec_counters(read_metrics(http, endpoint))
        drafted, accepted, steps = counter_delta(before, after)
        if result.drafted is None and drafted is not None:  # servers without timings (vLLM)
            result.drafted, result.accepted = drafted, accepted
        result.verify_steps = steps
        before = after
        data.requests.append(result)
        listener.advance()


def run_multi_turn(
    http: httpx.Client,
    endpoint: Endpoint,
    spec: ConfigSpec,
    options: BenchOptions,
    conversations: list[suite.Conversation],
    repeat: int,
    data: BenchData,
    listener: Listener,
    salt: str = "",
) -> None:
    """A conversation turn by turn, each turn carrying the earlier answers: turn 2+ shows
    whether the server reuses the cached prefix (time to first token stays low) or
    re-evaluates it.

    Interleaved (--interleave-conversations), every conversation's turn 1 comes before any
    turn 2, as with several users taking turns: with fewer slots than conversations, a
    conversation finds its slot taken by another one, and only the prompt cache in RAM
    (--cache-ram, --cache-idle-slots) or context checkpoints can spare it the re-read."""
    histories: dict[str, list[dict[str, str]]] = {conv.id: [] for conv in conversations}
    steps = [(conv, turn, text) for conv in conversations for turn, text in enumerate(conv.turns[: options.turns], 1)]
    if options.interleave:
        steps.sort(key=lambda step: step[1])  # stable: conversations keep their order within a turn
    for conv, turn, user_text in steps:
        history = histories[conv.id]
        listener.step(f"{spec.label}: conversation {conv.id} turn {turn} (repeat {repeat + 1})")
        history.append({"role": "user", "content": user_text})
        result = RequestResult(spec.name, conv.id, "multi-turn", 0.0, repeat, phase="multi-turn", turn=turn)
        _send(http, endpoint, result, _salted(history, salt), options.tradeoff_tokens, options.seed)
        history.append({"role": "assistant", "content": result.text})
        data.requests.append(result)
        listener.advance()


def run_concurrency(
    endpoint: Endpoint,
    spec: ConfigSpec,
    options: BenchOptions,
    load_prompts: list[suite.Prompt],
    repeat: int,
    data: BenchData,
    listener: Listener,
    salt: str = "",
    slots: int | None = None,
) -> None:
    """For each level c: 2c requests through c clients at once; total generated tokens over
    wall time is the throughput a shared server gives. A server with fewer slots than clients
    queues the rest."""
    cursor = 0
    for level in options.concurrency:
        batch = []
        for _ in range(2 * level):
            batch.append(load_prompts[cursor % len(load_prompts)])
            cursor += 1
        on = f", {slots} slots" if slots else ""
        listener.step(f"{spec.label}: {level} concurrent client(s){on} (repeat {repeat + 1})")
        results = [
            RequestResult(spec.name, p.id, p.category, 0.0, repeat, phase="concurrency", level=level, slots=slots)
            for p in batch
        ]
        limits = httpx.Limits(max_connections=level + 2, max_keepalive_connections=level + 2)
        with httpx.Client(trust_env=False, limits=limits) as http:
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=level) as pool:
                futures = [
                    pool.submit(
                        _send,
                        http,
                        endpoint,
                        r,
                        _salted(p.chat_messages(), salt),
                        options.tradeoff_tokens,
                        options.seed,
                    )
                    for r, p in zip(results, batch, strict=True)
                ]
                for f in futures:
                    f.result()
            wall = time.perf_counter() - start
        tokens = sum((r.completion_tokens or len(r.pieces)) for r in results if not r.error)
        data.loads.append(
            LoadRun(spec.name, repeat, level, len(results), tokens, wall, sum(1 for r in results if r.error), slots)
        )
        data.requests.extend(results)
        listener.advance(len(results))


# -- the two modes -----------------------------------------------------------------------------


def _order(configs: list[ConfigSpec], repeat: int) -> list[ConfigSpec]:
    return list(configs) if repeat % 2 == 0 else list(reversed(configs))


def _request_count(options: BenchOptions, n_prompts: int, n_configs: int, n_conversations: int, mode: str) -> int:
    per_repeat = n_prompts * len(options.temps)
    if options.tradeoffs:
        per_repeat += n_conversations * options.turns + sum(2 * c for c in options.concurrency) * len(
            options.parallel or (1,)
        )
    return per_repeat * n_configs * options.repeats


def _conversations(options: BenchOptions) -> list[suite.Conversation]:
    convs = suite.load_conversations()
    return convs[: options.conversations] if options.conversations else convs


def _load_prompts(all_prompts: list[suite.Prompt], measured: list[suite.Prompt]) -> list[suite.Prompt]:
    """Prompts for the concurrency rounds: the suite's prompts interleaved across categories,
    so every level mixes kinds of work."""
    by_cat: dict[str, list[suite.Prompt]] = {}
    for p in all_prompts:
        by_cat.setdefault(p.category, []).append(p)
    out = []
    for i in range(max(len(v) for v in by_cat.values())):
        for cat in by_cat:
            if i < len(by_cat[cat]):
                out.append(by_cat[cat][i])
    return out


def run_launch(
    options: BenchOptions,
    configs: list[ConfigSpec],
    prompts: list[suite.Prompt],
    all_prompts: list[suite.Prompt],
    log_dir: Path,
    listener: Listener | None = None,
) -> BenchData:
    listener = listener or SilentListener()
    data = BenchData("launch", options, configs, prompts)
    data.environment = environment(configs[0].plan.binary if configs and configs[0].plan else None)
    conversations = _conversations(options)
    load = _load_prompts(all_prompts, prompts)
    listener.total(_request_count(options, len(prompts), len(configs), len(conversations), "launch"))
    for repeat in range(options.repeats):
        for spec in _order(configs, repeat):
            temps = options.temps if repeat % 2 == 0 else tuple(reversed(options.temps))
            for temperature in temps:
                run = ServerRun(spec.name, repeat, f"temp={temperature:g}")
                data.servers.append(run)
                with (
                    launched(spec, run, log_dir, listener, options.api) as endpoint,
                    httpx.Client(trust_env=False) as http,
                ):
                    warm_up(http, endpoint, spec, options)
                    run_suite(http, endpoint, spec, options, prompts, temperature, repeat, data, listener)
            if options.tradeoffs:
                # One server per slot count (--parallel), the multi-turn conversation on the first.
                slot_counts: tuple[int | None, ...] = options.parallel or (None,)
                if repeat % 2:
                    slot_counts = tuple(reversed(slot_counts))
                for slots in slot_counts:
                    run = ServerRun(spec.name, repeat, "trade-offs", slots=slots)
                    data.servers.append(run)
                    with (
                        launched(spec, run, log_dir, listener, options.api) as endpoint,
                        httpx.Client(trust_env=False) as http,
                    ):
                        warm_up(http, endpoint, spec, options)
                        if slots == (options.parallel or (None,))[0]:
                            run_multi_turn(http, endpoint, spec, options, conversations, repeat, data, listener)
                        run_concurrency(endpoint, spec, options, load, repeat, data, listener, slots=run.slots)
    data.finished = time.time()
    data.environment["load_average_end"] = _loadavg()
    return data


def run_urls(
    options: BenchOptions,
    url: str,
    baseline_url: str | None,
    prompts: list[suite.Prompt],
    all_prompts: list[suite.Prompt],
    api_key: str | None = None,
    listener: Listener | None = None,
) -> BenchData:
    listener = listener or SilentListener()
    configs = []
    if baseline_url:
        configs.append(ConfigSpec("baseline", True, None, url=baseline_url))
    configs.append(ConfigSpec("server", not baseline_url, None, url=url))
    data = BenchData("url", options, configs, prompts)
    data.environment = environment(None)
    data.notes.append(
        "URL mode: the servers were not restarted between repeats; each repeat tags its prompts so "
        "the prompt cache cannot reuse an earlier repeat, but draft caches that learn across "
        "requests (llama.cpp ngram-mod/ngram-cache) may still carry over"
    )
    conversations = _conversations(options)
    load = _load_prompts(all_prompts, prompts)
    listener.total(_request_count(options, len(prompts), len(configs), len(conversations), "url"))
    warmed: set[str] = set()
    for repeat in range(options.repeats):
        salt = f"[run {repeat + 1}]"
        for spec in _order(configs, repeat):
            run = ServerRun(spec.name, repeat, "all")
            data.servers.append(run)
            with attached(spec, run, options.api, api_key) as endpoint, httpx.Client(trust_env=False) as http:
                if spec.name not in warmed:
                    warm_up(http, endpoint, spec, options)
                    warmed.add(spec.name)
                for temperature in options.temps:
                    run_suite(http, endpoint, spec, options, prompts, temperature, repeat, data, listener, salt)
                if options.tradeoffs:
                    run_multi_turn(http, endpoint, spec, options, conversations, repeat, data, listener, salt)
                    run_concurrency(endpoint, spec, options, load, repeat, data, listener, salt)
    note = not_drafting_note(data.requests, "server")
    if note:
        data.notes.append(note)
    data.finished = time.time()
    data.environment["load_average_end"] = _loadavg()
    return data


def not_drafting_note(requests: list[RequestResult], config: str) -> str | None:
    """URL mode cannot probe a server it did not start; the measured requests are judged by
    the rule of `bonsai start`/`verify` instead: live only when tokens were drafted."""
    counted = [r for r in requests if r.config == config and r.drafted is not None and not r.error]
    if counted and sum(r.drafted or 0 for r in counted) == 0:
        return (
            f"{config} drafted no tokens in any of its {len(counted)} requests: speculative decoding is NOT live "
            "there, so its numbers are those of plain decoding"
        )
    return None


# -- environment --------------------------------------------------------------------------------


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def environment(binary: str | None) -> dict[str, Any]:
    """What the numbers were measured on, so a reader can compare like with like."""
    from bonsai_launch import __version__
    from bonsai_launch.core import hardware

    hw = hardware.detect()
    env: dict[str, Any] = {
        "bonsai_version": __version__,
        "python": platform.python_version(),
        "hardware": hw.to_json(),
        "load_average_start": _loadavg(),
    }
    if binary:
        from bonsai_launch.llamacpp.binaries import probe

        try:
            caps = probe(Path(binary))
            env["llama_server"] = {
                "binary": binary,
                "version": caps.version,
                "build": caps.build_number,
                "backend": caps.backend,
            }
        except BonsaiError:
            env["llama_server"] = {"binary": binary}
    extra = {k: v for k, v in os.environ.items() if k.startswith("LLAMA_ARG_")}
    if extra:
        env["llama_arg_env"] = extra  # llama-server reads these: they change what ran
    return env
