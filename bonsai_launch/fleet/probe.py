"""One member's state as `fleet ps` shows it: health, requests in flight, speculative acceptance.

In flight comes from /slots (slots with is_processing) or, without /slots, from /metrics
(llamacpp:requests_processing); acceptance from the spec-decode counters in /metrics
(replicas run with --metrics). Every probe is short and never raises: an unreachable member is
reported as such. A member asleep (BONSAI_SLEEP_IDLE_SECONDS) is asked /props first, which
answers from a cache: /slots would wake it and load its model again, so it is skipped then
(nothing is in flight on a sleeping server); /metrics never wakes one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bonsai_launch.fleet.health import UNREACHABLE, Reach, reach

PROBE_TIMEOUT = 3.0


@dataclass(frozen=True)
class MemberProbe:
    health: str  # "ok", "loading", "down", or "http NNN"
    in_flight: int | None
    drafted: int | None
    accepted: int | None
    asleep: bool = False  # /props' is_sleeping: the model is unloaded until the next request
    reach: Reach | None = None  # with check_key: whether it answers its key (/v1/models), for remote members

    @property
    def healthy(self) -> bool:
        return self.health == "ok"

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted and self.accepted is not None else None


DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"


def spec_counters(metrics: dict[str, float]) -> tuple[int | None, int | None]:
    """(drafted, accepted) tokens from llama-server's /metrics (b11434 names); None without them."""
    drafted, accepted = metrics.get(DRAFTED), metrics.get(ACCEPTED)
    return (None if drafted is None else int(drafted)), (None if accepted is None else int(accepted))


def probe(url: str, api_key: str | None, *, check_key: bool = False) -> MemberProbe:
    """The member's state; with check_key also whether it answers its key, on the same client
    (one look per member, not two)."""
    import httpx

    from bonsai_launch.server.client import parse_metrics, session, sleeping

    with session(api_key, PROBE_TIMEOUT) as http:
        try:
            r = http.get(url + "/health")
        except httpx.HTTPError as exc:
            down = Reach(UNREACHABLE, f"{type(exc).__name__}: {exc}"[:200]) if check_key else None
            return MemberProbe("down", None, None, None, reach=down)
        health = "ok" if r.status_code == 200 else "loading" if r.status_code == 503 else f"http {r.status_code}"
        in_flight = drafted = accepted = None
        asleep = sleeping(url, api_key, PROBE_TIMEOUT) is True
        if asleep:
            in_flight = 0
        else:
            try:
                s = http.get(url + "/slots")
                if s.status_code == 200 and isinstance(s.json(), list):
                    in_flight = sum(1 for slot in s.json() if slot.get("is_processing"))
            except (httpx.HTTPError, ValueError):
                pass
        try:
            m = http.get(url + "/metrics")
            if m.status_code == 200:
                metrics = parse_metrics(m.text)
                if in_flight is None and "llamacpp:requests_processing" in metrics:
                    in_flight = int(metrics["llamacpp:requests_processing"])
                drafted, accepted = spec_counters(metrics)
        except httpx.HTTPError:
            pass
        key_check = reach(url, api_key, http) if check_key else None
    return MemberProbe(health, in_flight, drafted, accepted, asleep, key_check)


def member_key(api_key_env: str | None) -> str | None:
    return os.environ.get(api_key_env) if api_key_env else None
