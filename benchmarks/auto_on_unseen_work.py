"""Does `auto` hold up on work the repository has never seen, before and after it re-decides from
the server's own traffic? (issue 47)

The work lives outside the repository (`--work DIR`): per kind K, `K.traffic.jsonl` (what the
server is sent while it serves) and `K.eval.jsonl` (what every configuration is measured on;
no prompt in both). The script refuses a prompt that is in the repository's prompt files.

1. tune: `bonsai tune --profile demo` on the bundled tuning prompts (it never sees the work);
2. before, per kind: `bonsai bench --prompts K.eval.jsonl --configs plain,<each fixed choice>,auto`,
   256-token answers (issue 47's work), 3 repeats;
3. after, per kind: `BONSAI_SPECULATIVE=auto BONSAI_TUNE_SAMPLE=200 bonsai start --detach`,
   K's traffic sent through the chat API, the keeper's verdict read from `bonsai ps --json`
   (no benchmark runs), the server stopped; then `bonsai bench --prompts K.eval.jsonl
   --configs plain,<K's best fixed choice before>,auto`, so auto after the re-decision is
   measured in the same bench as the choice it must match. Each kind starts from the tuned
   decision (the previous kind's traffic decision is removed) with an empty sample.

It writes `tables.md` (and prints it) and `summary.json` under --out. Run one phase at a time
with `--phase tune|before|after|report` (the report reads what the others wrote).

    python benchmarks/auto_on_unseen_work.py --work /var/tmp/b47work --out /var/tmp/b47out

On an idle 2-core machine with the demo model: tune about 2 minutes, before about 5 per kind,
after about 3 per kind (`--kinds` runs some of them: each phase adds to summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPO_PROMPTS = [
    ROOT / "bonsai_launch" / "tune" / "prompts.jsonl",
    *sorted((ROOT / "benchmarks" / "prompts").glob("*.jsonl")),
]
REPO_PROMPTS += sorted((ROOT / "bonsai_launch" / "bench" / "suites").glob("*.jsonl"))
FIXED = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "ngram-simple+ngram-mod")


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kinds_of(work: Path) -> list[str]:
    return sorted(p.name.removesuffix(".eval.jsonl") for p in work.glob("*.eval.jsonl"))


def check_unseen(work: Path) -> None:
    """No prompt of the work may be one the repository carries."""
    seen = {json.dumps(r.get("messages") or r.get("prompt")) for p in REPO_PROMPTS for r in rows(p)}
    found = [r["id"] for p in work.glob("*.jsonl") for r in rows(p) if json.dumps(r.get("messages")) in seen]
    if found:
        sys.exit(f"these prompts are in the repository: {found}")


def bonsai(args: list[str], log: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    cmd = [sys.executable, "-m", "bonsai_launch", *map(str, args)]
    print("+ bonsai " + " ".join(map(str, args)), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    log.write_text(f"$ {' '.join(cmd)}\n\n{done.stdout}\n{done.stderr}")
    if check and done.returncode != 0:
        sys.exit(f"bonsai {args[0]} failed (exit {done.returncode}); see {log}\n{done.stderr[-2000:]}")
    return done.stdout


def bench(out: Path, name: str, prompts: Path, configs: list[str], args) -> tuple[dict, str]:
    cmd = ["bench", "--profile", args.profile, "--prompts", prompts, "--configs", ",".join(["plain", *configs, "auto"])]
    cmd += ["--temps", "0", "--repeats", args.repeats, "--max-tokens", args.max_tokens, "--no-tradeoffs"]
    cmd += ["--no-chart", "--out", out / name]
    bonsai(cmd, out / f"{name}.log")
    return json.loads((out / name / "bench.json").read_text()), "bonsai " + " ".join(map(str, cmd))


def per_category(doc: dict) -> dict[str, dict[str, tuple[float, float, float]]]:
    """category -> configuration -> decode tok/s (median, min, max), the server's own timings."""
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for r in doc.get("results", []):
        tps = r.get("decode_tps") or {}
        if tps.get("median") is not None:
            out.setdefault(r["category"], {})[r["config"]] = (tps["median"], tps.get("min"), tps.get("max"))
    return out


def auto_label(doc: dict) -> str:
    return next((c.get("label") for c in doc.get("configs", []) if c["name"] == "auto"), "auto")


def home() -> Path:
    from bonsai_launch.core.paths import bonsai_home

    return bonsai_home()


def forget_traffic_decisions() -> None:
    """Back to the tuned decision: each kind is re-decided from its own traffic only."""
    folder = home() / "tune" / "decisions"
    for path in folder.glob("*.json"):
        if json.loads(path.read_text()).get("source") == "traffic":
            path.unlink()


def serve_traffic(kind: str, traffic: Path, out: Path, args) -> dict:
    """Start under auto with the sample on, send the kind's traffic, read the keeper's verdict."""
    import httpx

    from bonsai_launch.server import prompt_sample
    from bonsai_launch.server.process import free_port

    env = {"BONSAI_SPECULATIVE": "auto", "BONSAI_TUNE_SAMPLE": "200", "BONSAI_WATCH_SECONDS": "1"}
    port = free_port()
    started = json.loads(
        bonsai(
            ["start", "--profile", args.profile, "--port", port, "--detach", "--json"], out / f"start-{kind}.log", env
        )
    )
    sample = prompt_sample.sample_path(started["plan"]["model"])
    verdict: dict = {}
    answered = 0  # requests with an answer: one the model ends at once leaves the sample nothing to keep
    try:
        with httpx.Client(timeout=600, trust_env=False) as http:
            for row in rows(traffic):
                body = {"messages": row["messages"], "max_tokens": int(args.max_tokens), "temperature": 0}
                r = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
                r.raise_for_status()
                if not (r.json()["choices"][0]["message"].get("content") or "").strip():
                    continue
                answered += 1
                deadline = time.monotonic() + 20
                while len(prompt_sample.read(sample)) < answered and time.monotonic() < deadline:
                    time.sleep(0.2)
        deadline = time.monotonic() + 30  # the keeper tokenizes and replays after each read of /slots
        while time.monotonic() < deadline:
            ps = json.loads(bonsai(["ps", "--json"], out / f"ps-{kind}.log"))
            verdict = next((p.get("traffic") or {} for p in ps if p.get("port") == port), {})
            if verdict.get("requests", 0) >= answered:
                break
            time.sleep(1)
    finally:
        bonsai(["stop", "--all"], out / f"stop-{kind}.log", check=False)
    tuned = started["plan"].get("tuning", {}).get("choice", {}).get("label")
    return {"verdict": verdict, "tuned": tuned, "sent": len(rows(traffic)), "answered": answered}


def accuracy(out: Path, kinds: list[str], args) -> dict[str, dict[str, dict[str, float]]]:
    """Each fixed n-gram choice's speed as the replay estimates it (plain's own tokens on the
    evaluation prompts, the tune's cost model) against what the before-bench measured."""
    sys.path.insert(0, str(Path(__file__).parent))
    from answer_length import record

    from bonsai_launch.bench import prompts as suite
    from bonsai_launch.decisions import estimate as est
    from bonsai_launch.llamacpp import replay as rp
    from bonsai_launch.server.prepare import prepare_launch
    from bonsai_launch.tune.subject import TuneRequest, plan_candidates, subject

    s = json.loads((out / "summary.json").read_text())
    cost = est.CostModel.from_json(s["tune"]["decision"]["evidence"]["replay"]["cost"])
    assert cost is not None
    binary = prepare_launch({"profile": args.profile}, None, None, ("plain", "speculative"))
    evaluation = out / "eval.jsonl"
    evaluation.write_text("".join((args.work / f"{k}.eval.jsonl").read_text() for k in kinds))
    prompts = suite.load_prompts(evaluation)
    request = TuneRequest({"profile": args.profile}, None, None, (), binary)
    from bonsai_launch.tune import candidates as cands

    fixed = [cands.Candidate(n, n.replace("+", ",")) for n in FIXED]
    specs, _ = plan_candidates(request, (cands.PLAIN, *fixed))
    subject(request, prompts)  # the same checks a tune makes on the files
    plain_plan = next(sp.plan for sp in specs if sp.baseline)
    streams = record(list(plain_plan.argv), prompts, int(args.max_tokens), plain_plan.ctx)
    tool = rp.tool_for(binary)
    table: dict[str, dict[str, dict[str, float]]] = {}
    measured = s["before"]["rows"]
    for kind in kinds:
        mine = [st for st, p in zip(streams, prompts, strict=True) if p.category == kind]
        plain = est.plain_estimate((len(st.generated) - 1 for st in mine), cost)
        row = {}
        for sp in specs:
            if sp.baseline or sp.name not in measured.get(kind, {}):
                continue
            e = est.estimate(rp.replay(tool, rp.replay_args(sp.plan.argv) or [], mine), cost)
            m_ratio = measured[kind][sp.name][0] / measured[kind]["plain"][0]
            row[sp.name] = {"est": e.tps / plain.tps, "measured": m_ratio}
        table[kind] = row
    return table


def fmt(t: tuple[float, float, float] | None) -> str:
    if not t:
        return "-"
    return f"{t[0]:.1f} ({t[1]:.1f}-{t[2]:.1f})" if t[1] is not None else f"{t[0]:.1f}"


def report(out: Path, kinds: list[str]) -> str:
    s = json.loads((out / "summary.json").read_text())
    lines = ["<!-- written by benchmarks/auto_on_unseen_work.py -->", ""]
    tune = s.get("tune") or {}
    if tune:
        took = f"{tune['elapsed_s']:.0f} s (budget {tune['budget_s']:.0f} s)"
        lines += [f"Tune (bundled prompts, never the work): {took}; chose {tune['choice']}. `{tune['command']}`", ""]
    before = s.get("before") or {}
    if before:
        cats = before["rows"]
        configs = ["plain", *FIXED, "auto"]
        lines += [
            f"Before the re-decision (decode tok/s, median (min-max) of the runs; auto ran {before['auto']}):",
            "",
        ]
        lines += ["| kind | " + " | ".join(configs) + " | auto / best fixed |", "|---|" + "---:|" * (len(configs) + 1)]
        for kind in kinds:
            r = cats.get(kind, {})
            if not r:
                continue
            fixed = {c: r[c][0] for c in ["plain", *FIXED] if c in r}
            best = max(fixed, key=lambda c: fixed[c])
            ratio = r["auto"][0] / fixed[best] if "auto" in r else float("nan")
            cells = [fmt(r.get(c)) + (" **best**" if c == best else "") for c in configs]
            lines.append(f"| {kind} | " + " | ".join(cells) + f" | {ratio:.2f} ({best}) |")
        lines += [
            "",
            "Commands: " + "; ".join(f"`{before['commands'][k]}`" for k in kinds if k in before["commands"]),
            "",
        ]
    after = s.get("after") or {}
    if after:
        lines += ["After serving each kind's traffic with the sample on (no benchmark in between):", ""]
        lines += [
            "| kind | keeper's verdict | plain | best fixed before | auto after | auto / best fixed |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for kind in kinds:
            a = after.get(kind)
            if not a:
                continue
            r = a["rows"].get(kind, {})
            best = a["best"]
            v = a["traffic"]["verdict"]
            what = f"{v.get('status')}: {v.get('choice') or v.get('decided')}" if v else "none"
            ratio = r["auto"][0] / r[best][0] if "auto" in r and best in r else float("nan")
            lines.append(
                f"| {kind} | {what} | {fmt(r.get('plain'))} | {best} {fmt(r.get(best))} | {a['auto']} {fmt(r.get('auto'))} | {ratio:.2f} |"
            )
        lines += ["", "Commands: " + "; ".join(f"`{after[k]['command']}`" for k in kinds if k in after), ""]
    acc = s.get("accuracy") or {}
    if acc:
        names = [n for n in FIXED if any(n in acc[k] for k in acc)]
        lines += ["The replay's estimate against the measurement (x plain, estimated / measured):", ""]
        lines += ["| kind | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for kind in kinds:
            r = acc.get(kind, {})
            cells = [f"{r[n]['est']:.2f} / {r[n]['measured']:.2f}" if n in r else "-" for n in names]
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/bonsai-unseen-work"))
    ap.add_argument("--phase", choices=("all", "tune", "before", "after", "accuracy", "report"), default="all")
    ap.add_argument("--max-tokens", default="256")
    ap.add_argument("--repeats", default="3")
    ap.add_argument("--kinds", help="comma list (default: every K.eval.jsonl in --work)")
    args = ap.parse_args()
    check_unseen(args.work)
    kinds = args.kinds.split(",") if args.kinds else kinds_of(args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = args.out / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.is_file() else {}

    if args.phase in ("all", "tune"):
        forget_traffic_decisions()
        cmd = ["tune", "--profile", args.profile, "--json"]
        done = json.loads(bonsai(cmd, args.out / "tune.log"))
        choice = done["decision"]["choice"]
        summary["tune"] = {
            "elapsed_s": done["elapsed_s"],
            "budget_s": done["budget_s"],
            "choice": choice.get("label") or "plain",
            "decision": done["decision"],
            "command": "bonsai " + " ".join(cmd),
        }
    if args.phase in ("all", "before"):
        forget_traffic_decisions()
        before = summary.setdefault("before", {"rows": {}, "commands": {}})
        for kind in kinds:  # one bench per kind: each fits a quiet slot, each compares within itself
            doc, command = bench(args.out, f"before-{kind}", args.work / f"{kind}.eval.jsonl", list(FIXED), args)
            before["rows"][kind] = per_category(doc).get(kind, {})
            before["commands"][kind] = command
            before["auto"] = auto_label(doc)
            summary_path.write_text(json.dumps(summary, indent=2, default=str))
    if args.phase in ("all", "after"):
        summary.setdefault("after", {})
        for kind in kinds:
            forget_traffic_decisions()
            from bonsai_launch.server import prompt_sample

            for path in prompt_sample.samples_dir().glob("*.jsonl"):
                path.unlink()  # an empty sample: this kind's traffic only
            served = serve_traffic(kind, args.work / f"{kind}.traffic.jsonl", args.out, args)
            fixed = {c: t[0] for c, t in summary["before"]["rows"][kind].items() if c not in ("auto",)}
            best = max(fixed, key=lambda c: fixed[c])
            others = [best] if best != "plain" else []
            doc, command = bench(args.out, f"after-{kind}", args.work / f"{kind}.eval.jsonl", others, args)
            summary["after"][kind] = {
                "traffic": served,
                "best": best,
                "rows": per_category(doc),
                "auto": auto_label(doc),
                "command": command,
            }
            summary_path.write_text(json.dumps(summary, indent=2, default=str))
    if args.phase == "accuracy":  # counts only, no timing: needs no quiet machine
        summary["accuracy"] = accuracy(args.out, kinds, args)
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    text = report(args.out, kinds)
    (args.out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
