"""A small synchronous client for llama-server and OpenAI-compatible servers.

Only what bonsai needs: health, props, slots, Prometheus metrics, one native completion
(whose `timings` carry the speculative counters) and a streaming chat. Every call takes an
optional API key (sent as a Bearer token, which llama-server and OpenAI both accept).
Network errors become ActionFailed with the URL, never a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bonsai_launch.core.errors import ActionFailed

if TYPE_CHECKING:
    import httpx

# httpx is imported inside the calls: `bonsai start` imports this module before spawning the
# server, and httpx takes ~0.1 s to import, which would add to the server's time-to-ready.

DEFAULT_TIMEOUT = 10.0
HTTPX_DEFAULT_TIMEOUT = 5.0  # httpx's own default, for clients whose requests set their own
GENERATE_TIMEOUT = 300.0


def first_key(keys: str | None) -> str | None:
    """The key to send when a setting holds several (comma-separated, as llama-server's --api-key)."""
    return keys.split(",")[0].strip() or None if keys else None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The one spelling of a key on the wire: a Bearer token (llama-server, OpenAI and LiteLLM take it)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def session(api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT, **options: Any) -> httpx.Client:
    """Every HTTP client bonsai opens to a server (llama-server, a router, the fleet's proxy) comes
    from here: the key as a Bearer header, and no proxy from the environment (trust_env=False: a
    proxy must never sit between us and a loopback server). `options` go to httpx.Client (limits)."""
    import httpx

    return httpx.Client(headers=auth_headers(api_key), timeout=timeout, trust_env=False, **options)


def _fail(url: str, exc: Exception) -> ActionFailed:
    return ActionFailed(
        f"cannot reach {url}: {exc.__class__.__name__}: {exc}",
        "is the server running? check the URL and port (`bonsai ps`)",
    )


def _get(url: str, api_key: str | None, timeout: float = DEFAULT_TIMEOUT) -> httpx.Response:
    import httpx

    try:
        with session(api_key, timeout) as http:
            return http.get(url)
    except httpx.HTTPError as exc:
        raise _fail(url, exc) from None


def _check(r: httpx.Response) -> httpx.Response:
    if r.status_code == 401:
        raise ActionFailed(
            f"{r.request.url} refused the request (401 unauthorized)",
            "pass the server's API key (--api-key or BONSAI_API_KEY)",
        )
    if r.status_code >= 400:
        raise ActionFailed(f"{r.request.url} answered {r.status_code}: {r.text[:300]}")
    return r


def base(url: str) -> str:
    """Normalise a user's URL: strip a trailing slash and a trailing /v1."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass(frozen=True)
class Health:
    status_code: int
    status: str  # "ok", "loading", "error", or the server's own word

    @property
    def ok(self) -> bool:
        return self.status_code == 200


def health(base_url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Health:
    r = _get(base(base_url) + "/health", api_key, timeout)
    try:
        data = r.json()
        word = data.get("status") or (data.get("error") or {}).get("message") or ""
    except (ValueError, AttributeError):
        word = r.text.strip()[:80]
    if r.status_code == 503:
        word = "loading"
    return Health(r.status_code, str(word) or ("ok" if r.status_code == 200 else "error"))


def props(base_url: str, api_key: str | None = None) -> dict[str, Any] | None:
    """llama-server's /props, or None for servers that have none. (Its speculative type
    always reads `none`: never use it to detect speculation.)"""
    r = _get(base(base_url) + "/props", api_key)
    if r.status_code == 404:
        return None
    return _check(r).json()


def sleeping(base_url: str, api_key: str | None = None, timeout: float = 2.0) -> bool | None:
    """Whether llama-server is asleep (BONSAI_SLEEP_IDLE_SECONDS: model unloaded), from /props'
    `is_sleeping`. /props and /health answer from a cache while asleep and never wake it (/slots
    and every generation do). None: no answer (gone, refused without the key, not llama-server)."""
    try:
        r = _get(base(base_url) + "/props", api_key, timeout)
        if r.status_code != 200:
            return None
        value = r.json().get("is_sleeping")
    except (ActionFailed, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


def models(base_url: str, api_key: str | None = None) -> list[str]:
    """Model ids from the OpenAI-compatible /v1/models."""
    r = _check(_get(base(base_url) + "/v1/models", api_key))
    return [str(m.get("id")) for m in r.json().get("data", [])]


def slots(base_url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> list[dict[str, Any]] | None:
    """Per-slot state (llama-server). None when the server has no /slots (disabled or not llama-server).
    On a sleeping server it wakes it and answers after the reload."""
    r = _get(base(base_url) + "/slots", api_key, timeout)
    if r.status_code in (404, 501):
        return None
    data = _check(r).json()
    return data if isinstance(data, list) else None


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {name or name{labels}: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def metrics(base_url: str, api_key: str | None = None) -> dict[str, float]:
    """Prometheus counters; empty when the server runs without --metrics (501) or has none."""
    r = _get(base(base_url) + "/metrics", api_key)
    if r.status_code in (404, 501):
        return {}
    return parse_metrics(_check(r).text)


def completion(
    base_url: str,
    prompt: str | list[int],
    n_predict: int = 32,
    temperature: float = 0.0,
    api_key: str | None = None,
    timeout: float = GENERATE_TIMEOUT,
    **extra: Any,
) -> dict[str, Any]:
    """llama-server's native /completion; the JSON includes `timings` (draft_n, draft_n_accepted
    when speculation drafted anything)."""
    import httpx

    url = base(base_url) + "/completion"
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, **extra}
    try:
        with session(api_key, timeout) as http:
            r = http.post(url, json=body)
    except httpx.HTTPError as exc:
        raise _fail(url, exc) from None
    return _check(r).json()


def post_json(
    base_url: str, path: str, body: dict[str, Any], api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """POST a JSON body to base_url + path (for example llama-server's /tokenize)."""
    import httpx

    url = base(base_url) + path
    try:
        with session(api_key, timeout) as http:
            r = http.post(url, json=body)
    except httpx.HTTPError as exc:
        raise _fail(url, exc) from None
    return _check(r).json()


def tokenize(base_url: str, text: str, api_key: str | None = None, *, prompt: bool = False) -> list[int]:
    """The model's tokens for `text`. `prompt`: as llama-server reads a prompt (the model's BOS
    added, special tokens such as <start_of_turn> parsed); else as generated text."""
    body = {"content": text, "add_special": prompt, "parse_special": prompt}
    tokens = post_json(base_url, "/tokenize", body, api_key).get("tokens") or []
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]


def chat_completion(
    base_url: str,
    messages: list[dict[str, str]],
    max_tokens: int = 32,
    temperature: float = 0.0,
    api_key: str | None = None,
    model: str | None = None,
    timeout: float = GENERATE_TIMEOUT,
    **extra: Any,
) -> dict[str, Any]:
    """OpenAI-compatible /v1/chat/completions, not streamed (works on any such server)."""
    import httpx

    url = base(base_url) + "/v1/chat/completions"
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, **extra}
    if model:
        body["model"] = model
    try:
        with session(api_key, timeout) as http:
            r = http.post(url, json=body)
    except httpx.HTTPError as exc:
        raise _fail(url, exc) from None
    return _check(r).json()


@dataclass
class StreamResult:
    """What a finished stream leaves behind: the text and llama-server's timings if sent."""

    text: str = ""
    reasoning: str = ""  # thinking models stream their reasoning separately
    timings: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None


def sse_chunks(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of an OpenAI-style server-sent event stream, up to `data: [DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            yield json.loads(payload)
        except ValueError:
            continue


def stream_chat(
    base_url: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    api_key: str | None = None,
    model: str | None = None,
    result: StreamResult | None = None,
    timeout: float = GENERATE_TIMEOUT,
    on_reasoning: Callable[[str], None] | None = None,
    **extra: Any,
) -> Iterator[str]:
    """Yield text pieces of a streamed chat answer. Pass a StreamResult to collect the full
    text and the `timings` llama-server attaches to the final chunk; reasoning pieces (thinking
    models) go to `on_reasoning` and result.reasoning, not into the answer."""
    import httpx

    url = base(base_url) + "/v1/chat/completions"
    body: dict[str, Any] = {"messages": messages, "stream": True, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if model:
        body["model"] = model
    result = result if result is not None else StreamResult()
    try:
        with session(api_key, timeout) as http, http.stream("POST", url, json=body) as r:
            if r.status_code >= 400:
                r.read()
                _check(r)
            for chunk in sse_chunks(r):
                if chunk.get("timings"):
                    result.timings = chunk["timings"]
                if chunk.get("usage"):
                    result.usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                    delta = choice.get("delta") or {}
                    thought = delta.get("reasoning_content")
                    if thought:
                        result.reasoning += thought
                        if on_reasoning is not None:
                            on_reasoning(thought)
                    piece = delta.get("content")
                    if piece:
                        result.text += piece
                        yield piece
    except httpx.HTTPError as exc:
        raise _fail(url, exc) from None


def serves_page(base_url: str, api_key: str | None = None) -> bool:
    """Whether the server serves a chat page at /: the headers say so; its body (the whole app,
    megabytes) is never read."""
    import httpx

    try:
        with session(api_key, 2.0) as http, http.stream("GET", base(base_url) + "/") as r:
            return r.status_code == 200 and "html" in r.headers.get("content-type", "")
    except httpx.HTTPError:
        return False


def acceptance(timings: dict[str, Any]) -> tuple[int, int, float | None]:
    """(drafted, accepted, rate) from a completion's timings; rate None when nothing was drafted."""
    drafted = int(timings.get("draft_n") or 0)
    accepted = int(timings.get("draft_n_accepted") or 0)
    return drafted, accepted, (accepted / drafted if drafted else None)
