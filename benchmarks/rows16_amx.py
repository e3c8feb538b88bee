"""Patch 0014 on and off in one build: Bonsai's formats in batches through AMX-INT8 tiles (issue 49).

On a CPU with AMX-INT8, patch 0014 sends batches of 8 or more activation columns of Q1_0, Q2_0
and PTQ1_0 weights through the tile unit instead of patch 0011's dpbusd kernels; the variable
GGML_ROWS16_AMX=0 turns it off (on a CPU without AMX-INT8 only the dpbusd kernels run, once).
This runs llama-bench of this checkout's build (or BONSAI_LLAMA_SERVER's) on each file with the
tiles on and off, alternating which goes first, for --rounds rounds, and prints the medians:
tg, pp_n and the cost of an n-token batch in decode
steps, c(n) = n x tg / pp_n. The models are cpu_kernels.py's (the Qwen3-1.7B shape, every matrix
in the type, token embedding and LM head included), written once under --dir; --model adds a
file of your own (the Bonsai 2 2B-shaped PTQ1_0 of bonsai2_2b_target.py, for instance).
--before BIN_DIR adds a third setting: that build's llama-bench with its defaults (the previous
patch series, to compare a kernel patch against in the same rounds).

Run it on a quiet machine (nothing else on the cores), from the repo root:

    python benchmarks/rows16_amx.py --json /var/tmp/bonsai-kernels/amx.json

About 12 minutes on 2 cores for the two default types at 2 threads, 3 rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernels import EXE, after_bin, llama_bench, models

from bonsai_launch.server.selftest import cpu_flags

SETTINGS = {"tiles": {}, "dpbusd": {"GGML_ROWS16_AMX": "0"}}


def measure(
    settings: dict[str, tuple[Path, dict[str, str]]], model: Path, threads: int, prompts: str, rounds: int
) -> dict[str, dict[str, float]]:
    """{setting: {test: median tok/s}} over `rounds` alternating rounds; a setting is a build's
    bin folder and the variables its runs get."""
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in settings}
    for i in range(rounds):
        order = list(settings) if i % 2 == 0 else list(reversed(settings))
        for name in order:
            bin_dir, env = settings[name]
            measured = llama_bench(bin_dir, model, str(threads), prompts, 32, 2, env=env)
            for (_threads, test), ts in measured.items():
                runs[name].setdefault(test, []).append(ts)
    return {name: {t: statistics.median(v) for t, v in tests.items()} for name, tests in runs.items()}


def table(results: dict[str, dict[str, dict[str, float]]], prompts: list[int]) -> str:
    small = [n for n in prompts if n <= 16]
    head = ["file", "kernels", "tg"] + [f"pp{n}" for n in prompts] + [f"c({n})" for n in small]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, by_setting in results.items():
        for name, ts in by_setting.items():
            tg = ts["tg"]
            cells = [label, name, f"{tg:.1f}"] + [f"{ts[f'pp{n}']:.1f}" for n in prompts]
            cells += [f"{n * tg / ts[f'pp{n}']:.2f}" for n in small]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dir", type=Path, default=Path("/var/tmp/bonsai-kernels"), help="models are written and kept here"
    )
    ap.add_argument("--types", default="Q1_0,Q2_0", help="cpu_kernels.py's 1.7B-shaped files of these types")
    ap.add_argument("--model", type=Path, action="append", default=[], help="also this file (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default="1,2,4,5,8,9,16,64,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write every number here too")
    ap.add_argument("--before", type=Path, help="also this build's bin folder, with its defaults")
    args = ap.parse_args()
    bin_dir = after_bin()
    # Without AMX-INT8 both settings run the same dpbusd code: measure it once.
    kept = SETTINGS if cpu_flags().get("amx", True) else {"dpbusd": {}}  # no cpuinfo: it may be there
    settings = {name: (bin_dir, env) for name, env in kept.items()}
    if args.before:
        if not (args.before / f"llama-bench{EXE}").is_file():
            sys.exit(
                f"--before {args.before}: no llama-bench there; give a build's bin folder (~/.cache/bonsai/builds/<key>/bin)"
            )
        settings["before"] = (args.before, {})
    files = {f"1.7B {t}": p for t, p in models(bin_dir, args.dir, "1.7b", args.types.split(",")).items()}
    files.update({m.name: m for m in args.model})
    results = {label: measure(settings, path, args.threads, args.prompts, args.rounds) for label, path in files.items()}
    prompts = [int(p) for p in args.prompts.split(",")]
    print(f"llama-bench of {bin_dir}, {args.threads} threads, medians of {args.rounds} alternating rounds")
    if args.before:
        print(f"before: {args.before}")
    print(table(results, prompts))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"bin": str(bin_dir), "before": str(args.before or ""), "threads": args.threads, "results": results},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
