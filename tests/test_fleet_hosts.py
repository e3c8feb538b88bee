"""The fleet across network hosts: members in their own network namespaces (tests/support/
netns_hosts.py), each a `bonsai start --profile demo` bound to its namespace address with an API
key, and the LiteLLM proxy from `bonsai fleet up --hosts FILE` in the root namespace.

Each fault runs under a bounded, seeded client loop (REQUESTS requests, CONCURRENCY at a time,
short answers); the assertion is that no request is lost while the other member is healthy.
Latency during the fault and the times until the member is out of and back in the proxy's pool
are measured and printed (`-s` shows them; docs/serving-a-team.md has a run's figures); they
are bounded only generously, never timed.

Members run as a user's do, with the restart keeper (BONSAI_RESTART on): a SIGKILLed server
comes back by itself under a new pid, and that recovery is what the SIGKILL fault measures.
None of the faults needs the keeper off: SIGSTOP is not an exit (the keeper waits for its
server's exit, and a stopped child does not report one), a link down or slow touches no
process, and the member with another key is restarted as its operator would (`bonsai stop`,
which ends the keeper first, then `bonsai start`). A member that dies and stays dead (its
machine off) looks to the proxy like the link-down fault: no answer, no connection.

A named lane (`python -m pytest -q -m hosts`, tests/conftest.py): .ci/run runs it as root.
Skipped, with the reason, only where namespaces cannot be made (not root, no `ip`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

import real_parts
from bonsai_launch.fleet import health
from netns_hosts import Host, Hosts, why_no_namespaces
from start_helpers import ROOT, bonsai, gone
from tiny_gguf import free_port

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.hosts]

REQUESTS, CONCURRENCY = 120, 4
FAULT_AT, HEAL_AT = 20, 80  # answers counted when the fault starts and when it is healed
MEMBER_TIMEOUT_S = 20  # the fleet file's per-member timeout: how long a hung member holds a request
POOL_WAIT_S = 240  # generous: a loaded 2-core machine


@dataclass
class Fleet:
    hosts: Hosts
    members: list[Host]
    env: dict[str, str]
    url: str
    key: str
    hosts_file: str


def member_key_env(host: Host) -> str:
    return f"BNSI_KEY_{host.index}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, demo_gguf):
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    real_parts.require_litellm()
    server, problem = real_parts.find_real_server()
    if problem or server is None:
        real_parts.missing(problem or "no llama-server", "run `bonsai build`")
    tmp = tmp_path_factory.mktemp("hosts")
    hosts = Hosts(server, demo_gguf, tmp)
    env: dict[str, str] = {}
    try:
        members = hosts.make(2)
        for i, host in enumerate(members):
            hosts.start(host, f"member-key-{i}-{os.getpid()}")
        home = tmp / "proxy-home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")}
        env.update({"BONSAI_HOME": str(home), "BONSAI_LLAMA_SERVER": str(server)})
        env.update({member_key_env(h): h.key for h in members})
        hosts_file = tmp / "fleet.yaml"
        lines = ["members:"]
        for h in members:
            lines += [
                f"- name: host{h.index}",
                f"  url: {h.url}",
                f"  api_key_env: {member_key_env(h)}",
                f"  timeout: {MEMBER_TIMEOUT_S}",
            ]
        hosts_file.write_text("\n".join(lines) + "\n")
        port = free_port()
        up = bonsai(
            ["fleet", "up", "--profile", "demo", "--replicas", "0", "--hosts", hosts_file, "--port", port, "--json"],
            env=env,
            timeout=400,
        )
        assert up.returncode == 0, up.stderr
        data = json.loads(up.stdout)
        assert [m["name"] for m in data["members"]] == ["host0", "host1"] and not data["excluded"]
        yield Fleet(hosts, members, env, data["url"], data["api_key"], str(hosts_file))
    finally:
        left: list[str] = []
        if env:
            down = bonsai(["fleet", "down"], env=env, timeout=120)
            if down.returncode != 0:
                left.append(f"`bonsai fleet down`: exit {down.returncode}: {down.stderr.strip()[-500:]}")
        left += hosts.close()  # the members stopped with `bonsai stop`, then the namespaces emptied
        assert not left, f"left behind: {left}"


# -- the proxy's view of a member --------------------------------------------------------------------


def proxy_verdicts(fleet: Fleet) -> dict[str, bool]:
    """member name -> healthy, from the proxy's cached background health checks: the same reading
    `bonsai fleet ps` makes (empty while the proxy cannot be asked)."""
    return {name: v.healthy for name, v in (health.proxy_verdicts(fleet.url, fleet.key) or {}).items()}


@dataclass
class PoolWatch:
    """Polls the proxy's view of one member; records when it left and rejoined the pool."""

    fleet: Fleet
    name: str
    out_at: float | None = None
    in_at: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            healthy = proxy_verdicts(self.fleet).get(self.name)
            now = time.monotonic()
            if healthy is False and self.out_at is None:
                self.out_at = now
            if healthy is True and self.out_at is not None and self.in_at is None:
                self.in_at = now
            time.sleep(0.5)


# -- the load ---------------------------------------------------------------------------------------


@dataclass
class Fault:
    """What a fault does to the victim and how it ends. `heal` runs after HEAL_AT answers; a
    fault that heals by itself (SIGKILL: the keeper restarts the server) has none, and its
    `start` records `back_at`, when the member answered its key again."""

    start: Callable[[], None]
    heal: Callable[[], None] | None
    back_at: float | None = None
    note: str = ""  # how it was made, where that varies (the slow link's qdisc)


@dataclass
class Outcome:
    codes: list[tuple[int, str]]
    during_ms: list[float]  # latency of the requests that started while the fault was on
    fault_at: float
    heal_at: float | None  # the heal step, or when a self-healing member answered again
    took: float

    @property
    def lost(self) -> list[tuple[int, str]]:
        return [c for c in self.codes if c[0] != 200]


def load(fleet: Fleet, fault: Fault, seed: int) -> Outcome:
    rng = random.Random(seed)
    prompts = [f"Say the number {rng.randint(0, 9999)}." for _ in range(REQUESTS)]
    answered = 0
    lock = threading.Lock()
    marks: dict[str, float] = {}
    starts: list[tuple[float, float]] = []  # (start, latency)
    actions: list[threading.Thread] = []
    errors: list[BaseException] = []

    def act(name: str, fn: Callable[[], None]) -> None:
        # The heal follows the fault's own step, as an operator's would: a member restarted with
        # another key is started again with the old one only once that restart is done. (Under a
        # fast enough load the 60 answers between them come before it is: the heal's `bonsai
        # stop` then stopped the half-started member, and the fault's start failed.)
        before = list(actions)

        def run() -> None:
            try:
                for t in before:
                    t.join()
                marks[name] = time.monotonic()
                fn()
            except BaseException as exc:  # a fault that was not made must fail the test, not vanish
                errors.append(exc)

        t = threading.Thread(target=run)  # a restart takes seconds: the load goes on meanwhile
        t.start()
        actions.append(t)

    def one(i: int) -> tuple[int, str]:
        nonlocal answered
        t0 = time.monotonic()
        try:
            r = httpx.post(
                fleet.url + "/v1/chat/completions",
                timeout=180,
                trust_env=False,
                headers={"Authorization": f"Bearer {fleet.key}"},
                json={"model": "demo", "max_tokens": 6, "messages": [{"role": "user", "content": prompts[i]}]},
            )
            result = (r.status_code, "" if r.status_code == 200 else r.text[:300])
        except httpx.HTTPError as exc:
            result = (-1, repr(exc))
        with lock:
            starts.append((t0, (time.monotonic() - t0) * 1000))
            answered += 1
            if answered == FAULT_AT:
                act("fault", fault.start)
            if answered == HEAL_AT and fault.heal is not None:
                act("heal", fault.heal)
        return result

    t_start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        codes = list(pool.map(one, range(REQUESTS)))
    for t in actions:
        t.join(timeout=300)
    if errors:
        raise errors[0]
    assert all(not t.is_alive() for t in actions), "a fault or heal step still runs after 300 s"
    heal_at = marks.get("heal", fault.back_at)
    end = heal_at if heal_at is not None else float("inf")
    during = [ms for t0, ms in starts if marks["fault"] <= t0 < end]
    return Outcome(codes, during, marks["fault"], heal_at, time.monotonic() - t_start)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


FAULTS = ["sigkill", "sigstop", "link-down", "slow-link", "new-key"]


def make_fault(fleet: Fleet, kind: str) -> Fault:
    hosts, victim = fleet.hosts, fleet.members[1]
    key = victim.key
    if kind == "sigkill":  # the keeper brings it back: no heal step, `back_at` marks its return

        def crash() -> None:
            old = hosts.crash(victim)
            hosts.wait_restarted(victim, old)
            fault.back_at = time.monotonic()

        fault = Fault(crash, None)
        return fault
    if kind == "sigstop":
        return Fault(lambda: hosts.hang(victim), lambda: hosts.resume(victim))
    if kind == "link-down":
        return Fault(lambda: hosts.link(victim, False), lambda: hosts.link(victim, True))
    if kind == "slow-link":

        def shape() -> None:
            fault.note = hosts.slow(victim, True)  # netem, or tbf where the kernel lacks it

        def unshape() -> None:
            hosts.slow(victim, False)

        fault = Fault(shape, unshape)
        return fault

    def new_key() -> None:  # the operator restarts the member with another key
        hosts.stop(victim)
        hosts.start(victim, key + "-rotated")

    def old_key() -> None:  # ... and puts the fleet file's key back
        hosts.stop(victim)
        hosts.start(victim, key)

    return Fault(new_key, old_key)


@pytest.mark.parametrize("kind", FAULTS)
def test_no_request_lost_under_a_fault(fleet: Fleet, kind: str):
    victim = fleet.members[1]
    assert fleet.hosts.answers(victim) and fleet.hosts.answers(fleet.members[0])
    assert fleet.hosts.refresh(victim) is not None
    pid_before, keeper, restarts_before = victim.pid, victim.keeper, victim.restarts
    fault = make_fault(fleet, kind)
    watch = PoolWatch(fleet, f"host{victim.index}")
    watcher = threading.Thread(target=watch.run, daemon=True)
    watcher.start()
    try:
        out = load(fleet, fault, seed=FAULTS.index(kind))
        deadline = time.monotonic() + POOL_WAIT_S
        while watch.out_at is not None and watch.in_at is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        watch.stop.set()
        watcher.join(timeout=60)
    assert not out.lost, (kind, out.lost[:5], proxy_log_errors(fleet))
    if kind == "sigkill":  # the keeper restarted it: same keeper, a new server, one restart more
        assert fault.back_at is not None
        assert (victim.keeper, victim.restarts) == (keeper, restarts_before + 1) and victim.pid != pid_before
    # Pool times: "out" from the fault; "back in" from the heal step, and for SIGKILL, which
    # has none (the keeper restarts the server at once), from the kill too.
    back_from = out.fault_at if kind == "sigkill" else out.heal_at
    row = {
        "fault": kind,
        "requests": REQUESTS,
        "lost": len(out.lost),
        "during_p50_ms": round(pct(out.during_ms, 50)),
        "during_p95_ms": round(pct(out.during_ms, 95)),
        "during_max_ms": round(max(out.during_ms, default=float("nan"))),
        "out_of_pool_s": None if watch.out_at is None else round(watch.out_at - out.fault_at, 1),
        "back_in_pool_s": None if watch.in_at is None or back_from is None else round(watch.in_at - back_from, 1),
        "member_back_s": None if fault.back_at is None else round(fault.back_at - out.fault_at, 1),
        "load_s": round(out.took, 1),
    }
    if fault.note:
        row["made_with"] = fault.note
    print("FAULT-ROW " + json.dumps(row))
    rows = ROOT / ".pytest_cache" / "fault-rows.jsonl"
    rows.parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no .pytest_cache yet
    with open(rows, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    # The member is back in the pool before the next fault starts (bounded, generously).
    deadline = time.monotonic() + POOL_WAIT_S
    while proxy_verdicts(fleet).get(f"host{victim.index}") is not True:
        assert time.monotonic() < deadline, f"{kind}: host{victim.index} never rejoined the pool"
        time.sleep(1)


def proxy_log_errors(fleet: Fleet) -> list[str]:
    from pathlib import Path

    log = Path(fleet.env["BONSAI_HOME"]) / "logs" / "fleet-proxy.log"
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines if "ERROR" in line or "Exception" in line][-10:]


def test_members_are_separate_hosts(fleet: Fleet):
    """The harness itself: each member listens on its namespace address only, wants its key,
    and the proxy reaches both through their links."""
    for host in fleet.members:
        assert fleet.hosts.answers(host) and not fleet.hosts.answers(host, key="wrong")
        assert fleet.hosts.refresh(host) is not None
        assert host.pid is not None and not gone(host.pid, timeout=0.1)
        assert host.keeper is not None and not gone(host.keeper, timeout=0.1)  # BONSAI_RESTART on
    r = httpx.post(
        fleet.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {fleet.key}"},
        json={"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
        timeout=120,
        trust_env=False,
    )
    assert r.status_code == 200, r.text


def wait_verdict(fleet: Fleet, name: str, healthy: bool) -> None:
    deadline = time.monotonic() + POOL_WAIT_S
    while proxy_verdicts(fleet).get(name) is not healthy:
        assert time.monotonic() < deadline, f"the proxy never saw {name} as healthy={healthy}"
        time.sleep(1)


def remote_states(fleet: Fleet, with_key: bool = True) -> dict[str, dict]:
    env = {**fleet.env, "BONSAI_API_KEY": fleet.key} if with_key else fleet.env
    done = bonsai(["fleet", "ps", "--json"], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return {m["name"]: m for m in json.loads(done.stdout)["members"]}


def test_fleet_ps_and_up_show_what_the_proxy_sees(fleet: Fleet, tmp_path):
    """`fleet ps`: each remote member's state as the proxy sees it and its last error; a second
    `fleet up` with the same fleet file refuses a member that answers 401, one line, unless
    --allow-down."""
    hosts, victim = fleet.hosts, fleet.members[1]
    name, key = f"host{victim.index}", victim.key
    states = remote_states(fleet)
    assert [states[n]["state"] for n in ("host0", "host1")] == ["healthy", "healthy"]
    assert all(m["proxy_view"] for m in states.values())
    assert not remote_states(fleet, with_key=False)["host0"]["proxy_view"]  # without the key: direct looks only
    try:
        hosts.link(victim, False)
        wait_verdict(fleet, name, False)
        st = remote_states(fleet)[name]
        assert st["state"] == "unreachable" and st["last_error"], st
        hosts.link(victim, True)
        wait_verdict(fleet, name, True)
        assert remote_states(fleet)[name]["state"] == "healthy"

        hosts.stop(victim)
        hosts.start(victim, key + "-rotated")
        wait_verdict(fleet, name, False)
        st = remote_states(fleet)[name]
        assert st["state"] == "wrong key" and st["last_error"], st
        text = bonsai(["fleet", "ps"], env={**fleet.env, "BONSAI_API_KEY": fleet.key}, timeout=60).stdout
        assert "wrong key" in text and "last error" in text

        other = {**fleet.env, "BONSAI_HOME": str(tmp_path / "second")}
        args = [
            "fleet",
            "up",
            "--profile",
            "demo",
            "--replicas",
            "0",
            "--hosts",
            fleet.hosts_file,
            "--remote-wait",
            "5",
        ]
        refused = bonsai([*args, "--port", free_port()], env=other, timeout=300)
        assert refused.returncode != 0
        lines = [line.strip() for line in refused.stderr.splitlines() if line.strip().startswith(f"{name} (")]
        assert len(lines) == 1 and "401" in lines[0] and member_key_env(victim) in lines[0], refused.stderr
        assert "host0 (" not in refused.stderr.split("not usable", 1)[1]
        allowed = bonsai([*args, "--port", free_port(), "--allow-down", "--json"], env=other, timeout=400)
        try:
            assert allowed.returncode == 0, allowed.stderr
            data = json.loads(allowed.stdout)
            assert [m["name"] for m in data["members"]] == ["host0"] and [e["name"] for e in data["excluded"]] == [name]
        finally:
            bonsai(["fleet", "down"], env=other, timeout=120)
    finally:
        hosts.link(victim, True)
        if not hosts.answers(victim, key):
            hosts.stop(victim)
            hosts.start(victim, key)
        wait_verdict(fleet, name, True)
