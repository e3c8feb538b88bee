"""A long, seeded fuzz run of llama-server's HTTP API as bonsai launches it.

The generator and the crash detection are tests/support/http_fuzz.py (the suite runs a short
version in tests/test_fuzz_server.py). This script writes the suite's tiny target in a
temporary BONSAI_HOME, starts it with `bonsai start --detach` on a free loopback port
(restarts on, as by default: after a crash bonsai brings the server back and the run goes on),
sends up to --requests requests within --seconds, and reports requests sent, status codes, and
the distinct crashes (by the log line that says why) with up to three requests each. Not a
speed measurement: run it niced on a busy machine if need be, e.g.

    nice python benchmarks/fuzz_server.py --seed 7 --requests 5000 --seconds 180 --json > fuzz.json
    BONSAI_LLAMA_SERVER=/path/to/an/unpatched/llama-server python benchmarks/fuzz_server.py --seconds 60

Exit status 1 when a crash was found.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import http_fuzz  # noqa: E402 - from tests/support, after the path is set
import tiny_gguf  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--server", help="llama-server binary (default: BONSAI_LLAMA_SERVER, else bonsai's build)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args()

    if args.server:
        os.environ["BONSAI_LLAMA_SERVER"] = args.server
    if not os.environ.get("BONSAI_LLAMA_SERVER"):
        from bonsai_launch.llamacpp.builds import find_installed

        found = find_installed("auto")
        if found is None:
            sys.stderr.write("no llama-server: run `bonsai build` or pass --server\n")
            return 2
        os.environ["BONSAI_LLAMA_SERVER"] = str(found)
    with tempfile.TemporaryDirectory(prefix="bonsai-fuzz-") as tmp:
        os.environ["BONSAI_HOME"] = str(Path(tmp) / "home")
        model = tiny_gguf.write_target(Path(tmp) / "target.gguf")
        from bonsai_launch.server.process import free_port

        target = http_fuzz.BonsaiTarget(model, free_port())
        target.start()
        try:
            report = http_fuzz.run(target, seed=args.seed, requests=args.requests, seconds=args.seconds, vocab=512)
            final_health = http_fuzz.healthy(target.base_url, {}, wait_s=10)
        finally:
            target.stop()
    data = report.to_json()
    data["server"] = os.environ["BONSAI_LLAMA_SERVER"]
    data["healthy_at_end"] = final_health
    data["server_starts"] = target.starts
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(
            f"seed {report.seed}: {report.sent} requests in {report.elapsed_s:.0f} s, statuses {data['statuses']}, "
            f"{len(report.crashes)} crashes ({len(data['distinct_crashes'])} distinct), "
            f"{len(report.no_status)} without a status, healthy at the end: {final_health}"
        )
        for why, bodies in data["distinct_crashes"].items():
            print(f"  crash: {why}\n    e.g. {bodies[0]}")
    return 1 if report.crashes or not final_health or report.no_status else 0


if __name__ == "__main__":
    sys.exit(main())
