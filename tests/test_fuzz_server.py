"""A short, seeded fuzz run of llama-server's HTTP API as `bonsai start --detach` launches it
(tests/support/http_fuzz.py; benchmarks/fuzz_server.py is the long run).

Every request gets a status code, no request kills the server (bonsai's restart would bring it
back: the fuzzer counts a changed pid as a crash), and /health is 200 at the end. The corpus
opens with the requests that aborted b11434 (vendor/llama.cpp/patches/0003-*), so this fails on
a build without that patch, whatever the random part finds.
"""

from __future__ import annotations

import pytest

import http_fuzz
from bonsai_launch.server.process import free_port
from start_helpers import stop_all

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


@pytest.mark.parametrize("seed", [1])
@pytest.mark.slow
def test_no_request_kills_the_server(llama_server, tiny_pair, monkeypatch, seed):
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(llama_server))
    target = http_fuzz.BonsaiTarget(tiny_pair["target"], free_port())
    target.start()
    try:
        report = http_fuzz.run(target, seed=seed, requests=200, seconds=30, vocab=512, request_timeout=30)
        assert report.sent >= 50, report.to_json()  # the run really ran
        assert report.crashes == [], report.to_json()
        assert report.no_status == [], report.to_json()
        assert sum(report.statuses.values()) == report.sent
        assert any(400 <= code < 500 for code in report.statuses) and 200 in report.statuses
        assert http_fuzz.healthy(target.base_url, {}, wait_s=5)
        assert target.starts == 1
    finally:
        target.stop()
