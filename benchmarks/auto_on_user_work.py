"""Does `auto` pick what pays on the user's own work and load? (issue 39)

The prompts are benchmarks/prompts/user_work.jsonl: code-copy and code-edit requests that are
not in the repository's tune suite (bonsai_launch/tune/prompts.jsonl; checked below). They are
split in two disjoint halves (alternate lines): `tune.jsonl`, the sample `bonsai tune --prompts`
decides on, and `eval.jsonl`, on which every configuration is measured. For each slot count:

1. `bonsai tune --prompts tune.jsonl --parallel S`: a decision for that launch;
2. `bonsai bench --prompts eval.jsonl --configs plain,<each fixed type>,auto --parallel S
   --concurrency S`: one client (the suite's decode speed, S = 1) or S concurrent clients
   (aggregate throughput on S slots; plain on S slots is one of the rows).

It then writes `tables.md` (and prints it): per configuration, the figure, which prompts and
how many clients it is for, and auto against the best fixed choice (the issue's goal: >= 0.95x).

    python benchmarks/auto_on_user_work.py --profile demo --out /var/tmp/bonsai-auto-work

On an idle 2-core machine with the demo model: about 15-25 minutes (two tune sessions, two
benches of 6 configurations x 3 repeats). A check that it runs end to end (no figures worth
reading): add `--max-tokens 16 --repeats 1 --tune-budget 20`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "benchmarks" / "prompts" / "user_work.jsonl"
TUNE_SUITE = ROOT / "bonsai_launch" / "tune" / "prompts.jsonl"
FIXED = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")


def split(source: Path, out: Path) -> tuple[Path, Path, int, int]:
    """Alternate lines into the tuning sample and the evaluation set; refuse any prompt that is
    in the repository's tune suite (the point is prompts bonsai has never seen)."""
    lines = [line for line in source.read_text().splitlines() if line.strip()]
    suite = {json.dumps(json.loads(x).get("messages")) for x in TUNE_SUITE.read_text().splitlines() if x.strip()}
    overlap = [json.loads(x)["id"] for x in lines if json.dumps(json.loads(x).get("messages")) in suite]
    if overlap:
        sys.exit(f"these prompts are in the tune suite: {overlap}")
    tune, evaluation = lines[0::2], lines[1::2]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.jsonl").write_text("\n".join(tune) + "\n")
    (out / "eval.jsonl").write_text("\n".join(evaluation) + "\n")
    return out / "tune.jsonl", out / "eval.jsonl", len(tune), len(evaluation)


def bonsai(args: list[str], log: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bonsai_launch", *args]
    print("+ bonsai " + " ".join(args), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    log.write_text(f"$ {' '.join(cmd)}\n\n{done.stdout}\n{done.stderr}")
    if done.returncode != 0:
        sys.exit(f"bonsai {args[0]} failed (exit {done.returncode}); see {log}\n{done.stderr[-2000:]}")
    return done


def one_client_rows(doc: dict[str, Any]) -> dict[str, tuple[float | None, str]]:
    """Decode tok/s (median, with min-max) of each configuration over all prompts, one client."""
    out = {}
    for r in doc.get("results", []):
        if r["category"] == "all":
            tps = r.get("decode_tps") or {}
            out[r["config"]] = (tps.get("median"), _spread(tps))
    return out


def many_client_rows(doc: dict[str, Any], clients: int, slots: int) -> dict[str, tuple[float | None, str]]:
    """Aggregate throughput of `clients` concurrent clients on `slots` slots, per configuration."""
    out = {}
    for r in doc.get("concurrency", []):
        if r["level"] == clients and (r.get("slots") in (slots, None)):
            tps = r.get("throughput_tps") or {}
            out[r["config"]] = (tps.get("median"), _spread(tps))
    return out


def _spread(s: dict[str, Any]) -> str:
    if s.get("min") is None or s.get("n", 0) < 2:
        return ""
    return f" ({s['min']:.1f}-{s['max']:.1f})"


def table(
    title: str, rows: dict[str, tuple[float | None, str]], prompts: str, clients: int, choice: str, command: str
) -> str:
    fixed = {k: v[0] for k, v in rows.items() if k != "auto" and v[0] is not None}
    best = max(fixed, key=lambda k: fixed[k]) if fixed else None
    lines = [
        f"### {title}",
        "",
        f"Prompts: {prompts}. Clients: {clients}. auto ran: {choice}.",
        "",
        "| configuration | tok/s, median (min-max) | vs best fixed | prompts | clients |",
        "|---|---:|---:|---|---:|",
    ]
    for name, (tps, spread) in rows.items():
        vs = f"{tps / fixed[best]:.2f}x" if tps and best else "-"
        figure = f"{tps:.1f}{spread}" if tps is not None else "-"
        lines.append(f"| {name}{' (best fixed)' if name == best else ''} | {figure} | {vs} | {prompts} | {clients} |")
    auto = rows.get("auto", (None, ""))[0]
    if auto and best:
        goal = "meets" if auto >= 0.95 * fixed[best] else "misses"
        lines += ["", f"auto / best fixed ({best}) = {auto / fixed[best]:.2f}: {goal} the goal (>= 0.95)."]
    lines += ["", f"Command: `{command}`", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--model", help="a local GGUF instead of the profile's")
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/bonsai-auto-work"))
    ap.add_argument("--slots", default="1,4", help="slot counts (and as many clients) to measure")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tune-budget", type=float, default=None, help="seconds per tune session (default: tune's)")
    ap.add_argument("--configs", default=",".join(FIXED), help="the fixed speculative choices")
    args = ap.parse_args()

    tune_file, eval_file, n_tune, n_eval = split(SOURCE, args.out)
    who = ["--model", args.model] if args.model else ["--profile", args.profile]
    configs = "plain," + args.configs + ",auto"
    sections = [
        "<!-- written by benchmarks/auto_on_user_work.py -->",
        (
            f"Tuning sample: {n_tune} prompts ({tune_file}); evaluation: {n_eval} other prompts from the same "
            f"source ({SOURCE.relative_to(ROOT)}), none in the tune suite. {args.max_tokens} tokens per request, "
            f"temperature 0, {args.repeats} repeats."
        ),
        "",
    ]
    summary: dict[str, Any] = {"tune_prompts": str(tune_file), "eval_prompts": str(eval_file), "slots": {}}
    for slots in (int(s) for s in args.slots.split(",")):
        # one slot is the default launch with speculation: a decision keyed to the defaults
        slot_args = ["--parallel", str(slots)] if slots > 1 else []
        tune_args = [
            "tune",
            *who,
            "--prompts",
            str(tune_file),
            *slot_args,
            "--max-tokens",
            str(max(16, args.max_tokens)),
            "--json",
        ]
        if args.tune_budget:
            tune_args += ["--budget", str(args.tune_budget)]
        decision = json.loads(bonsai(tune_args, args.out / f"tune-{slots}.log").stdout)["decision"]
        choice = (decision.get("choice") or {}).get("label") or "plain"
        out_dir = args.out / f"bench-{slots}"
        bench_args = [
            "bench",
            *who,
            "--prompts",
            str(eval_file),
            "--configs",
            configs,
            *slot_args,
            "--concurrency",
            str(slots),
            "--temps",
            "0",
            "--repeats",
            str(args.repeats),
            "--max-tokens",
            str(args.max_tokens),
            "--tradeoff-tokens",
            str(args.max_tokens),
            "--out",
            str(out_dir),
            "--no-chart",
        ]
        bonsai(bench_args, args.out / f"bench-{slots}.log")
        doc = json.loads((out_dir / "bench.json").read_text())
        if slots == 1:
            rows = one_client_rows(doc)
            title = "One client: decode tok/s (server timings), one slot"
        else:
            rows = many_client_rows(doc, slots, slots)
            title = f"{slots} concurrent clients: aggregate tok/s on {slots} slots"
        prompts = f"{n_eval} held-out user-work prompts (eval.jsonl)"
        sections.append(table(title, rows, prompts, slots, choice, "bonsai " + " ".join(bench_args)))
        summary["slots"][slots] = {"decision": decision, "rows": rows, "tune_command": "bonsai " + " ".join(tune_args)}
    text = "\n".join(sections)
    (args.out / "tables.md").write_text(text)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(text)


if __name__ == "__main__":
    main()
