"""Whether speculation still pays on the work a running server gets, from its own counters.

The process that restarts a speculative server (the keeper of `start --detach`, a foreground
`start`) runs `Watch` in a thread. Every BONSAI_WATCH_SECONDS it asks /props whether the
server sleeps (BONSAI_SLEEP_IDLE_SECONDS): a sleeping server is left alone, since /slots and
generation wake it; /metrics is read only while it is awake, and /slots never. From the
cumulative counters (drafted and accepted tokens, tokens predicted and the seconds spent
predicting them, requests processing) it cuts windows of BONSAI_WATCH_WINDOW_TOKENS drafted
tokens. A window is below plain when its acceptance is under BONSAI_WATCH_MIN_ACCEPT_PERCENT
or, when the launch runs a tuning decision, its decode speed is under the plain speed that
decision measured. BONSAI_WATCH_WINDOWS consecutive windows below plain make the verdict
"below plain": `bonsai ps` says so, and an auto decision is marked stale (decisions/store.py)
so that the next `bonsai start` tunes again. The watch never restarts a server.

Cost: one /props and one /metrics request per period (milliseconds; the server answers them
from its HTTP thread). `verdict` is pure; `read_sample` and `Watch` are the edges.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
PREDICTED = "llamacpp:tokens_predicted_total"
PREDICTED_S = "llamacpp:tokens_predicted_seconds_total"
BUSY = "llamacpp:requests_processing"


@dataclass(frozen=True)
class Bounds:
    every_s: float = 30.0  # 0: off
    window_tokens: int = 512
    windows: int = 3
    min_accept: float = 0.20
    plain_tps: float | None = None  # the plain decode speed a tuning decision measured

    @classmethod
    def from_settings(cls, settings: Any, plain_tps: float | None = None) -> Bounds:
        def get(key: str, default: Any) -> Any:
            value = settings.get(key)
            return default if value is None else value

        return cls(
            float(get("watch_seconds", 30)),
            int(get("watch_window_tokens", 512)),
            int(get("watch_windows", 3)),
            int(get("watch_min_accept_percent", 20)) / 100.0,
            plain_tps,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "every_s": self.every_s,
            "window_tokens": self.window_tokens,
            "windows": self.windows,
            "min_accept": self.min_accept,
            "plain_tps": self.plain_tps,
        }


@dataclass(frozen=True)
class Sample:
    """The server's cumulative counters at one moment."""

    drafted: int
    accepted: int
    predicted: int = 0
    predicted_s: float = 0.0
    busy: int = 0


def windows(samples: list[Sample], window_tokens: int) -> list[dict[str, Any]]:
    """Closed windows (each at least `window_tokens` drafted tokens), oldest first. A counter
    that went down (the server restarted) starts over from that sample."""
    out: list[dict[str, Any]] = []
    start: Sample | None = None
    for s in samples:
        if start is None or s.drafted < start.drafted or s.predicted < start.predicted:
            start = s
            continue
        drafted = s.drafted - start.drafted
        if drafted >= window_tokens:
            seconds = s.predicted_s - start.predicted_s
            out.append(
                {
                    "drafted": drafted,
                    "accepted": s.accepted - start.accepted,
                    "acceptance": (s.accepted - start.accepted) / drafted,
                    "decode_tps": (s.predicted - start.predicted) / seconds if seconds > 0 else None,
                    "busy": s.busy,
                }
            )
            start = s
    return out


def below_plain(window: dict[str, Any], bounds: Bounds) -> str | None:
    """Why a window is below plain, or None."""
    if window["acceptance"] < bounds.min_accept:
        return f"{window['acceptance']:.0%} of drafts accepted (bound {bounds.min_accept:.0%})"
    tps = window.get("decode_tps")
    if bounds.plain_tps and tps is not None and tps < bounds.plain_tps:
        return f"{tps:.1f} tok/s, plain measured {bounds.plain_tps:.1f}"
    return None


def verdict(samples: list[Sample], bounds: Bounds) -> dict[str, Any]:
    """`watching` (no full window yet), `paying` or `below plain`, with the last window's figures."""
    closed = windows(samples, bounds.window_tokens)
    out: dict[str, Any] = {"bounds": bounds.to_json(), "windows": len(closed)}
    if not closed:
        return {**out, "status": "watching", "why": f"fewer than {bounds.window_tokens} tokens drafted yet"}
    last = closed[-1]
    recent = closed[-bounds.windows :]
    reasons = [below_plain(w, bounds) for w in recent]
    out["last"] = last
    if len(recent) == bounds.windows and all(reasons):
        return {**out, "status": "below plain", "why": f"{bounds.windows} windows in a row: {reasons[-1]}"}
    return {**out, "status": "paying", "why": reasons[-1] or f"{last['acceptance']:.0%} of drafts accepted"}


def from_metrics(metrics: Mapping[str, float]) -> Sample | None:
    if DRAFTED not in metrics or ACCEPTED not in metrics:
        return None
    return Sample(
        int(metrics[DRAFTED]),
        int(metrics[ACCEPTED]),
        int(metrics.get(PREDICTED, 0)),
        float(metrics.get(PREDICTED_S, 0.0)),
        int(metrics.get(BUSY, 0)),
    )


def read_sample(base_url: str, api_key: str | None) -> tuple[str, Sample | None]:
    """("asleep" | "awake" | "unknown", the counters when awake). /props first: it never wakes
    a sleeping server, and while it sleeps nothing else is asked."""
    from bonsai_launch.server import client

    asleep = client.sleeping(base_url, api_key)
    if asleep is None:
        return "unknown", None
    if asleep:
        return "asleep", None
    try:
        return "awake", from_metrics(client.metrics(base_url, api_key))
    except Exception:  # a failed read must never end the process that restarts the server
        return "unknown", None


class Watch:
    """A daemon thread that samples a server and publishes the verdict on each change."""

    MAX_SAMPLES = 4096

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        bounds: Bounds,
        publish: Callable[[dict[str, Any]], None],
        on_below: Callable[[dict[str, Any]], None] = lambda v: None,
    ) -> None:
        self.base_url, self.api_key, self.bounds = base_url, api_key, bounds
        self.publish, self.on_below = publish, on_below
        self.samples: list[Sample] = []
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bonsai-watch", daemon=True)

    def start(self) -> Watch:
        if self.bounds.every_s > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def step(self) -> dict[str, Any] | None:
        """One sample; the verdict, or None when the server was not read (asleep, unknown)."""
        _state, sample = read_sample(self.base_url, self.api_key)
        if sample is None:
            return None
        self.samples.append(sample)
        del self.samples[: -self.MAX_SAMPLES]
        return verdict(self.samples, self.bounds)

    def _run(self) -> None:
        last: tuple[Any, ...] | None = None
        told_below = False
        while not self.stopped.wait(self.bounds.every_s):
            try:
                v = self.step()
            except Exception:
                continue
            if v is None:
                continue
            key = (v["status"], v["windows"])
            if key != last:
                last = key
                self.publish({**v, "at": time.time()})
            if v["status"] == "below plain" and not told_below:
                told_below = True
                self.on_below(v)
            elif v["status"] == "paying":
                told_below = False


def plain_speed(tuning: Mapping[str, Any] | None) -> float | None:
    """The plain decode speed a tuning decision measured (its baseline row), if the launch runs one."""
    if not tuning or tuning.get("status") != "found":
        return None
    row = next((r for r in tuning.get("table") or () if r.get("spec_type") is None and r.get("ratio") is None), None)
    tps = (row or {}).get("decode_tps")
    return float(tps) if tps else None


def for_job(job, on_event: Callable[[str], None] | None = None) -> Watch | None:
    """Start the watch of a restart job's server (None: not speculative, or the watch is off).
    The verdict goes into the instance's state; a sustained "below plain" is a line in the
    server's log and, under BONSAI_SPECULATIVE=auto, marks the decision for re-tuning."""
    from bonsai_launch.server import restart

    if job.spec_type is None or not job.watch or not job.watch.get("every_s"):
        return None
    bounds = Bounds(**job.watch)

    def below(v: dict[str, Any]) -> None:
        tuning = job.instance.get("tuning") or {}
        text = f"speculation ({job.spec_type}) is below plain on this server's work: {v['why']}"
        if tuning.get("status") == "found" and tuning.get("key_id"):
            from bonsai_launch.decisions.store import mark_retune

            mark_retune(tuning["key_id"], {"why": v["why"], "at": time.time(), "verdict": v})
            text += f"; decision {tuning['id']} is marked stale: the next `bonsai start` tunes again"
        text += " (the server keeps running as it is)"
        restart.note(job, text, on_event)

    return Watch(job.instance["base_url"], job.api_key, bounds, lambda v: restart.record(job, watch=v), below).start()
