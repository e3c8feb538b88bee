"""Re-deciding `auto` from the server's own traffic (pure; server/traffic.py is the edge).

With the opt-in sample on (BONSAI_TUNE_SAMPLE), the process that restarts a server replays
what it generated through every draft-free candidate the decision was tuned with, and
estimates each one's speed with the cost model that tuning measured (decisions/estimate.py).
When another configuration (plain included) would be clearly faster than the one decided,
`judge` says so and `redecision` is the decision the next start (or `bonsai tune --show`)
uses. The server in use keeps running as it is.

"Clearly": at least MARGIN faster in the replay's estimate, on at least MIN_REQUESTS requests
and MIN_TOKENS generated tokens: the estimate was within 10% of the measured speed on every
configuration checked (docs/benchmarks.md, issue 47), so a smaller gap is not a finding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bonsai_launch.decisions.estimate import CostModel, Estimate
from bonsai_launch.decisions.store import Choice, Decision

MARGIN = 0.10
MIN_REQUESTS = 8
MIN_TOKENS = 1000
TRAFFIC_PROMPTS = "traffic"  # the key's prompt part: one traffic decision per launch, replaced each time
PLAIN = "plain"


def judge(decided: str, estimates: Mapping[str, Estimate], requests: int) -> dict[str, Any]:
    """The verdict on the replayed traffic: `status` "watching" (too little yet), "kept" or
    "re-decide" (with `choice`), `why` in words, and the estimates."""
    figures = {name: e.to_json() for name, e in estimates.items()}
    tokens = estimates[PLAIN].tokens if PLAIN in estimates else 0
    base = {"requests": requests, "tokens": tokens, "decided": decided, "estimates": figures}
    if requests < MIN_REQUESTS or tokens < MIN_TOKENS:
        why = f"{requests} requests, {tokens} tokens replayed (re-decides from {MIN_REQUESTS} and {MIN_TOKENS})"
        return {**base, "status": "watching", "why": why}
    if decided not in estimates:
        return {**base, "status": "kept", "why": f"{decided} cannot be replayed: nothing to compare"}
    best = max(estimates, key=lambda n: estimates[n].tps)
    mine = estimates[decided].tps
    if best != decided and mine > 0 and estimates[best].tps >= mine * (1 + MARGIN):
        gain = estimates[best].tps / mine
        why = (
            f"{best} est. {estimates[best].tps:.1f} tok/s against {mine:.1f} for {decided} ({gain:.2f}x) "
            f"on the last {requests} requests"
        )
        return {**base, "status": "re-decide", "choice": best, "why": why}
    lead = f"{decided} est. {mine:.1f} tok/s"
    if best != decided:
        lead += f", {best} {estimates[best].tps:.1f} (less than {MARGIN:.0%} ahead)"
    return {**base, "status": "kept", "why": f"{lead} on the last {requests} requests"}


def redecision(
    old: Decision,
    name: str,
    estimates: Mapping[str, Estimate],
    candidates: Mapping[str, Mapping[str, Any]],
    cost: CostModel,
    requests: int,
    created: str,
) -> Decision:
    """The decision a traffic verdict makes: `name` with its replayed estimate against plain,
    under the old decision's inputs (the key's prompt part says it comes from traffic)."""
    plain = estimates[PLAIN]
    meta = candidates.get(name, {}) if name != PLAIN else {}

    def ratio(n: str) -> float | None:
        return estimates[n].tps / plain.tps if plain.tps else None

    if name == PLAIN:
        choice = Choice(
            PLAIN, PLAIN, reason=f"replayed traffic: no draft-free candidate ahead of plain by {MARGIN:.0%}"
        )
    else:
        r = ratio(name)
        choice = Choice(
            name,
            str(meta.get("label") or name),
            meta.get("spec_type") or name,
            meta.get("n_max"),
            r,
            reason=f"replayed traffic: est. {r:.2f}x plain on {requests} requests" if r else "replayed traffic",
        )
    rows: list[dict[str, Any]] = [
        {
            "config": PLAIN,
            "label": PLAIN,
            "spec_type": None,
            "n_max": None,
            "decode_tps": plain.tps,
            "ratio": None,
            "runs": 0,
            "status": "chosen: nothing ahead by the margin" if name == PLAIN else "baseline (estimated)",
        }
    ]
    for n, e in sorted(estimates.items(), key=lambda kv: kv[1].tps, reverse=True):
        if n == PLAIN:
            continue
        r = ratio(n)
        rows.append(
            {
                "config": n,
                "label": str(candidates.get(n, {}).get("label") or n),
                "spec_type": candidates.get(n, {}).get("spec_type"),
                "n_max": candidates.get(n, {}).get("n_max"),
                "decode_tps": e.tps,
                "ratio": {"median": r, "min": r, "max": r, "n": 1} if r else None,
                "acceptance_rate": e.acceptance,
                "drafted": e.drafted,
                "runs": 0,
                "status": "chosen: estimated from the replayed traffic" if n == name else "estimated from the replay",
            }
        )
    replay = dict(old.evidence.get("replay") or {})
    replay["cost"] = cost.to_json()
    return dataclasses.replace(
        old,
        key=dataclasses.replace(old.key, prompts_sha256=TRAFFIC_PROMPTS),
        choice=choice,
        table=tuple(rows),
        created=created,
        source="traffic",
        prompts=f"{requests} recent requests, replayed",
        evidence={
            **{k: old.evidence.get(k) for k in ("rule", "noise_rule", "clients", "conditions")},
            "prompts": requests,
            "answer_lengths": f"the server's own answers ({plain.tokens} tokens)",
            "redecided_from": old.key.id,
            "redecided_choice": old.choice.config,
            "margin": MARGIN,
            "replay": replay,
        },
    )
