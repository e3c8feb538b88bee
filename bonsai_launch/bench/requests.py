"""The requests a bench run sends to one server: the warm-up, the prompt suite, multi-turn
conversations and concurrency rounds (each prompt salted so no cache carries over)."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.data import (
    BenchData,
    BenchOptions,
    ConfigSpec,
    Listener,
    LoadRun,
)
from bonsai_launch.bench.measure import (
    Endpoint,
    RequestResult,
    counter_delta,
    read_metrics,
    spec_counters,
    stream_request,
)
from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.server.client import HTTPX_DEFAULT_TIMEOUT, session


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
    raw: bool = False,
) -> RequestResult:
    """`raw`: the one message is a prompt the model's template already made (a sample of what a
    server was sent, server/prompt_sample.py): sent to /v1/completions as it is, whatever the API."""
    text = None
    if raw:
        endpoint = dataclasses.replace(endpoint, api="completion")
        text = messages[0]["content"]
    elif endpoint.api == "completion":
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
        length = prompt.max_tokens or options.max_tokens
        _send(http, endpoint, result, _salted(prompt.chat_messages(), salt), length, options.seed, prompt.raw)
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
        with session(None, HTTPX_DEFAULT_TIMEOUT, limits=limits) as http:
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
                        p.raw,
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


def run_clients(
    endpoint: Endpoint,
    spec: ConfigSpec,
    options: BenchOptions,
    prompts: list[suite.Prompt],
    temperature: float,
    repeat: int,
    data: BenchData,
    listener: Listener,
    clients: int,
) -> None:
    """The measured prompts sent by `clients` clients at once (`bonsai tune --parallel N`):
    each request's own server timings, taken while the others run, so a configuration's
    pooled decode speed is what each of N users sees. Counted as suite requests: the decision
    rule pools them as it pools one client's."""
    listener.step(f"{spec.label}: {len(prompts)} prompts by {clients} clients at once (repeat {repeat + 1})")
    results = [RequestResult(spec.name, p.id, p.category, temperature, repeat) for p in prompts]
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    with session(None, HTTPX_DEFAULT_TIMEOUT, limits=limits) as http, ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [
            pool.submit(
                _send, http, endpoint, r, p.chat_messages(), p.max_tokens or options.max_tokens, options.seed, p.raw
            )
            for r, p in zip(results, prompts, strict=True)
        ]
        for f in futures:
            f.result()
    data.requests.extend(results)
    listener.advance(len(results))
