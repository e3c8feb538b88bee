"""Measuring one request, one server's counters and one process's memory.

The edge where bench talks HTTP and reads process tables. A request is streamed so the client
sees when the first token arrives (time to first token) and when the last one does (client
decode rate); the server's own `timings` (llama.cpp) and `/metrics` counters (llama.cpp, vLLM,
SGLang) are read alongside. Nothing here decides anything: the numbers go to stats/report.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.server.client import auth_headers, base, parse_metrics, sse_chunks

REQUEST_TIMEOUT = 600.0


@dataclass
class RequestResult:
    """One measured request. Times in seconds, rates in tokens per second."""

    config: str
    prompt_id: str
    category: str
    temperature: float
    repeat: int
    phase: str = "suite"  # suite | multi-turn | concurrency
    text: str = ""
    pieces: list[str] = field(default_factory=list)  # streamed text pieces, about one token each
    ttft_s: float | None = None  # request sent -> first text piece
    wall_s: float | None = None  # request sent -> stream closed
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    client_decode_tps: float | None = None  # (tokens - 1) / (last piece - first piece)
    server_decode_tps: float | None = None  # timings.predicted_per_second (llama.cpp)
    server_prefill_tps: float | None = None  # timings.prompt_per_second
    prompt_n: int | None = None  # prompt tokens the server evaluated (not from cache)
    cache_n: int | None = None  # prompt tokens reused from the server's cache
    predicted_n: int | None = None
    predicted_ms: float | None = None
    prompt_ms: float | None = None
    drafted: int | None = None  # timings.draft_n, or a /metrics delta
    accepted: int | None = None  # timings.draft_n_accepted, or a /metrics delta
    verify_steps: int | None = None  # /metrics spec_decode_num_drafts_total delta
    finish_reason: str | None = None
    turn: int | None = None  # multi-turn: 1-based turn number
    level: int | None = None  # concurrency level
    slots: int | None = None  # concurrency: the server's slots, when known
    error: str | None = None

    def to_json(self, with_text: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data.pop("pieces")
        if not with_text:
            data.pop("text")
        return data


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send requests."""

    base_url: str
    api: str = "chat"  # chat | completion
    model: str | None = None  # the "model" field (vLLM and SGLang want the served name)
    api_key: str | None = None


def _body(
    endpoint: Endpoint,
    messages: list[dict[str, str]] | None,
    text: str | None,
    temperature: float,
    max_tokens: int,
    seed: int | None,
) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": temperature,
        # usage in the last chunk: vLLM and SGLang count tokens only there
        "stream_options": {"include_usage": True},
    }
    if seed is not None:
        body["seed"] = seed
    if endpoint.model:
        body["model"] = endpoint.model
    if endpoint.api == "completion":
        body["prompt"] = text if text is not None else "\n\n".join(m["content"] for m in messages or [])
        return "/v1/completions", body
    body["messages"] = messages if messages is not None else [{"role": "user", "content": text or ""}]
    return "/v1/chat/completions", body


def stream_request(
    http: httpx.Client,
    endpoint: Endpoint,
    result: RequestResult,
    *,
    messages: list[dict[str, str]] | None = None,
    text: str | None = None,
    max_tokens: int = 128,
    seed: int | None = 42,
) -> RequestResult:
    """Send one streamed request and fill `result` with what the client and server saw.

    Network or HTTP failures are recorded in `result.error` (a run keeps going and the report
    counts the failures) rather than raised.
    """
    path, body = _body(endpoint, messages, text, result.temperature, max_tokens, seed)
    url = base(endpoint.base_url) + path
    headers = auth_headers(endpoint.api_key)
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    first = last = None
    sent = time.perf_counter()
    try:
        with http.stream("POST", url, json=body, headers=headers, timeout=REQUEST_TIMEOUT) as r:
            if r.status_code >= 400:
                r.read()
                result.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return result
            for chunk in sse_chunks(r):
                if chunk.get("timings"):
                    timings = chunk["timings"]
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                    delta = choice.get("delta") or {}
                    piece = (
                        choice.get("text")
                        if endpoint.api == "completion"
                        else (delta.get("content") or delta.get("reasoning_content"))
                    )
                    if piece:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        last = now
                        result.pieces.append(piece)
    except httpx.HTTPError as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"
        return result
    done = time.perf_counter()
    result.text = "".join(result.pieces)
    result.wall_s = done - sent
    result.ttft_s = (first - sent) if first is not None else None
    _fill_from_server(result, timings, usage)
    tokens = result.completion_tokens if result.completion_tokens is not None else len(result.pieces)
    if first is not None and last is not None and last > first and tokens > 1:
        result.client_decode_tps = (tokens - 1) / (last - first)
    return result


def _fill_from_server(result: RequestResult, timings: dict[str, Any], usage: dict[str, Any]) -> None:
    if usage:
        result.completion_tokens = _int(usage.get("completion_tokens"))
        result.prompt_tokens = _int(usage.get("prompt_tokens"))
    if not timings:
        return
    result.server_decode_tps = _float(timings.get("predicted_per_second"))
    result.server_prefill_tps = _float(timings.get("prompt_per_second"))
    result.prompt_n = _int(timings.get("prompt_n"))
    result.cache_n = _int(timings.get("cache_n"))
    result.predicted_n = _int(timings.get("predicted_n"))
    result.predicted_ms = _float(timings.get("predicted_ms"))
    result.prompt_ms = _float(timings.get("prompt_ms"))
    # llama.cpp sends draft_n only when something was drafted: absent means 0 drafted.
    result.drafted = _int(timings.get("draft_n")) or 0
    result.accepted = _int(timings.get("draft_n_accepted")) or 0
    if result.completion_tokens is None:
        result.completion_tokens = result.predicted_n


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


# -- /metrics -------------------------------------------------------------------------------

# Counter names per server family: (drafted tokens, accepted tokens, verify steps).
SPEC_COUNTERS = {
    "llamacpp": (
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_drafts_total",
    ),
    "vllm": (
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_drafts_total",
    ),
}
# SGLang exposes acceptance only as gauges averaged by the server over its own window.
SGLANG_GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate")


@dataclass(frozen=True)
class SpecCounters:
    family: str | None  # llamacpp | vllm | sglang | None (no counters exposed)
    drafted: float | None = None
    accepted: float | None = None
    steps: float | None = None
    accept_length_gauge: float | None = None  # SGLang only
    accept_rate_gauge: float | None = None  # SGLang only


def _sum_series(values: dict[str, float], name: str) -> float | None:
    """Sum a metric over its label sets (vLLM labels by model and engine)."""
    found = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
    return sum(found) if found else None


def spec_counters(values: dict[str, float]) -> SpecCounters:
    for family, (drafted, accepted, steps) in SPEC_COUNTERS.items():
        d = _sum_series(values, drafted)
        if d is not None:
            return SpecCounters(family, d, _sum_series(values, accepted), _sum_series(values, steps))
    length = _sum_series(values, SGLANG_GAUGES[0])
    rate = _sum_series(values, SGLANG_GAUGES[1])
    if length is not None or rate is not None:
        return SpecCounters("sglang", accept_length_gauge=length, accept_rate_gauge=rate)
    return SpecCounters(None)


def read_metrics(http: httpx.Client, endpoint: Endpoint) -> dict[str, float]:
    """The server's Prometheus metrics; empty when it exposes none (llama.cpp without --metrics)."""
    headers = auth_headers(endpoint.api_key)
    try:
        r = http.get(base(endpoint.base_url) + "/metrics", headers=headers, timeout=10.0)
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:
        return {}
    return parse_metrics(r.text)


def counter_delta(before: SpecCounters, after: SpecCounters) -> tuple[int | None, int | None, int | None]:
    """(drafted, accepted, verify steps) between two snapshots of the same server."""
    if before.family is None or before.family != after.family or before.family == "sglang":
        return None, None, None

    def diff(a: float | None, b: float | None) -> int | None:
        return round(b - a) if a is not None and b is not None else None

    return diff(before.drafted, after.drafted), diff(before.accepted, after.accepted), diff(before.steps, after.steps)


def served_model(http: httpx.Client, endpoint: Endpoint) -> str | None:
    """The first id from /v1/models (vLLM and SGLang need it in every request)."""
    headers = auth_headers(endpoint.api_key)
    try:
        r = http.get(base(endpoint.base_url) + "/v1/models", headers=headers, timeout=10.0)
        if r.status_code == 401:
            raise ActionFailed(
                f"{endpoint.base_url} refused the request (401 unauthorized)",
                "pass the server's API key with --api-key or BONSAI_API_KEY",
            )
        data = r.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None


# -- memory ---------------------------------------------------------------------------------


class MemorySampler:
    """Samples a process's resident memory (psutil) and, when NVIDIA's library is present,
    its GPU memory, every `interval` seconds in a background thread; keeps the peaks.

    On Linux the kernel's own high-water mark (VmHWM) is read too, so a peak between two
    samples is not missed.
    """

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_rss: int | None = None
        self.peak_gpu: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None

    def __enter__(self) -> MemorySampler:
        self._nvml = _nvml_handles()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        self._sample()
        if self._nvml is not None:
            try:
                self._nvml[0].nvmlShutdown()
            except Exception:
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        rss = _rss(self.pid)
        if rss is not None:
            self.peak_rss = max(self.peak_rss or 0, rss)
        hwm = _vm_hwm(self.pid)
        if hwm is not None:
            self.peak_rss = max(self.peak_rss or 0, hwm)
        if self._nvml is not None:
            gpu = _gpu_bytes(self._nvml, self.pid)
            if gpu is not None:
                self.peak_gpu = max(self.peak_gpu or 0, gpu)


def _rss(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None


def _vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _nvml_handles():
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return (pynvml, handles)
    except Exception:  # no library, no driver, no GPU
        return None


def _gpu_bytes(nvml, pid: int) -> int | None:
    pynvml, handles = nvml
    total = None
    for handle in handles:
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            continue
        for p in procs:
            if p.pid == pid and p.usedGpuMemory is not None:
                total = (total or 0) + int(p.usedGpuMemory)
    return total


def pid_listening_on(port: int) -> int | None:
    """The process listening on a local TCP port, when the OS lets us see it (URL mode)."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except (psutil.Error, OSError):
        return None
    return None
