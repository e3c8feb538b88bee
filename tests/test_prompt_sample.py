"""BONSAI_TUNE_SAMPLE: a bounded, local sample of the prompts a server was sent, read from the real
llama-server's /slots (server/prompt_sample.py), and `bonsai tune --prompts recent` reading it."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import httpx
import pytest

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.measure import Endpoint, RequestResult
from bonsai_launch.bench.requests import _send
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.server import prompt_sample
from bonsai_launch.server.process import free_port
from bonsai_launch.tune.session import load_tuning_prompts
from start_helpers import bonsai, bonsai_env, json_out, stop_all


def _slot(slot_id: int, task: int, prompt: str | None, processing: bool = False) -> dict:
    data: dict = {"id": slot_id, "id_task": task, "is_processing": processing}
    if prompt is not None:
        data["prompt"] = prompt
    return data


def test_new_finished_prompts_are_taken_once():
    seen: set[tuple[int, int]] = set()
    slots = [_slot(0, 5, "<bos>user: a"), _slot(1, 6, "b", processing=True), _slot(2, 7, None), {"id": 3}]
    first = prompt_sample.entries_from_slots(slots, seen)
    assert [e["raw"] for e in first] == ["<bos>user: a"] and first[0]["category"] == "recent"
    assert prompt_sample.entries_from_slots(slots, seen) == []  # the same task is not taken twice
    # the running one is taken once it is done
    done = prompt_sample.entries_from_slots([_slot(1, 6, "b")], seen)
    assert [e["raw"] for e in done] == ["b"]
    assert prompt_sample.entries_from_slots(None, seen) == []  # a server that answered nothing


def test_a_prompt_longer_than_the_cap_is_left_out_whole():
    long = "x" * (prompt_sample.MAX_PROMPT_CHARS + 1)
    assert prompt_sample.entries_from_slots([_slot(0, 1, long)], set()) == []


def test_the_sample_keeps_the_newest_and_a_repeated_prompt_once():
    rows = [{"id": str(i), "category": "recent", "raw": f"p{i}"} for i in range(3)]
    again = [{"id": "9", "category": "recent", "raw": "p0"}, {"id": "10", "category": "recent", "raw": "p3"}]
    kept = prompt_sample.merged(rows, again, limit=3)
    assert [r["raw"] for r in kept] == ["p2", "p0", "p3"]
    assert prompt_sample.merged(rows, [], limit=0) == []


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
def test_the_file_is_the_owners_alone_and_never_half_written(tmp_path):
    path = tmp_path / "samples" / "m.jsonl"
    prompt_sample.write(path, [{"id": "1", "category": "recent", "raw": "é"}])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["m.jsonl"]  # no temporary file left
    assert prompt_sample.read(path) == [{"id": "1", "category": "recent", "raw": "é"}]


def test_a_raw_prompt_goes_to_completions_as_it_is():
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, text='data: {"choices": [{"text": "ok", "finish_reason": "stop"}]}\n\n')

    parsed = suite._parse_prompt({"id": "r", "category": "recent", "raw": "<bos>templated"}, "x line 1")
    assert parsed.raw and parsed.messages == (("user", "<bos>templated"),)
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        result = RequestResult("plain", "r", "recent", 0.0, 0)
        _send(http, Endpoint("http://127.0.0.1:1", api="chat"), result, parsed.chat_messages(), 16, 1, parsed.raw)
    assert seen[0][0] == "/v1/completions" and seen[0][1]["prompt"] == "<bos>templated"


def test_the_plan_turns_the_slots_view_on_only_when_asked():
    from test_plan import plan_for

    plan = plan_for()
    assert prompt_sample.SLOTS_DEBUG_ENV not in plan.env and plan.prompt_sample is None
    plan = plan_for(env={"BONSAI_TUNE_SAMPLE": "5", "BONSAI_WATCH_SECONDS": "7"})
    assert plan.env[prompt_sample.SLOTS_DEBUG_ENV] == "1"
    assert plan.prompt_sample == {"limit": 5, "every_s": 7, "path": str(prompt_sample.sample_path(plan.model))}
    assert any(r.flag == prompt_sample.SLOTS_DEBUG_ENV and "BONSAI_TUNE_SAMPLE=5" in r.why for r in plan.reasons)
    assert plan.to_json()["prompt_sample"]["limit"] == 5


def test_tune_recent_without_a_sample_says_how_to_get_one(tmp_path):
    with pytest.raises(BonsaiError, match=r"no sample of recent requests for m\.gguf") as err:
        load_tuning_prompts("recent", tmp_path / "m.gguf")
    assert "BONSAI_TUNE_SAMPLE=200" in (err.value.fix or "")


def _wait_for(path: Path, last: str, seconds: float = 30) -> list[dict]:
    """The sample once its newest prompt is `last` (bounded: a keeper that never reads is a failure)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = prompt_sample.read(path)
        if rows and rows[-1]["raw"] == last:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"the sample never ended with {last!r}: {prompt_sample.read(path)}")


def test_a_start_that_tunes_uses_the_sample_once_it_holds_enough(tmp_path):
    model = tmp_path / "m.gguf"
    rows = [{"id": str(i), "category": "recent", "raw": f"p{i}"} for i in range(prompt_sample.MIN_FOR_AUTO)]
    prompt_sample.write(prompt_sample.sample_path(model), rows[:-1])
    assert prompt_sample.tuning_prompts(model) is None  # too few: the bundled prompts decide
    prompt_sample.write(prompt_sample.sample_path(model), rows)
    assert prompt_sample.tuning_prompts(model) == "recent"


@pytest.mark.server
@pytest.mark.slow  # three requests, each read by a keeper that looks once a second
def test_a_detached_server_samples_its_own_prompts_for_tuning(llama_server, tiny_pair):
    """The real /slots view, read by the real keeper: the newest 2 of 3 requests are kept, as the
    server itself shows them, and `--prompts recent` loads them for the same model."""
    from bonsai_launch.server import client

    target = tiny_pair["target"]
    env = bonsai_env(llama_server, BONSAI_TUNE_SAMPLE="2", BONSAI_WATCH_SECONDS="1")
    try:
        data = json_out(bonsai(["start", "--model", target, "--port", free_port(), "--detach", "--json"], env=env))
        url = data["url"].removesuffix("/v1").rstrip("/")
        path = prompt_sample.sample_path(target)
        shown = []
        with httpx.Client(timeout=60, trust_env=False) as http:
            for words in ["1 2 3 4", "5 6 7 8 9", "0 9 8 7 6 5"]:
                r = http.post(url + "/completion", json={"prompt": words, "n_predict": 4})
                assert r.status_code == 200, r.text
                slots = [s for s in client.slots(url) or [] if s.get("prompt")]
                shown.append(max(slots, key=lambda s: s["id_task"])["prompt"])  # what the server says it ran
                rows = _wait_for(path, shown[-1])
        assert len(set(shown)) == 3, shown  # three different prompts, as the server saw them
        assert [r["raw"] for r in rows] == shown[1:]  # the newest 2
        if os.name != "nt":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        prompts, name = load_tuning_prompts("recent", target)
        assert [p.raw for p in prompts] == [True, True] and name.startswith("2 recent requests (")
        stop_all()
        # The decision is made on that sample and says so.
        args = ["tune", "--model", target, "--prompts", "recent", "--configs", "plain,ngram-simple"]
        tuned = json_out(bonsai([*args, "--max-tokens", "16", "--json"], server=llama_server, timeout=300))
        assert tuned["decision"]["prompts"] == name and tuned["decision"]["evidence"]["prompts"] == 2, tuned
    finally:
        stop_all()


def test_the_switch_is_shown_and_a_secret_beside_it_stays_masked():
    from bonsai_launch.server.plan.types import shown_env

    env = {prompt_sample.SLOTS_DEBUG_ENV: "1", "LLAMA_API_KEY": "s3cret", "HF_TOKEN": "t"}
    assert shown_env(env, "***") == {prompt_sample.SLOTS_DEBUG_ENV: "1", "LLAMA_API_KEY": "***", "HF_TOKEN": "***"}
