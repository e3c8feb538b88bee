"""Member hosts for fleet tests: each a Linux network namespace joined to the root one by a veth
pair, running `bonsai start --profile demo` bound to its own address with an API key.

Traffic stays on this machine: every host gets a /30 of 10.231.0.0/16 (a private range); the
root namespace gets a route to that /30 only, the namespaces get no default route, so nothing
can leave. Names carry a unique prefix (`bnsi-<pid>-`) so runs never collide, and `close()`
removes every namespace, veth and process it made, whatever happened before (call it from a
fixture finalizer).

The faults a network really has are made here: SIGKILL of the member's llama-server (its
keeper, `bonsai start --detach`'s supervisor, starts it again under a new pid: BONSAI_RESTART is
on, as for a user), SIGSTOP/SIGCONT (a hung server: the kernel still accepts connections, nothing
answers), the member's link down and up, a slow link (`tc netem` where the kernel has it; a `tbf`
rate limit otherwise, which this machine's kernel has), and a restart with a different key.

Members are stopped as a user stops them: `bonsai stop --all` on that host (its namespace and
BONSAI_HOME), which ends the keeper first so that nothing restarts. Pids are never kept as
facts: the keeper changes the server's pid, so each action reads the current one from `bonsai
ps --json` first. `close()` then makes sure: whatever still runs inside a namespace is frozen
(SIGSTOP: no keeper can spawn a new server meanwhile) and killed, until the namespace is empty,
and is reported, as is any server or keeper pid ever seen that still runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from start_helpers import ROOT, gone

PORT = 8080  # every member listens on its own address, so all can use the same port


def why_no_namespaces() -> str | None:
    """None where this process can make network namespaces; else the reason (a skip reason)."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making network namespaces needs root (run the `hosts` tests as root, e.g. in CI's container)"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    probe = f"bnsi-{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    index: int
    ns: str
    veth_root: str
    veth_ns: str
    root_addr: str
    addr: str
    home: Path
    key: str
    pid: int | None = None  # its llama-server as `bonsai ps` last showed it (a restart changes it)
    keeper: int | None = None  # the process that restarts it (the instance's supervisor)
    restarts: int = 0  # `bonsai ps`'s RESTARTS: how often the keeper brought it back
    seen: set[int] = field(default_factory=set)  # every server and keeper pid it had: all must end
    shaped: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{PORT}"


@dataclass
class Hosts:
    """Up to 60 hosts per run; `make(n)` then `start(host, key)` for each."""

    llama_server: Path
    model: Path  # the demo GGUF, linked into each member's BONSAI_HOME
    tmp: Path
    prefix: str = field(default_factory=lambda: f"bnsi-{os.getpid()}-")
    hosts: list[Host] = field(default_factory=list)
    netem: bool | None = None

    def make(self, n: int) -> list[Host]:
        third = 32 + os.getpid() % 200  # 10.231.<third>.0/24, one /30 per host
        for i in range(len(self.hosts), len(self.hosts) + n):
            ns = f"{self.prefix}h{i}"
            host = Host(
                i,
                ns,
                f"{self.prefix}r{i}",
                f"{self.prefix}n{i}",
                f"10.231.{third}.{4 * i + 1}",
                f"10.231.{third}.{4 * i + 2}",
                self.tmp / f"host{i}",
                "",
            )
            self.hosts.append(host)  # before it exists: close() removes whatever was made
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host.veth_root, "type", "veth", "peer", "name", host.veth_ns)
            sh("ip", "link", "set", host.veth_ns, "netns", ns)
            sh("ip", "addr", "add", f"{host.root_addr}/30", "dev", host.veth_root)
            sh("ip", "link", "set", host.veth_root, "up")
            sh("ip", "-n", ns, "addr", "add", f"{host.addr}/30", "dev", host.veth_ns)
            sh("ip", "-n", ns, "link", "set", host.veth_ns, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            models = host.home / "models" / "demo"
            models.mkdir(parents=True)
            os.symlink(self.model, models / self.model.name)
        return self.hosts[-n:]

    # -- the member's server ------------------------------------------------------------------

    def env(self, host: Host) -> dict[str, str]:
        """The member host's environment: its own BONSAI_HOME, address and key. No BONSAI_*
        variable from outside (a module fixture runs before the per-test isolation), and
        BONSAI_RESTART=1 said outright: every fault runs with the keeper, as a user's member
        does (tests/test_fleet_hosts.py says why none needs it off)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")}
        env.update(
            {
                "BONSAI_HOME": str(host.home),
                "BONSAI_LLAMA_SERVER": str(self.llama_server),
                "BONSAI_ALLOW_REMOTE": "1",
                "BONSAI_API_KEY": host.key,
                "BONSAI_HOST": host.addr,
                "BONSAI_RESTART": "1",
            }
        )
        return env

    def bonsai(self, host: Host, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """`bonsai ARGS` on the member host: inside its namespace, with its environment."""
        argv = ["ip", "netns", "exec", host.ns, sys.executable, "-m", "bonsai_launch", *args]
        return subprocess.run(
            argv,
            env=self.env(host),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )

    def start(self, host: Host, key: str, wait_s: float = 180) -> None:
        """`bonsai start --profile demo --detach` inside the host's namespace, on its address,
        with the opt-in to a non-loopback bind and `key`; returns once /v1/models answers 200."""
        host.key = key
        # One thread each: members share this machine's cores with the proxy and the client.
        args = ["start", "--profile", "demo", "--ctx", "2048", "--port", str(PORT), "--detach"]
        done = self.bonsai(host, *args, "--", "--threads", "1", "--threads-batch", "1", timeout=wait_s)
        if done.returncode != 0:
            raise RuntimeError(f"member {host.ns} did not start: exit {done.returncode}\n{done.stderr[-2000:]}")
        if self.refresh(host) is None:
            raise RuntimeError(f"member {host.ns} started, but `bonsai ps` does not list it")
        deadline = time.monotonic() + wait_s
        while not self.answers(host):
            if time.monotonic() > deadline:
                raise RuntimeError(f"member {host.ns} never answered /v1/models with its key")
            time.sleep(0.5)

    def refresh(self, host: Host) -> dict | None:
        """The member's server as `bonsai ps --json` on its host shows it now (None: not
        running); sets host.pid, host.keeper and host.restarts from it."""
        done = self.bonsai(host, "ps", "--json")
        if done.returncode != 0:
            raise RuntimeError(f"`bonsai ps` on {host.ns}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
        inst = next((i for i in json.loads(done.stdout) if i["port"] == PORT), None)
        host.pid = inst["pid"] if inst else None
        host.keeper = inst.get("supervisor_pid") if inst else None
        host.restarts = int(inst.get("restarts") or 0) if inst else 0
        host.seen.update(p for p in (host.pid, host.keeper) if p)
        return inst

    def stop(self, host: Host) -> None:
        """`bonsai stop --all` on the member host, as its operator would: the keeper is asked to
        stop first, so the server is stopped on purpose and not restarted."""
        if host.pid is not None:
            self._signal(host.pid, signal.SIGCONT)  # a frozen server takes its SIGTERM at once
        done = self.bonsai(host, "stop", "--all", timeout=90)
        if done.returncode != 0:
            raise RuntimeError(
                f"`bonsai stop --all` on {host.ns}: exit {done.returncode}: {done.stderr.strip()[-500:]}"
            )
        for pid in (host.pid, host.keeper):
            if pid is not None and not gone(pid, timeout=15):
                raise RuntimeError(f"{host.ns}: pid {pid} still runs after `bonsai stop --all`")
        host.pid = host.keeper = None

    def crash(self, host: Host) -> int:
        """SIGKILL to the member's llama-server only (as the out-of-memory killer picks it): its
        keeper stays and starts it again. Returns the killed pid."""
        if self.refresh(host) is None or host.pid is None:
            raise RuntimeError(f"{host.ns}: no server to kill")
        pid = host.pid
        self._signal(pid, signal.SIGKILL)
        if not gone(pid, timeout=15):
            raise RuntimeError(f"{host.ns}: pid {pid} survived SIGKILL")
        return pid

    def wait_restarted(self, host: Host, old_pid: int, wait_s: float = 180) -> None:
        """Until the keeper's new server (another pid, state running) answers its key."""
        deadline = time.monotonic() + wait_s
        while True:
            inst = self.refresh(host)
            if inst and host.pid != old_pid and inst.get("state") == "running" and self.answers(host):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.ns}: the keeper did not bring the server back within {wait_s:.0f} s: {inst}")
            time.sleep(0.25)

    def answers(self, host: Host, key: str | None = None) -> bool:
        try:
            r = httpx.get(
                host.url + "/v1/models",
                headers={"Authorization": f"Bearer {key or host.key}"},
                timeout=5,
                trust_env=False,
            )
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def hang(self, host: Host) -> None:
        if self.refresh(host) is None or host.pid is None:
            raise RuntimeError(f"{host.ns}: no server to freeze")
        self._signal(host.pid, signal.SIGSTOP)

    def resume(self, host: Host) -> None:
        if host.pid is None:
            raise RuntimeError(f"{host.ns}: no frozen server to continue")
        self._signal(host.pid, signal.SIGCONT)

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    # -- the member's link --------------------------------------------------------------------

    def link(self, host: Host, up: bool) -> None:
        """The member's side of its link: down, as a host whose cable or Wi-Fi drops."""
        sh("ip", "-n", host.ns, "link", "set", host.veth_ns, "up" if up else "down")

    def slow(self, host: Host, on: bool) -> str:
        """Added latency on the member's link, both directions' egress at its end. netem adds a
        fixed delay where the kernel has it; this machine's kernel lacks sch_netem (no modprobe
        in the container), so a tbf rate limit stands in: 8 kbit/s makes a ~1 kB answer take
        about a second more, a slow link rather than a fixed delay. Returns the kind used."""
        devices = [("ip", "netns", "exec", host.ns, "tc", host.veth_ns), ("tc", host.veth_root)]
        if not on:
            for *pre, tc, dev in devices:
                sh(*pre, tc, "qdisc", "del", "dev", dev, "root", check=False)
            host.shaped = False
            return "off"
        kind = "netem"
        for *pre, tc, dev in devices:
            if self.netem is not False:
                done = sh(*pre, tc, "qdisc", "add", "dev", dev, "root", "netem", "delay", "300ms", check=False)
                self.netem = done.returncode == 0
            if not self.netem:
                kind = "tbf"
                sh(
                    *pre,
                    tc,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    "8kbit",
                    "burst",
                    "1600",
                    "latency",
                    "5s",
                )
        host.shaped = True
        return kind

    # -- cleanup ------------------------------------------------------------------------------

    def reap(self, ns: str, wait_s: float = 20) -> list[str]:
        """Kill everything that runs inside namespace `ns`; what was found there. Each pass
        freezes them all before killing any, so that a keeper cannot start a new server between
        a listing and its own kill; passes repeat until the namespace is empty."""
        found: dict[int, str] = {}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
            if not pids:
                return list(found.values())
            for pid in pids:
                found.setdefault(pid, f"pid {pid}: {_cmdline(pid)}")
                self._signal(pid, signal.SIGSTOP)
            for pid in pids:
                self._signal(pid, signal.SIGKILL)
            for pid in pids:
                gone(pid, timeout=5)
        return [*found.values(), f"{ns} still not empty after {wait_s:.0f} s"]

    def close(self) -> list[str]:
        """Stop every member the way a user does, then remove every process, namespace and
        veth this run made, whatever happened before; returns what was left behind: anything
        `bonsai stop` did not end (killed here, but reported), and what could not be removed."""
        problems: list[str] = []
        for host in self.hosts:
            for step in (self.refresh, self.stop) if host.key else ():  # key: start() was called
                try:
                    step(host)
                except Exception as exc:  # keep going: the namespaces must go whatever happened
                    problems.append(f"{host.ns}: {exc}")
            problems += [f"{host.ns}: still running after `bonsai stop --all`: {p}" for p in self.reap(host.ns)]
            for pid in sorted(host.seen):  # e.g. a server that left the namespace's process list
                if not gone(pid, timeout=0.5):
                    problems.append(f"{host.ns}: pid {pid} still running: {_cmdline(pid)}")
                    self._signal(pid, signal.SIGKILL)
            sh("ip", "link", "del", host.veth_root, check=False)  # removes its peer too
            sh("ip", "netns", "del", host.ns, check=False)
        left = [line for line in sh("ip", "netns", "list", check=False).stdout.splitlines() if self.prefix in line]
        links = [
            line for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines() if self.prefix in line
        ]
        return problems + left + links


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "(gone)"
