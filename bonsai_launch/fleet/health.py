"""Remote members as the proxy and the network see them: reachable, answering its key, and in
or out of the proxy's pool.

llama-server's /health needs no key, so a member restarted with another key still looks healthy
there; /v1/models needs the key, so it tells "wrong key" from "ok". The proxy's own view comes
from its /health, which with background health checks on (configs.py) returns the last check's
verdict per member (model_info.id) and the error that failed it, without new requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

PROBE_TIMEOUT = 5.0

# What a member is, in the words `fleet ps` and `fleet up` print.
HEALTHY = "healthy"
COOLING = "cooling down"  # answers now, but the proxy's last check failed: out of the pool until the next one
UNREACHABLE = "unreachable"
WRONG_KEY = "wrong key"
LOADING = "loading"


@dataclass(frozen=True)
class Reach:
    """One direct look at a member with its key."""

    state: str  # HEALTHY, UNREACHABLE, WRONG_KEY, LOADING, or "http NNN"
    error: str | None = None


def reach(url: str, api_key: str | None, http: Any = None) -> Reach:
    """GET /v1/models with the member's key, on `http` (an httpx.Client) when given: `fleet ps`
    asks it on the client its probe already holds. Never raises."""
    import httpx

    from bonsai_launch.server.client import auth_headers, session

    if http is None:
        with session(None, PROBE_TIMEOUT) as own:
            return reach(url, api_key, own)
    try:
        r = http.get(url.rstrip("/") + "/v1/models", headers=auth_headers(api_key), timeout=PROBE_TIMEOUT)
    except httpx.HTTPError as exc:
        return Reach(UNREACHABLE, f"{type(exc).__name__}: {exc}"[:200] or type(exc).__name__)
    if r.status_code == 200:
        return Reach(HEALTHY)
    if r.status_code in (401, 403):
        return Reach(WRONG_KEY, f"HTTP {r.status_code} to its key")
    if r.status_code == 503:
        return Reach(LOADING, "HTTP 503 (loading)")
    return Reach(f"http {r.status_code}", f"HTTP {r.status_code}: {r.text[:120]}")


def wait_reach(url: str, api_key: str | None, wait_s: float, sleep_s: float = 1.0) -> Reach:
    """Until the member answers its key, or `wait_s` passes. A wrong key is final at once:
    waiting does not change a key."""
    deadline = time.monotonic() + wait_s
    while True:
        got = reach(url, api_key)
        if got.state in (HEALTHY, WRONG_KEY) or time.monotonic() >= deadline:
            return got
        time.sleep(sleep_s)


def refusal_line(name: str, url: str, got: Reach, key_env: str | None) -> str:
    """One line per member for `fleet up`'s refusal."""
    if got.state == WRONG_KEY:
        key = f"the key in {key_env}" if key_env else "no key (the fleet file names no api_key_env)"
        return f"{name} ({url}): answers {got.error} - it does not accept {key}"
    return f"{name} ({url}): {got.state}" + (f" ({got.error})" if got.error else "")


@dataclass(frozen=True)
class ProxyVerdict:
    healthy: bool
    error: str | None


def proxy_verdicts(proxy_url: str, master_key: str | None) -> dict[str, ProxyVerdict] | None:
    """member name -> the proxy's last background check; None when the proxy cannot be asked
    (down, or the master key is not known here)."""
    import httpx

    from bonsai_launch.server.client import session

    if not master_key:
        return None
    try:
        with session(master_key, PROBE_TIMEOUT * 2) as http:
            r = http.get(proxy_url + "/health")
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    out: dict[str, ProxyVerdict] = {}
    for e in body.get("healthy_endpoints") or []:
        if isinstance(e, dict) and e.get("model_id"):
            out[str(e["model_id"])] = ProxyVerdict(True, None)
    for e in body.get("unhealthy_endpoints") or []:
        if isinstance(e, dict) and e.get("model_id"):
            out[str(e["model_id"])] = ProxyVerdict(False, short_error(e.get("error")))
    return out


def short_error(text: object) -> str | None:
    """LiteLLM's error text is a paragraph with a traceback hint; its first line is the cause."""
    if not text:
        return None
    first = str(text).strip().splitlines()[0]
    return first[:200]


def member_state(verdict: ProxyVerdict | None, direct: Reach) -> tuple[str, str | None]:
    """(state, last error) of one member: the proxy's verdict where it has one, refined by what
    the member answers now (why it is out, or that it answers again and waits for the next check)."""
    if verdict is None:  # the proxy's view is not available: what the member answers
        return direct.state, direct.error
    if verdict.healthy:
        if direct.state in (UNREACHABLE, WRONG_KEY):  # failed since the proxy's last check
            return direct.state, direct.error
        return HEALTHY, None
    if direct.state == HEALTHY:
        return COOLING, verdict.error
    return direct.state, verdict.error or direct.error
