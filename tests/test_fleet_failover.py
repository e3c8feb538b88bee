"""`bonsai fleet` end to end: the real LiteLLM proxy in front of real llama-servers (the demo
model), bounded in count and time.

One fleet lifecycle: up with 2 replicas and a remote member that never answers (reported, not
routed to); 40 requests, 4 at a time, with one replica SIGKILLed after about a third (restarts
off): every request answers 200; `fleet ps` shows the dead member; `fleet up` again brings it
back; `fleet down` leaves no llama-server or proxy process. With restarts on (the default), a killed replica
is brought back by its keeper and the proxy routes to it again.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from real_parts import require_litellm
from start_helpers import bonsai, gone, no_server_left, stop_all

pytestmark = [pytest.mark.server, pytest.mark.slow]

REQUESTS, CONCURRENCY, KILL_AFTER = 40, 4, 13
LOAD_DEADLINE_S = 300  # the whole load, on a busy 2-core machine; each request has its own timeout


@pytest.fixture
def litellm_proxy():
    require_litellm()


def free_port_run(n: int) -> int:
    """A port P with P..P+n-1 all free now (the proxy and its replicas)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def json_of(done) -> dict:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return json.loads(done.stdout)


def ask_proxy(url: str, key: str, content: str = "Hi", model: str = "demo", max_tokens: int = 4) -> httpx.Response:
    """One chat completion through the fleet's proxy, with its key."""
    return httpx.post(
        url + "/v1/chat/completions",
        timeout=120,
        trust_env=False,
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]},
    )


def load_with_a_kill(url: str, key: str, model: str, victim: int) -> tuple[list[tuple[int, str]], float]:
    """REQUESTS chat completions, CONCURRENCY at a time; SIGKILL `victim` after KILL_AFTER answers."""
    answered = 0
    lock = threading.Lock()
    killed = threading.Event()

    def one(i: int) -> tuple[int, str]:
        nonlocal answered
        r = ask_proxy(url, key, f"Say the number {i}.", model, max_tokens=8)
        with lock:
            answered += 1
            if answered >= KILL_AFTER and not killed.is_set():
                os.kill(victim, signal.SIGKILL)
                killed.set()
        return r.status_code, "" if r.status_code == 200 else r.text[:300]

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        codes = list(pool.map(one, range(REQUESTS), timeout=LOAD_DEADLINE_S))
    assert killed.is_set()
    return codes, time.monotonic() - started


def proxy_log_errors() -> list[str]:
    from bonsai_launch.core.paths import logs_dir

    try:
        lines = (logs_dir() / "fleet-proxy.log").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines if "ERROR" in line or "Exception" in line][-10:]


def test_fleet_survives_a_killed_replica_and_leaves_nothing(
    llama_server, demo_gguf, isolated_home, litellm_proxy, tmp_path
):
    folder = isolated_home / "models" / "demo"
    folder.mkdir(parents=True)
    os.symlink(demo_gguf, folder / demo_gguf.name)
    # Restarts off: this checks the proxy's failover and `fleet up` reviving a dead replica; with
    # them on, the replica's keeper brings it back by itself (the same detached path as
    # tests/test_restart_server.py::test_detached_server_killed_comes_back_proven_and_ps_says_so).
    env = {**os.environ, "BONSAI_LLAMA_SERVER": str(llama_server), "BONSAI_RESTART": "0"}
    port = free_port_run(3)
    dead_port = free_port_run(1)
    hosts = tmp_path / "fleet.yaml"
    hosts.write_text(f"members:\n- url: http://127.0.0.1:{dead_port}\n  name: never-up\n")
    proxy_pid = None
    try:
        up = json_of(
            bonsai(
                [
                    "fleet",
                    "up",
                    "--profile",
                    "demo",
                    "--replicas",
                    "2",
                    "--port",
                    port,
                    "--speculative",
                    "--ctx",
                    "4096",
                    "--hosts",
                    hosts,
                    "--remote-wait",
                    "2",
                    "--allow-down",
                    "--json",
                ],
                env=env,
                timeout=400,
            )
        )
        assert up["url"] == f"http://127.0.0.1:{port}" and up["model"] == "demo"
        assert up["api_key"].startswith("sk-") and up["key_source"] == "generated"
        members = {m["name"]: m for m in up["members"]}
        assert set(members) == {"replica-1", "replica-2"}
        assert all(m["speculative"]["live"] for m in members.values())  # proven on each, as `start` does
        assert [e["name"] for e in up["excluded"]] == ["never-up"]
        if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2:
            # CPU replicas do not fight over cores: each one's threads are held to its own.
            held = [
                {frozenset(os.sched_getaffinity(t.id)) for t in psutil.Process(members[n]["pid"]).threads()}
                for n in ("replica-1", "replica-2")
            ]
            assert all(len(h) == 1 for h in held) and not (next(iter(held[0])) & next(iter(held[1]))), held
        config_text = Path(up["config"]).read_text()
        config = yaml.safe_load(config_text)
        assert [d["litellm_params"]["api_base"] for d in config["model_list"]] == [
            f"http://127.0.0.1:{port + 1}/v1",
            f"http://127.0.0.1:{port + 2}/v1",
        ]  # the unhealthy one is not routed to
        assert up["api_key"] not in config_text
        from bonsai_launch.fleet.configs import llama_swap_problems

        swap = yaml.safe_load(Path(up["llama_swap"]).read_text())
        assert llama_swap_problems(swap) == [] and set(swap["models"]) == {"replica-1", "replica-2"}
        assert "never-up" not in swap.get("peers", {})
        proxy_pid = json_of(bonsai(["fleet", "ps", "--json"], env=env))["proxy"]["pid"]

        codes, took = load_with_a_kill(up["url"], up["api_key"], "demo", members["replica-2"]["pid"])
        failed = [c for c in codes if c[0] != 200]
        assert not failed, (failed, proxy_log_errors())
        assert took < LOAD_DEADLINE_S
        assert gone(members["replica-2"]["pid"])

        ps = json_of(bonsai(["fleet", "ps", "--json"], env=env))
        health = {m["name"]: m for m in ps["members"]}
        assert health["replica-2"]["health"] == "dead" and health["replica-2"]["alive"] is False
        assert health["replica-1"]["health"] == "ok" and health["replica-1"]["pid"] == members["replica-1"]["pid"]
        assert ps["proxy"]["alive"] is True

        again = json_of(bonsai(["fleet", "up", "--json"], env=env, timeout=300))
        assert again["restarted"] == ["replica-2"] and again["reused"] and again["api_key"] is None
        ps = json_of(bonsai(["fleet", "ps", "--json"], env=env))
        assert [m["health"] for m in ps["members"]] == ["ok", "ok"]
        revived = {m["name"]: m["pid"] for m in ps["members"]}["replica-2"]
        assert revived != members["replica-2"]["pid"]
        r = ask_proxy(up["url"], up["api_key"])
        assert r.status_code == 200

        # The latency measurement runs (its numbers are for a quiet window, not for this test).
        from bonsai_launch.fleet.latency import measure

        lat = measure(up["url"], up["api_key"], members["replica-1"]["url"], "demo", requests=2, warmup=1)
        assert len(lat.direct_ms) == len(lat.proxied_ms) == 2 and min(lat.direct_ms + lat.proxied_ms) > 0
        assert set(lat.to_json()) >= {"direct_median_ms", "proxied_median_ms", "added_median_ms"}

        down = bonsai(["fleet", "down"], env=env, timeout=120)
        assert down.returncode == 0, down.stderr
        assert gone(proxy_pid) and gone(members["replica-1"]["pid"]) and gone(revived)
        assert no_server_left(folder / demo_gguf.name)
        assert not [p for p in psutil.process_iter(["cmdline"]) if up["config"] in " ".join(p.info["cmdline"] or [])]
        assert json_of(bonsai(["fleet", "ps", "--json"], env=env))["members"] == []
    finally:
        bonsai(["fleet", "down"], env=env, timeout=120)
        stop_all()
        if proxy_pid is not None and not gone(proxy_pid, timeout=1):
            os.kill(proxy_pid, signal.SIGKILL)


def test_a_killed_replica_is_restarted_by_its_keeper(llama_server, demo_gguf, isolated_home, litellm_proxy):
    """Restarts on (the default): the replica comes back by itself on its port, `fleet ps` shows
    the new pid and the restart, and `fleet down` ends the keeper too."""
    from bonsai_launch.fleet.configs import COOLDOWN_S, HEALTH_CHECK_INTERVAL_S
    from bonsai_launch.server import instances

    folder = isolated_home / "models" / "demo"
    folder.mkdir(parents=True)
    os.symlink(demo_gguf, folder / demo_gguf.name)
    env = {**os.environ, "BONSAI_LLAMA_SERVER": str(llama_server)}
    port = free_port_run(2)
    try:
        up = json_of(
            bonsai(
                ["fleet", "up", "--profile", "demo", "--replicas", "1", "--port", port, "--ctx", "2048", "--json"],
                env=env,
                timeout=400,
            )
        )
        member = up["members"][0]
        keeper = next(i.supervisor_pid for i in instances.running() if i.name == member["instance"])
        assert keeper and psutil.pid_exists(keeper)
        os.kill(member["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ps = json_of(bonsai(["fleet", "ps", "--json"], env=env))["members"][0]
            if ps["health"] == "ok" and ps["pid"] != member["pid"]:
                break
            time.sleep(0.5)
        assert ps["health"] == "ok" and ps["pid"] != member["pid"], ps
        assert (
            ps["restarts"] == 1 and ps["last_exit"].startswith("was killed by signal 9") and ps["url"] == member["url"]
        )
        # The proxy routes to it again once its health check or cooldown lets it back in
        # (fleet/configs.py: HEALTH_CHECK_INTERVAL_S, COOLDOWN_S); until then it answers 429.
        deadline = time.monotonic() + COOLDOWN_S + 3 * HEALTH_CHECK_INTERVAL_S
        while True:
            r = ask_proxy(up["url"], up["api_key"])
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert r.status_code == 200, r.text
        assert bonsai(["fleet", "down"], env=env, timeout=120).returncode == 0
        assert gone(ps["pid"]) and gone(keeper)
        assert no_server_left(folder / demo_gguf.name)
    finally:
        bonsai(["fleet", "down"], env=env, timeout=120)
        stop_all()
