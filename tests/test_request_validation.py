"""Requests that ended llama-server b11434 (an abort, a terminate, an 8 GB allocation) answer
4xx, or are bounded, and the server keeps serving (vendor/llama.cpp/patches/0003-*).

Restarts are off here (BONSAI_RESTART=0): a server that died must stay dead, so a request that
kills it fails the test instead of being hidden by bonsai's restart. Without the patch the first
case gets no answer at all (the server aborts in common/sampling.cpp).
"""

from __future__ import annotations

import time

import httpx
import pytest

import real_parts
from bonsai_launch.server import instances
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, health_ok, json_out, stop_all

pytestmark = pytest.mark.server

# The request of issue 25 (and its negative twin), as they aborted b11434.
KNOWN_KILLERS = [
    ("POST", "/completion", {"prompt": "hi", "grammar": 'root ::= "a"+', "grammar_lazy": True, "grammar_triggers": [t]})
    for t in ({"type": 99, "value": "a"}, {"type": -1, "value": "a"})
]

# Each: a body for /completion and words the 400's message must contain.
MALFORMED_TRIGGERS = [
    ({"type": 99, "value": "a"}, "unknown grammar trigger type 99"),
    ({"type": -1, "value": "a"}, "unknown grammar trigger type -1"),
    ({"type": 2**31, "value": "a"}, "unknown grammar trigger type"),
    ({"type": "1", "value": "a"}, "integer"),
    ({"type": 1}, "string"),
    ({"type": 1, "value": 5}, "string"),
    ("word", "object"),
    ({"type": 0, "value": "a"}, "token"),
    ({"type": 0, "value": "a", "token": 10**6}, "out of range"),
    ({"type": 0, "value": "a", "token": -3}, "out of range"),
]


@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory):
    # one server for the module: the binary as the `llama_server` fixture finds it
    llama_server, problem = real_parts.find_real_server()
    if problem is not None or llama_server is None:
        real_parts.missing(problem or "no llama-server", "run `bonsai build` (the pinned source and our patches)")
    home = tmp_path_factory.mktemp("validation_home")  # one server for the module, in its own home
    env = bonsai_env(llama_server, BONSAI_HOME=str(home), BONSAI_RESTART="0")
    port = free_port()
    data = json_out(
        bonsai(["start", "--model", tiny_pair["target"], "--port", port, "--ctx", "512", "--detach", "--json"], env=env)
    )
    yield data["url"], env, home
    bonsai(["stop", "--all"], env=env)


@pytest.fixture(autouse=True)
def same_home(served, monkeypatch):
    monkeypatch.setenv("BONSAI_HOME", str(served[2]))
    yield
    if not health_ok(served[0]):
        stop_all()


def completion(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/completion", json=body, timeout=60, trust_env=False)


@pytest.mark.parametrize("method,path,body", KNOWN_KILLERS, ids=lambda v: str(v)[:40])
def test_the_known_killing_requests_answer_400(served, method, path, body):
    url = served[0]
    r = completion(url, body)
    assert r.status_code == 400, r.text
    assert "grammar trigger" in r.json()["error"]["message"]
    assert health_ok(url)
    # and the server still answers a normal request
    assert completion(url, {"prompt": "hello", "n_predict": 2}).status_code == 200


@pytest.mark.parametrize("trigger,words", MALFORMED_TRIGGERS, ids=lambda v: str(v)[:40])
def test_a_malformed_trigger_is_a_400_naming_the_field(served, trigger, words):
    url = served[0]
    body = {"prompt": "hi", "grammar": 'root ::= "a"+', "grammar_lazy": True, "grammar_triggers": [trigger]}
    r = completion(url, body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "grammar_triggers" in message and words in message, message
    assert health_ok(url)


def test_valid_triggers_still_work(served):
    url = served[0]
    for trigger in ({"type": 1, "value": "a"}, {"type": 2, "value": "a+"}, {"type": 3, "value": ".*"}):
        body = {
            "prompt": "hi",
            "n_predict": 2,
            "grammar": 'root ::= "a"+',
            "grammar_lazy": True,
            "preserved_tokens": ["a"],
        }
        r = completion(url, {**body, "grammar_triggers": [trigger]})
        # accepted: what the grammar then does with the tiny model's tokens is not this test's
        # business (a pattern_full trigger can answer 500 "empty grammar stack"), the server stays up
        assert r.status_code != 400, (trigger, r.text)
        assert health_ok(url)


def test_an_unknown_chat_format_is_a_400_and_slots_keep_answering(served):
    # b11434 stored it, answered 500, and the next GET /slots ended the server (terminate)
    url = served[0]
    r = completion(url, {"prompt": "hi", "n_predict": 1, "chat_format": 99})
    assert r.status_code == 400 and "chat_format" in r.json()["error"]["message"], r.text
    assert httpx.get(url + "/slots", timeout=10, trust_env=False).status_code == 200
    assert health_ok(url)


@pytest.mark.parametrize("path,body", [("/detokenize", {"tokens": [1, 100000]}), ("/detokenize", {"tokens": [-5]}),
                                       ("/tokenize", {"content": ["a", 99999], "with_pieces": True})])  # fmt: skip
def test_token_ids_outside_the_vocabulary_are_a_400(served, path, body):
    url = served[0]
    r = httpx.post(url + path, json=body, timeout=10, trust_env=False)
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"], r.text
    assert health_ok(url)


@pytest.mark.parametrize(
    "window",
    [{"repeat_last_n": 2**31 - 1, "repeat_penalty": 1.1}, {"dry_penalty_last_n": 2**31 - 1, "dry_multiplier": 1.0}],
)
def test_a_huge_penalty_window_costs_no_memory(served, window):
    # b11434 sized the sampler's buffers by it: 8 GB (16 GB with DRY) for one request. The
    # server is killed by this test if it grows past 1 GiB, so the test fails and the machine lives.
    import threading

    import psutil

    url = served[0]
    pid = next(i.pid for i in instances.running() if i.base_url == url)
    proc, peak, done = psutil.Process(pid), [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            rss = proc.memory_info().rss
            peak[0] = max(peak[0], rss)
            if rss > 2**30:
                proc.kill()
                return
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    try:
        r = completion(url, {"prompt": "hi", "n_predict": 4, **window})
    finally:
        done.set()
    assert r.status_code == 200, r.text
    assert peak[0] < 2**30 and health_ok(url)
