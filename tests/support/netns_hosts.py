"""Member hosts for fleet tests: each a Linux network namespace joined to the root one by a veth
pair, running `bonsai start --profile demo` bound to its own address with an API key.

Traffic stays on this machine: every host gets a /30 of 10.231.0.0/16 (a private range); the
root namespace gets a route to that /30 only, the namespaces get no default route, so nothing
can leave. Names carry a unique prefix (`bnsi-<pid>-`) so runs never collide, and `close()`
removes every namespace, veth and process it made, whatever happened before (call it from a
fixture finalizer).

The faults a network really has are made here: SIGKILL, SIGSTOP/SIGCONT (a hung server: the
kernel still accepts connections, nothing answers), the member's link down and up, a slow link
(`tc netem` where the kernel has it; a `tbf` rate limit otherwise, which this machine's kernel
has), and a restart with a different key.
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
    pid: int | None = None
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

    def start(self, host: Host, key: str, wait_s: float = 180) -> None:
        """`bonsai start --profile demo --detach` inside the host's namespace, on its address,
        with the opt-in to a non-loopback bind and `key`; returns once /v1/models answers 200."""
        host.key = key
        env = {
            **os.environ,
            "BONSAI_HOME": str(host.home),
            "BONSAI_LLAMA_SERVER": str(self.llama_server),
            "BONSAI_ALLOW_REMOTE": "1",
            "BONSAI_API_KEY": key,
            "BONSAI_HOST": host.addr,
        }
        argv = ["ip", "netns", "exec", host.ns, sys.executable, "-m", "bonsai_launch", "start", "--profile", "demo"]
        # One thread each: members share this machine's cores with the proxy and the client.
        argv += ["--ctx", "2048", "--port", str(PORT), "--detach", "--", "--threads", "1", "--threads-batch", "1"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=wait_s, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"member {host.ns} did not start: exit {done.returncode}\n{done.stderr[-2000:]}")
        ps = subprocess.run(
            [sys.executable, "-m", "bonsai_launch", "ps", "--json"], env=env, capture_output=True, text=True, cwd=ROOT
        )
        host.pid = next(i["pid"] for i in json.loads(ps.stdout) if i["port"] == PORT)
        deadline = time.monotonic() + wait_s
        while not self.answers(host):
            if time.monotonic() > deadline:
                raise RuntimeError(f"member {host.ns} never answered /v1/models with its key")
            time.sleep(0.5)

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

    def kill(self, host: Host) -> None:
        if host.pid is not None:
            try:
                os.kill(host.pid, signal.SIGCONT)  # a stopped process dies only once continued
                os.kill(host.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            gone(host.pid, timeout=15)
            host.pid = None

    def hang(self, host: Host) -> None:
        assert host.pid is not None
        os.kill(host.pid, signal.SIGSTOP)

    def resume(self, host: Host) -> None:
        assert host.pid is not None
        os.kill(host.pid, signal.SIGCONT)

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

    def close(self) -> list[str]:
        """Remove every process, namespace and veth this run made; what could not be removed."""
        problems: list[str] = []
        for host in self.hosts:
            try:
                self.kill(host)
            except Exception as exc:  # keep going: the namespaces must go whatever happened
                problems.append(f"{host.ns}: {exc}")
            # Anything still running inside the namespace (a member started by hand, a leftover).
            pids = sh("ip", "netns", "pids", host.ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "link", "del", host.veth_root, check=False)  # removes its peer too
            sh("ip", "netns", "del", host.ns, check=False)
        left = [line for line in sh("ip", "netns", "list", check=False).stdout.splitlines() if self.prefix in line]
        links = [
            line for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines() if self.prefix in line
        ]
        return problems + left + links
