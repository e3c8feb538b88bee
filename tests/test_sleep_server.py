"""Idle sleep (BONSAI_SLEEP_IDLE_SECONDS -> llama-server's --sleep-idle-seconds), against the real
binary on the suite's tiny target and DSpark drafter.

A detached server with a 1 s idle window goes asleep (its log says so, /props' is_sleeping and
`bonsai ps` too); a sleeping server is not a dead one: the restart keeper leaves it alone (same
pid, no restart counted), and `bonsai verify --expect-speculative` wakes it and proves drafting
live again on the first request after the wake. Then it falls asleep again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bonsai_launch.server import client
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, json_out, stop_all, with_pair

pytestmark = pytest.mark.server

ASLEEP_S = 60  # a bound that only stops a hang: a 1 s window falls asleep in about 1 s


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def wait_asleep(url: str, log: Path, count: int, timeout: float = ASLEEP_S) -> None:
    """Until /props says asleep and the log has `count` entries into sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entered = log.read_text(errors="replace").count("server is entering sleeping state")
        if entered >= count and client.sleeping(url) is True:
            return
        time.sleep(0.2)
    raise AssertionError(f"not asleep within {timeout} s; log tail:\n{log.read_text(errors='replace')[-2000:]}")


def ps_entry(server: Path, name: str) -> dict:
    return next(p for p in json_out(bonsai(["ps", "--json"], server=server)) if p["name"] == name)


@pytest.mark.slow
def test_sleeping_server_is_shown_asleep_not_restarted_and_wakes_speculating(llama_server, tiny_pair):
    env = bonsai_env(llama_server, BONSAI_SLEEP_IDLE_SECONDS="1")
    args = ["start", *with_pair(tiny_pair), "--port", str(free_port()), "--ctx", "1024", "--detach", "--json"]
    done = bonsai(args, env=env)
    assert done.returncode == 0, done.stderr
    data = json_out(done)
    assert data["speculative"]["live"], data
    name, pid, url, log = data["name"], data["pid"], data["url"], Path(data["log"])
    assert "--sleep-idle-seconds 1" in " ".join(ps_entry(llama_server, name)["argv"])

    wait_asleep(url, log, 1)
    entry = ps_entry(llama_server, name)
    assert entry["sleeping"] is True and entry["state"] == "running"
    assert entry["pid"] == pid and entry["restarts"] == 0  # the keeper did not take it for dead
    table = bonsai(["ps"], server=llama_server).stdout
    assert "SLEEP" in table and "asleep" in table
    assert client.sleeping(url) is True  # looking (/props, ps) never woke it

    # The first request after the sleep: answered, and speculation drafts on the woken server.
    verified = bonsai(["verify", "--url", url, "--expect-speculative", "--json"], server=llama_server)
    report = json_out(verified)
    assert verified.returncode == 0, (report, verified.stderr)
    assert report["woke"] is True and report["speculative"] is True and report["drafted"] > 0
    assert report["tokens"] > 0
    assert "server is exiting sleeping state" in log.read_text(errors="replace")

    # Asleep again after the next idle second, still the same process, never restarted.
    wait_asleep(url, log, 2)
    entry = ps_entry(llama_server, name)
    assert entry["pid"] == pid and entry["restarts"] == 0 and entry["last_exit"] is None


@pytest.mark.slow
def test_fleet_probe_of_a_sleeping_member_does_not_wake_it(llama_server, tiny_pair):
    """`fleet ps` probes each member every time it is run; /slots would wake a sleeping one (its
    model loaded again for nothing). The probe reads /props first and skips /slots while asleep."""
    from bonsai_launch.fleet import probe

    env = bonsai_env(llama_server, BONSAI_SLEEP_IDLE_SECONDS="1")
    args = ["start", *with_pair(tiny_pair), "--port", str(free_port()), "--ctx", "1024", "--detach", "--json"]
    done = bonsai(args, env=env)
    assert done.returncode == 0, done.stderr
    data = json_out(done)
    url, log = data["url"], Path(data["log"])

    wait_asleep(url, log, 1)
    for _ in range(3):
        member = probe.probe(url, None)
        assert member.healthy and member.asleep and member.in_flight == 0, member
    assert client.sleeping(url) is True
    assert "server is exiting sleeping state" not in log.read_text(errors="replace")

    # Awake (a request woke it): the probe reads /slots again.
    client.slots(url)  # /slots wakes it, which is what the probe must not do while asleep
    awake = probe.probe(url, None)
    assert awake.healthy and not awake.asleep and awake.in_flight == 0, awake
    assert "server is exiting sleeping state" in log.read_text(errors="replace")
