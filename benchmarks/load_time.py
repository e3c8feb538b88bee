"""How long llama-server takes to load a model, per weight type, against an earlier build.

The CPU backend repacks Q1_0, Q2_0 and PTQ1_0 matrices into sixteen-row tiles while it loads
(patches 0011 and 0013), on one thread, before the server answers; patch 0019 made Q1_0's and
Q2_0's repack table-driven. This times spawn -> /health 200 (what `bonsai start` and a router's
load on demand wait for) for the 1.7B-shaped files benchmarks/cpu_kernels.py and
benchmarks/ptq1_0_memory.py write (every matrix in the type, head included), alternating the two
builds round by round, and prints the medians as a markdown table. Run it on a quiet machine, from
the repo root, after `bonsai build` (the files are written once under --dir):

    python benchmarks/load_time.py --before ~/.cache/bonsai/builds/cpu-1a99835ac6c4/bin

The first round also reads each file into the page cache; later rounds time the load, not the disk.
`--load-modes auto,none` times each file with llama-server's `--load-mode` as given (auto maps the
file; none reads it once) instead of against another build, and reports the server's resident
memory after one request beside the load time: a repacked matrix lives in the repack buffer, and
a mapped file's pages stay resident beside it. `--model` adds a file of your own (the demo model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernels import after_bin, models
from ptq1_0_memory import files as ptq1_0_files
from ptq1_0_memory import server_rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bonsai-kernels"))
    ap.add_argument("--shape", default="1.7b")
    ap.add_argument("--types", default="Q1_0,Q2_0,PTQ1_0,Q4_0")
    ap.add_argument("--before", type=Path, help="bin folder of the build to compare against")
    ap.add_argument("--after", type=Path, help="bin folder of the patched build (default: this checkout's build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="2")
    ap.add_argument(
        "--load-modes",
        type=load_mode_list,
        help="e.g. auto,none: compare llama-server's --load-mode values on one build",
    )
    ap.add_argument("--model", type=Path, action="append", default=[], help="also this file (repeatable)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.load_modes:
        load_modes(args)
        return

    after = args.after or after_bin()
    builds = {"after": after} | ({"before": args.before} if args.before else {})
    types = args.types.split(",")
    paths = models(after, args.dir, args.shape, [t for t in types if t != "PTQ1_0"])
    if "PTQ1_0" in types:
        paths["PTQ1_0"] = ptq1_0_files(after, args.dir, args.shape, False)["PTQ1_0"]

    for path in paths.values():  # into the page cache, untimed
        path.read_bytes()
    loads: dict[str, dict[str, list[float]]] = {t: {b: [] for b in builds} for t in types}
    for r in range(args.rounds):
        for t in types:
            for b, bins in builds.items():
                loads[t][b].append(server_rss(bins, paths[t], args.threads)["load_s"])
                print(f"round {r + 1}: {t} {b} {loads[t][b][-1]:.2f} s", file=sys.stderr)

    print(f"llama-server spawn -> /health 200, {args.shape}-shaped files, -t {args.threads}, medians of {args.rounds}")
    print(f"after: {after}" + (f"; before: {args.before}" if args.before else ""))
    print("| type | file MiB | " + " | ".join(f"{b} (s)" for b in builds) + (" | speed-up |" if args.before else ""))
    print("|---|---:|" + "---:|" * len(builds) + ("---:|" if args.before else ""))
    medians = {t: {b: statistics.median(v) for b, v in per.items()} for t, per in loads.items()}
    for t in types:
        row = f"| {t} | {paths[t].stat().st_size / 2**20:.0f} | " + " | ".join(f"{medians[t][b]:.2f}" for b in builds)
        if args.before:
            row += f" | {medians[t]['before'] / medians[t]['after']:.1f}x |"
        print(row)
    if args.json:
        args.json.write_text(json.dumps({"builds": {b: str(p) for b, p in builds.items()}, "load_s": loads}, indent=1))


LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # llama-server's --load-mode (b11434)


def load_mode_list(text: str) -> list[str]:
    """--load-modes, checked before any server starts."""
    modes = [m for m in text.split(",") if m]
    bad = [m for m in modes if m not in LOAD_MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(
            f"{','.join(bad) or repr(text)} is not a load mode: give a comma-separated list of {', '.join(LOAD_MODES)}"
        )
    return modes


def load_modes(args: argparse.Namespace) -> None:
    """Each file under each --load-mode on one build: load time and RSS after a request, medians."""
    after = args.after or after_bin()
    modes = args.load_modes
    types = [t for t in args.types.split(",") if t] if args.types else []
    paths = models(after, args.dir, args.shape, types) | {m.name: m for m in args.model}
    for path in paths.values():  # into the page cache, untimed
        path.read_bytes()
    runs: dict[str, dict[str, list[dict[str, float]]]] = {f: {m: [] for m in modes} for f in paths}
    for r in range(args.rounds):
        for f, path in paths.items():
            for m in modes if r % 2 == 0 else reversed(modes):
                runs[f][m].append(server_rss(after, path, args.threads, ("--load-mode", m)))
                print(f"round {r + 1}: {f} {m} {runs[f][m][-1]}", file=sys.stderr)
    print(
        f"llama-server spawn -> /health 200 and VmRSS after one request, -c 256 -t {args.threads}, medians of {args.rounds}"
    )
    print(f"build: {after}")
    print("| file | file MiB | " + " | ".join(f"{m}: load s | {m}: RSS MiB" for m in modes) + " |")
    print("|---|---:|" + "---:|---:|" * len(modes))
    for f, path in paths.items():
        cells = []
        for m in modes:
            cells.append(f"{statistics.median(x['load_s'] for x in runs[f][m]):.2f}")
            cells.append(f"{statistics.median(x['rss_mib'] for x in runs[f][m]):.0f}")
        print(f"| {f} | {path.stat().st_size / 2**20:.0f} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"build": str(after), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
