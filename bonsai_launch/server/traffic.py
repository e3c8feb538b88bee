"""The keeper's re-decision of `auto` from what its server actually generated (the edge of
decisions/traffic.py).

Runs in the prompt sampler's thread (server/prompt_sample.py), so only with the opt-in sample
on, and only under BONSAI_SPECULATIVE=auto with a decision tuned with replayable candidates.
Each request the sampler records (a prompt and the server's answer) is turned into tokens by the
server itself (/tokenize, while it is awake: the sampler reads only then), the newest WINDOW
are replayed through every draft-free candidate of the decision (llamacpp/replay.py: the pin's
own drafting code, milliseconds) and estimated with the decision's cost model. When another
candidate would be clearly faster, the verdict goes into the instance (`bonsai ps`), a line
into the server's log, and a decision into the store that the next `bonsai start` applies.
The server in use is never restarted for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bonsai_launch.decisions import estimate as est
from bonsai_launch.decisions import traffic as rule
from bonsai_launch.llamacpp import replay as rp

WINDOW = 64  # newest requests replayed: enough for a verdict, recent enough to follow a change of work


class TrafficJudge:
    def __init__(self, job, candidates: dict[str, dict[str, Any]], cost: est.CostModel, decided: str) -> None:
        self.job = job
        self.candidates = candidates
        self.cost = cost
        self.decided = decided  # the configuration the newest decision for this launch runs
        self.streams: deque[rp.Stream] = deque(maxlen=WINDOW)
        self.tool: Path | None = None
        self.last: dict[str, Any] | None = None
        self.redecided: dict[str, Any] = {}  # the newest re-decision, shown until the server stops
        self.off = False  # the replay cannot run here (said once)

    def add(self, entries: list[dict[str, Any]], answers: Mapping[int, list[int]] | None = None) -> None:
        """Tokenize new sample entries (prompt and answer) with the server's own tokenizer;
        `answers`: the answers' tokens by entry index where the caller has them already."""
        from bonsai_launch.server import client

        base, key = self.job.instance["base_url"], self.job.api_key
        for i, e in enumerate(entries):
            if not isinstance(e.get("raw"), str) or not isinstance(e.get("generated"), str):
                continue
            prompt = client.tokenize(base, e["raw"], key, prompt=True)
            generated = (answers or {}).get(i) or client.tokenize(base, e["generated"], key)
            if len(generated) > 1:
                self.streams.append(rp.Stream(tuple(prompt), tuple(generated), int(e.get("n_predict") or -1)))

    def step(self) -> dict[str, Any] | None:
        """Replay, judge, and act on a verdict that changed; the verdict (None: nothing yet)."""
        if not self.streams or self.off:
            return None
        streams = list(self.streams)
        estimates = {rule.PLAIN: est.plain_estimate((len(s.generated) - 1 for s in streams), self.cost)}
        try:
            self.tool = self.tool or rp.tool_for(Path(self.job.argv[0]))
            for name, meta in self.candidates.items():
                estimates[name] = est.estimate(rp.replay(self.tool, meta["args"], streams), self.cost)
        except rp.ReplayUnavailable as exc:  # said once, in ps; the server serves on as it is
            self.off = True
            why = f"no replay: {str(exc).splitlines()[0]}"
            self._publish({"status": "off", "why": why, "requests": len(streams), "decided": self.decided})
            return None
        verdict = rule.judge(self.decided, estimates, len(streams))
        if verdict["status"] == "re-decide":
            self._redecide(verdict, estimates, len(streams))
        self._publish(verdict)
        return verdict

    def _redecide(self, verdict: dict[str, Any], estimates: dict[str, est.Estimate], requests: int) -> None:
        from bonsai_launch.decisions.store import load, save
        from bonsai_launch.server import restart

        tuning = self.job.instance.get("tuning") or {}
        old = load(str(tuning.get("key_id")))
        if old is None:
            verdict["status"], verdict["why"] = "kept", "the decision it runs is no longer stored"
            return
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        new = rule.redecision(old, verdict["choice"], estimates, self.candidates, self.cost, requests, created)
        save(new)
        self.decided = verdict["choice"]
        self.redecided = {"choice": verdict["choice"], "decision": new.key.id[:8]}
        restart.note(
            self.job,
            f"auto re-decided from this server's traffic: {verdict['why']}; decision {new.key.id[:8]} applies "
            "at the next `bonsai start` (this server keeps running as it is)",
        )

    def _publish(self, verdict: dict[str, Any]) -> None:
        from bonsai_launch.server import restart

        keys = ("status", "why", "requests", "decided")
        short: dict[str, Any] = {**{k: verdict[k] for k in keys if k in verdict}, **self.redecided}
        key = (short["status"], short.get("choice"), short["requests"])
        if self.last is None or key != (self.last["status"], self.last.get("choice"), self.last["requests"]):
            restart.record(self.job, traffic={**short, "at": time.time()})
        self.last = short


def for_job(job) -> TrafficJudge | None:
    """A judge for a server run under auto with a decision whose candidates can be replayed."""
    tuning = job.instance.get("tuning") or {}
    replay = tuning.get("replay") or {}
    cost = est.CostModel.from_json(replay.get("cost"))
    candidates = {n: c for n, c in (replay.get("candidates") or {}).items() if c.get("args")}
    if tuning.get("status") != "found" or cost is None or not candidates or not job.argv:
        return None
    decided = (tuning.get("choice") or {}).get("config") or rule.PLAIN
    if decided != rule.PLAIN and decided not in candidates:
        return None  # a drafter or MTP decision: its speed cannot be replayed
    return TrafficJudge(job, candidates, cost, decided)
