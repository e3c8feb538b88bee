"""The keeper re-decides `auto` from its server's own traffic (server/traffic.py), with the opt-in
sample on: no benchmark runs, `bonsai ps` says so, the next start applies it, and the server in
use keeps running as it is.

What the verdict turns on is fixed by the test, not by the machine: the stored decision runs
ngram-simple with a verify cost (kappa) of 3 plain steps per drafted token, at which any
drafting is far slower than plain; the traffic repeats a pattern, which the demo model continues,
so ngram-simple drafts on it (as the liveness probe relies on). The replay then finds plain
clearly faster whatever words this CPU's model chose. With kappa 1.5 one run in the slow lane
drafted little at the server's default temperature: plain est. only 6.6% ahead, under the 10%
margin (3 makes that 13% or more at any acceptance). At temperature 0 the replay drafted
nothing on this prompt (plain and ngram-simple est. equal): the sampled text is what drafts here.
"""

from __future__ import annotations

import time

import httpx
import pytest

from bonsai_launch.decisions import store
from bonsai_launch.decisions.auto import launch_key
from bonsai_launch.decisions.identity import TuneKey
from bonsai_launch.decisions.store import Choice, Decision
from bonsai_launch.server import prompt_sample
from bonsai_launch.server.inputs import model_files, select
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, json_out, stop_all

CANDIDATES = {
    "ngram-simple": {"args": ["--spec-type", "ngram-simple"], "spec_type": "ngram-simple", "n_max": None},
    "ngram-map-k": {"args": ["--spec-type", "ngram-map-k"], "spec_type": "ngram-map-k", "n_max": None},
}
PATTERNS = ["red green blue", "one two three four", "north east south west", "cat dog bird fish", "a b c d e"]


def _stored_decision(llama_server, model) -> Decision:
    files = model_files(select({}), str(model), None)
    key, why = launch_key(files, llama_server)
    assert why is None
    plain_row = {"config": "plain", "label": "plain", "spec_type": None, "ratio": None, "decode_tps": 50.0}
    decision = Decision(
        TuneKey(key.machine, key.build, key.model_sha256, None, "p" * 64),
        Choice("ngram-simple", "ngram-simple", "ngram-simple", None, 1.3),
        (plain_row,),
        "2026-12-05T10:00:00Z",
        "tune",
        str(model),
        evidence={"clients": 1, "replay": {"cost": {"step_ms": 10.0, "kappa": 3.0}, "candidates": CANDIDATES}},
    )
    store.save(decision)
    return decision


def _ps(llama_server) -> dict:
    [entry] = json_out(bonsai(["ps", "--json"], server=llama_server))
    return entry


@pytest.mark.server
def test_the_keeper_re_decides_from_its_servers_traffic_for_the_next_start(llama_server, demo_gguf):
    old = _stored_decision(llama_server, demo_gguf)
    env = bonsai_env(llama_server, BONSAI_TUNE_SAMPLE="50", BONSAI_WATCH_SECONDS="1")
    common = ["--model", demo_gguf, "--speculative", "auto"]
    try:
        data = json_out(bonsai(["start", *common, "--port", free_port(), "--detach", "--json"], env=env, timeout=300))
        assert data["plan"]["tuning"]["id"] == old.key.id[:8] and data["plan"]["speculative"]["type"] == "ngram-simple"
        url = data["url"].removesuffix("/v1").rstrip("/")
        pid = _ps(llama_server)["pid"]
        sample = prompt_sample.sample_path(demo_gguf)
        traffic: dict = {}
        with httpx.Client(timeout=300, trust_env=False) as http:
            for n in range(24):  # until the keeper has replayed enough (8 requests, 1000 tokens)
                words = PATTERNS[n % len(PATTERNS)]
                prompt = f"Request {n}: " + ", ".join([words] * 6) + ","
                r = http.post(url + "/completion", json={"prompt": prompt, "n_predict": 160})
                assert r.status_code == 200, r.text
                deadline = time.monotonic() + 120  # the keeper reads /slots once a second: bounds a hang only
                while len(prompt_sample.read(sample)) < n + 1 and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(1.5)  # the verdict follows the sample's write in the same step
                traffic = _ps(llama_server).get("traffic") or {}
                if traffic.get("decision"):
                    break
        assert traffic.get("decision"), traffic
        assert traffic["choice"] == "plain" and "plain est." in traffic["why"], traffic
        entry = _ps(llama_server)
        assert entry["pid"] == pid and not entry.get("restarts")  # the server in use was left alone
        text = bonsai(["ps"], env={**env, "COLUMNS": "300"}).stdout
        assert "re-decided from its traffic: plain, from the next start" in text
        assert "auto re-decided from this server's traffic" in bonsai(["logs", entry["name"]], env=env).stdout
        # the next start runs what the traffic decided, and says where it came from
        plan = json_out(bonsai(["start", *common, "--dry-run", "--json"], env=env))
        assert plan["tuning"]["id"] == traffic["decision"] and plan["tuning"]["source"] == "traffic"
        assert plan["speculative"] is None and plan["tuning"]["choice"]["config"] == "plain"
        assert plan["tuning"]["prompts"].endswith("recent requests, replayed")
    finally:
        stop_all()
