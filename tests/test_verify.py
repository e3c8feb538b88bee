"""`bonsai verify` against a plain and a speculative llama-server, a server that is not
llama-server (a small OpenAI-compatible stand-in), and nothing at all."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bonsai_launch.server.process import free_port
from bonsai_launch.server.verify import verify
from start_helpers import bonsai, json_out, stop_all


@pytest.fixture
def cleanup():
    yield
    stop_all()


def detached(llama_server, model, *extra) -> dict:
    return json_out(
        bonsai(
            ["start", "--model", model, "--port", free_port(), "--ctx", "2048", *extra, "--detach", "--json"],
            server=llama_server,
        )
    )


@pytest.mark.server
@pytest.mark.slow
def test_verify_plain_server(llama_server, tiny_pair, cleanup):
    srv = detached(llama_server, tiny_pair["target"])
    report = json_out(bonsai(["verify", "--url", srv["url"], "--json"], server=llama_server))
    assert report["ok"] and report["healthy"] and report["server"] == "llama-server"
    assert report["model"] and report["tokens"] > 0 and report["decode_tps"] > 0
    assert report["speculative"] is False and report["slots_speculative"] is False

    strict = bonsai(["verify", "--url", srv["url"] + "/v1", "--expect-speculative"], server=llama_server)
    assert strict.returncode == 1
    assert "speculative decoding is not live" in strict.stdout


@pytest.mark.server
@pytest.mark.slow
def test_verify_speculative_server(llama_server, tiny_pair, cleanup):
    srv = detached(llama_server, tiny_pair["target"], "--drafter", tiny_pair["drafter"], "--speculative")
    # No --url: the only server bonsai runs is the one checked.
    done = bonsai(["verify", "--expect-speculative"], server=llama_server)
    assert done.returncode == 0, done.stdout
    assert srv["url"] in done.stdout
    assert "live: drafted" in done.stdout
    report = json_out(bonsai(["verify", "--url", srv["url"], "--json", "--expect-speculative"], server=llama_server))
    assert report["speculative"] and report["drafted"] > 0
    assert report["slots_speculative"] is True
    assert 0.0 <= report["acceptance"] <= 1.0


def test_verify_nothing_listening():
    port = free_port()
    done = bonsai(["verify", "--url", f"http://127.0.0.1:{port}"])
    assert done.returncode == 1
    assert f"cannot reach http://127.0.0.1:{port}/health" in done.stdout


class _OpenAIStandIn(BaseHTTPRequestHandler):
    """Just enough of an OpenAI-compatible server: no /health, no timings, no draft counts."""

    def log_message(self, *args):  # keep test output quiet
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "stand-in-model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/v1/chat/completions":
            self._json(
                200,
                {
                    "choices": [{"message": {"role": "assistant", "content": "a b c"}, "finish_reason": "length"}],
                    "usage": {"completion_tokens": 3, "prompt_tokens": 5},
                },
            )
        else:
            self._json(404, {"error": "not found"})


@pytest.fixture
def stand_in():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _OpenAIStandIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_verify_other_openai_server(stand_in):
    report = verify(stand_in)
    assert report.ok and report.server == "openai-compatible"
    assert report.model == "stand-in-model" and report.tokens == 3
    assert report.speculative is None

    strict = verify(stand_in, expect_speculative=True)
    assert not strict.ok
    assert "cannot be checked" in strict.problems[0]
