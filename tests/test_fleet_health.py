"""Remote members' states without llama-server: a stub member that answers 200 or 401, a port
nothing listens on, the proxy's /health verdicts, and `fleet up` refusing a fleet file whose
members are unreachable or refuse their key (one line each) unless --allow-down."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest
import yaml

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.fleet import configs, health, hosts
from bonsai_launch.fleet.configs import Member
from start_helpers import bonsai


class _Stub(http.server.BaseHTTPRequestHandler):
    key = "right"

    def do_GET(self):
        ok = self.headers.get("Authorization") == f"Bearer {self.key}" or self.path == "/health"
        body = b'{"data": []}' if ok else b'{"error": "Invalid API Key"}'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_member():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reach_tells_wrong_key_from_unreachable(stub_member):
    assert health.reach(stub_member, "right").state == health.HEALTHY
    wrong = health.reach(stub_member, "old")
    assert wrong.state == health.WRONG_KEY and "401" in (wrong.error or "")
    down = health.reach(f"http://127.0.0.1:{closed_port()}", "right")
    assert down.state == health.UNREACHABLE and down.error
    # A wrong key is final: no waiting for it to change.
    assert health.wait_reach(stub_member, "old", wait_s=60).state == health.WRONG_KEY


@pytest.mark.parametrize(
    "verdict, direct, state",
    [
        (health.ProxyVerdict(True, None), health.Reach(health.HEALTHY), health.HEALTHY),
        (health.ProxyVerdict(False, "Connection error."), health.Reach(health.HEALTHY), health.COOLING),
        (health.ProxyVerdict(False, "Connection error."), health.Reach(health.UNREACHABLE, "x"), health.UNREACHABLE),
        (health.ProxyVerdict(False, "AuthenticationError"), health.Reach(health.WRONG_KEY, "401"), health.WRONG_KEY),
        (health.ProxyVerdict(True, None), health.Reach(health.WRONG_KEY, "401"), health.WRONG_KEY),
        (None, health.Reach(health.UNREACHABLE, "refused"), health.UNREACHABLE),
    ],
)
def test_member_state_is_the_proxys_verdict_refined_by_the_member(verdict, direct, state):
    got, error = health.member_state(verdict, direct)
    assert got == state
    assert (error is None) == (state == health.HEALTHY)


def test_short_error_keeps_the_first_line():
    assert health.short_error("litellm.APIConnectionError: Connection error.\nTraceback...") == (
        "litellm.APIConnectionError: Connection error."
    )
    assert health.short_error(None) is None


def test_fleet_file_timeout_and_the_proxys_check_timeout(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text("members:\n- {url: 'http://a:1', timeout: 30}\n- {url: 'http://b:1'}\n")
    a, b = hosts.parse_fleet_file(f)
    assert (a.timeout, b.timeout) == (30, None)
    f.write_text("members:\n- {url: 'http://a:1', timeout: 0}\n")
    with pytest.raises(BonsaiError, match="timeout=0 must be a number of seconds"):
        hosts.parse_fleet_file(f)
    config = configs.litellm_config(
        "demo", [Member("a", "http://a:1", False, timeout=30), Member("b", "http://b:1", False)]
    )
    assert [d["litellm_params"]["timeout"] for d in config["model_list"]] == [30, configs.REQUEST_TIMEOUT_S]
    assert {d["model_info"]["health_check_timeout"] for d in config["model_list"]} == {configs.HEALTH_CHECK_TIMEOUT_S}
    # A hung member must leave the pool sooner than LiteLLM's own 60 s check timeout would allow.
    assert configs.HEALTH_CHECK_INTERVAL_S + configs.HEALTH_CHECK_TIMEOUT_S < 60


def test_fleet_up_refuses_unusable_members_one_line_each(stub_member, tmp_path):
    dead = f"http://127.0.0.1:{closed_port()}"
    f = tmp_path / "fleet.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "members": [
                    {"name": "rotated", "url": stub_member, "api_key_env": "BNSI_OLD_KEY"},
                    {"name": "gone", "url": dead, "api_key_env": "BNSI_OLD_KEY"},
                ]
            }
        )
    )
    import os

    env = {**os.environ, "BNSI_OLD_KEY": "old"}
    done = bonsai(
        ["fleet", "up", "--profile", "demo", "--replicas", "0", "--hosts", f, "--remote-wait", "0", "--json"],
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip().startswith(("rotated", "gone"))]
    assert len(lines) == 2, done.stderr
    assert "401" in lines[0] and "BNSI_OLD_KEY" in lines[0]
    assert "unreachable" in lines[1] and dead in lines[1]
    assert "--allow-down" in done.stderr
    assert not json.loads(bonsai(["fleet", "ps", "--json"], env=env).stdout)["running"]


def test_hosts_harness_skips_only_without_namespaces(monkeypatch):
    import os
    import shutil
    import sys

    import netns_hosts

    monkeypatch.setattr(sys, "platform", "linux")  # the fast lane runs on macOS and Windows too
    monkeypatch.setattr(os, "geteuid", lambda: 1000, raising=False)
    assert "needs root" in (netns_hosts.why_no_namespaces() or "")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "iproute2" in (netns_hosts.why_no_namespaces() or "")
