"""Idle sleep on the demo model (issue 37): the server's memory awake and asleep, and the time to
the first token of the request that wakes it, against the same request on an awake server.

Starts `bonsai start --profile demo --speculative --detach` with BONSAI_SLEEP_IDLE_SECONDS (default 3) and the
demo's own speculation (ngram-mod), then per round: a streamed chat request on the awake server
(time to first token, RSS after it), wait until /props says asleep (RSS asleep), the same request
again (time to first token through the wake, drafted tokens of that answer). RSS is llama-server's
resident set from psutil. Stops the server at the end.

    python benchmarks/sleep_idle.py --rounds 3 --json /var/tmp/bonsai-sleep.json

About a minute on 2 cores. Wall times on a shared machine are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import psutil

from bonsai_launch.server import client, liveness

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow, one a line."}]


def ttft(url: str) -> tuple[float, dict]:
    """Seconds to the first streamed piece, and the answer's timings."""
    result = client.StreamResult()
    started = time.monotonic()
    first = None
    for _piece in client.stream_chat(url, MESSAGES, max_tokens=32, temperature=0, result=result):
        if first is None:
            first = time.monotonic() - started
    return (first if first is not None else float("nan")), result.timings or {}


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def wait_asleep(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.sleeping(url) is True:
            return
        time.sleep(0.1)
    raise SystemExit("the server did not fall asleep")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=3, help="BONSAI_SLEEP_IDLE_SECONDS")
    parser.add_argument("--plain", action="store_true", help="without speculation (default: the demo's ngram-mod)")
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()

    env = {**os.environ, "BONSAI_SLEEP_IDLE_SECONDS": str(args.idle)}
    started = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "start", "--profile", "demo", "--detach", "--json"]
        + ([] if args.plain else ["--speculative"]),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(started.stdout)
    url, pid, name = data["url"], data["pid"], data["name"]
    rows = []
    try:
        for _ in range(args.rounds):
            awake_ttft, _ = ttft(url)
            awake_rss = rss_mib(pid)
            wait_asleep(url)
            time.sleep(0.5)  # let the unload's frees reach the kernel
            asleep_rss = rss_mib(pid)
            wake_ttft, _ = ttft(url)
            rows.append(
                {
                    "awake_rss_mib": round(awake_rss, 1),
                    "asleep_rss_mib": round(asleep_rss, 1),
                    "awake_ttft_s": round(awake_ttft, 3),
                    "wake_ttft_s": round(wake_ttft, 3),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        # Speculation after a wake: bonsai's own probe (a repeating prompt, where ngram-mod drafts)
        # as the first request to the woken server.
        wait_asleep(url)
        probe = liveness.probe(url)
        woke = {"probe_woke_it": probe.woke, "probe_drafted": probe.drafted, "probe_accepted": probe.accepted}
        print(json.dumps(woke), flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "bonsai_launch", "stop", name], env=env, capture_output=True)
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    proof = data.get("speculative") or {}
    summary.update(spec_type=proof.get("type"), live_at_start=proof.get("live"), rounds=len(rows), **woke)
    print("median", json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": rows, "median": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
