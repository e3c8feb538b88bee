"""The restart keeper watches whether speculation still pays on the work its server gets
(server/watch.py), from the real llama-server's own /metrics counters, and `bonsai ps` says so.

The workload change is forced without any timing: a target that always answers token 7 and a
DSpark drafter that always drafts 7. Plain requests keep every draft (the verdict is "paying");
requests that ban token 7 (`logit_bias`) make the target answer something else, so every draft
is rejected (the verdict turns "below plain" after BONSAI_WATCH_WINDOWS windows). The counters
are the server's, so the flip cannot come from how busy the machine is.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

import tiny_gguf
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, json_out, stop_all

pytestmark = pytest.mark.server

WATCH_ENV = {"BONSAI_WATCH_SECONDS": "1", "BONSAI_WATCH_WINDOW_TOKENS": "32", "BONSAI_WATCH_WINDOWS": "2"}


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


@pytest.fixture(scope="module")
def const_pair(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("watch_pair")
    return {
        "target": tiny_gguf.write_target(d / "t.gguf", constant_token=7),
        "drafter": tiny_gguf.write_dspark_drafter(d / "d.gguf", block_size=4, constant_token=7),
    }


def ps_entry(server: Path, name: str) -> dict:
    return next(p for p in json_out(bonsai(["ps", "--json"], server=server)) if p["name"] == name)


def drive_until(server: Path, name: str, url: str, status: str, **request: object) -> dict:
    """Send completions until `bonsai ps --json` shows the watch verdict `status` (bounded: a hang)."""
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=60, trust_env=False) as http:
        while time.monotonic() < deadline:
            r = http.post(url + "/completion", json={"prompt": "hello world", "n_predict": 48, **request})
            assert r.status_code == 200, r.text
            watch = ps_entry(server, name).get("watch") or {}
            if watch.get("status") == status:
                return watch
    raise AssertionError(f"the watch never said {status!r}: {ps_entry(server, name).get('watch')}")


@pytest.mark.slow
def test_a_workload_change_flips_the_watch_verdict_in_ps(llama_server, const_pair):
    env = bonsai_env(llama_server, **WATCH_ENV)
    args = ["--model", const_pair["target"], "--drafter", const_pair["drafter"], "--speculative"]
    data = json_out(bonsai(["start", *args, "--port", free_port(), "--ctx", "1024", "--detach", "--json"], env=env))
    assert data["speculative"]["live"], data
    name, url = data["name"], data["url"].rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]

    paying = drive_until(llama_server, name, url, "paying")
    assert paying["last"]["acceptance"] >= 0.9, paying  # the target keeps what the drafter guessed
    assert paying["bounds"]["window_tokens"] == 32 and paying["bounds"]["windows"] == 2

    # The work changes: token 7 is banned, so every drafted 7 is rejected by the target.
    below = drive_until(llama_server, name, url, "below plain", logit_bias=[[7, False]])
    assert below["last"]["acceptance"] < 0.2 and below["last"]["drafted"] >= 32, below
    assert "2 windows in a row" in below["why"]
    table = bonsai(["ps"], server=llama_server).stdout
    assert "SPEC WATCH" in table and "below plain" in table, table
    log = Path(data["log"]).read_text()
    assert "is below plain on this server's work" in log and "keeps running" in log
    # Never restarted for it: the same server still serves.
    assert ps_entry(llama_server, name)["pid"] == data["pid"]
