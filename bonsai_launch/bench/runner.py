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

import time
from pathlib import Path

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.data import (
    BenchData,
    BenchOptions,
    ConfigSpec,
    Listener,
    ServerRun,
    SilentListener,
    environment,
    loadavg,
    not_drafting_note,
)
from bonsai_launch.bench.requests import run_concurrency, run_multi_turn, run_suite, warm_up
from bonsai_launch.bench.servers import attached, launched
from bonsai_launch.server.client import HTTPX_DEFAULT_TIMEOUT, session

# -- planning ---------------------------------------------------------------------------------


# -- one server -------------------------------------------------------------------------------


# -- requests ---------------------------------------------------------------------------------


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
                    session(None, HTTPX_DEFAULT_TIMEOUT) as http,
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
                        session(None, HTTPX_DEFAULT_TIMEOUT) as http,
                    ):
                        warm_up(http, endpoint, spec, options)
                        if slots == (options.parallel or (None,))[0]:
                            run_multi_turn(http, endpoint, spec, options, conversations, repeat, data, listener)
                        run_concurrency(endpoint, spec, options, load, repeat, data, listener, slots=run.slots)
    data.finished = time.time()
    data.environment["load_average_end"] = loadavg()
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
            with attached(spec, run, options.api, api_key) as endpoint, session(None, HTTPX_DEFAULT_TIMEOUT) as http:
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
    data.environment["load_average_end"] = loadavg()
    return data


# -- environment --------------------------------------------------------------------------------
