"""What the LiteLLM proxy adds to each request on loopback: the same 1-token chat completion
sent alternately straight to a replica and through the proxy, sequentially, one at a time.

Run against a running fleet, in a quiet window (nothing else on the cores):
    BONSAI_API_KEY=<the fleet's key> python -m bonsai_launch.fleet.latency --requests 200
Alternating the two paths request by request cancels slow drifts (thermal, other load) out of
the difference; the report gives medians and the 90th percentile of each path and the median
of the paired differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ProxyLatency:
    requests: int
    direct_ms: list[float]
    proxied_ms: list[float]

    @staticmethod
    def _p90(xs: list[float]) -> float:
        s = sorted(xs)
        return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]

    @property
    def added_ms(self) -> float:
        """Median of the paired differences (proxied minus direct)."""
        return statistics.median(p - d for p, d in zip(self.proxied_ms, self.direct_ms, strict=True))

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "direct_median_ms": round(statistics.median(self.direct_ms), 2),
            "direct_p90_ms": round(self._p90(self.direct_ms), 2),
            "proxied_median_ms": round(statistics.median(self.proxied_ms), 2),
            "proxied_p90_ms": round(self._p90(self.proxied_ms), 2),
            "added_median_ms": round(self.added_ms, 2),
        }


def measure(
    proxy_url: str,
    proxy_key: str,
    member_url: str,
    model: str,
    requests: int = 100,
    member_key: str | None = None,
    warmup: int = 3,
) -> ProxyLatency:
    import httpx

    from bonsai_launch.server.client import auth_headers, session

    body = {"model": model, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Say OK."}]}

    def timed(http: httpx.Client, url: str, key: str | None) -> float:
        started = time.perf_counter()
        r = http.post(url + "/v1/chat/completions", json=body, headers=auth_headers(key))
        elapsed = (time.perf_counter() - started) * 1000
        r.raise_for_status()
        return elapsed

    direct, proxied = [], []
    with session(None, 60.0) as http:
        for _ in range(warmup):
            timed(http, member_url, member_key)
            timed(http, proxy_url, proxy_key)
        for _ in range(requests):
            direct.append(timed(http, member_url, member_key))
            proxied.append(timed(http, proxy_url, proxy_key))
    return ProxyLatency(requests, direct, proxied)


def main(argv: list[str] | None = None) -> None:
    from bonsai_launch.fleet import state

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    st = state.load()
    if st is None or st.proxy is None:
        raise SystemExit("no fleet running: `bonsai fleet up --profile demo --replicas 2` first")
    key = os.environ.get("BONSAI_API_KEY")
    if not key:
        raise SystemExit("set BONSAI_API_KEY to the fleet's key (printed by `bonsai fleet up`)")
    member = st.members[0]
    result = measure(
        st.proxy.url,
        key,
        member.url,
        st.model,
        args.requests,
        member_key=os.environ.get(member.api_key_env) if member.api_key_env else None,
    )
    print(json.dumps({"member": member.url, "proxy": st.proxy.url, **result.to_json()}, indent=2))


if __name__ == "__main__":
    main()
