"""How long must tuning's answers be for the n-gram candidates to show what they do on long
ones? (issue 47: at 64 tokens ngram-mod's gain on long copies was invisible)

One plain server answers every prompt with --max tokens (greedy, token ids recorded); each
candidate `bonsai tune` screens is replayed on those answers cut at each length L (the server
drafts at most to the request's end, so a cut answer is exactly what a request of L tokens
would have produced), and estimated with the verify cost a tune measured on this machine
(decisions/estimate.py). No timing here: the counts are exact, the cost is the tune's.

    python benchmarks/answer_length.py --profile demo --max 512 --lengths 64,96,128,192,256,384,512

Prints, per length, the three best candidates by estimated speed against plain, and how fast
the best at that length is on the longest answers, as a fraction of the best there (1.00: the
length picks what the longest answers would).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bonsai_launch.bench import prompts as suite
from bonsai_launch.decisions import estimate as est
from bonsai_launch.llamacpp import replay as rp


def record(argv: list[str], prompts: list[suite.Prompt], n_predict: int, ctx: int) -> list[rp.Stream]:
    """The plain launch's own command line (chat template included) on a free port."""
    import tempfile

    from bonsai_launch.server import client
    from bonsai_launch.server.process import ServerProcess, free_port

    port = free_port()
    cmd = list(argv)
    cmd[cmd.index("--port") + 1] = str(port)
    url = f"http://127.0.0.1:{port}"
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess.spawn(cmd, env=None, log_path=Path(tmp) / "server.log", base_url=url)
        try:
            server.wait_ready(600)
            for p in prompts:
                text = client.post_json(url, "/apply-template", {"messages": p.chat_messages()}, None)["prompt"]
                ids = client.tokenize(url, text, prompt=True)
                body = {"prompt": ids, "n_predict": n_predict, "temperature": 0, "return_tokens": True}
                answer = client.post_json(url, "/completion", body, None, timeout=600)
                out.append(rp.Stream(tuple(ids), tuple(answer["tokens"]), n_predict, ctx))
        finally:
            server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--prompts", help="JSONL (default: the bundled tuning prompts)")
    ap.add_argument("--max", type=int, default=512)
    ap.add_argument("--lengths", default="64,96,128,192,256,384,512")
    ap.add_argument("--cost", type=Path, help="a decision JSON whose replay cost to use (default: the newest stored)")
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/bonsai-answer-length.json"))
    ap.add_argument("--streams", type=Path, help="reuse the answers a previous run kept (its --out + .streams)")
    args = ap.parse_args()

    from bonsai_launch.decisions.store import Decision, load_all
    from bonsai_launch.server.prepare import prepare_launch
    from bonsai_launch.tune.session import PROMPTS_FILE
    from bonsai_launch.tune.subject import TuneRequest, plan_candidates, subject

    binary = prepare_launch({"profile": args.profile}, None, None, ("plain", "speculative"))
    prompts = suite.load_prompts(args.prompts or PROMPTS_FILE)
    request = TuneRequest({"profile": args.profile}, None, None, (), binary)
    subj = subject(request, prompts, replayable=True)
    specs, _ = plan_candidates(request, subj.candidates)
    candidates = {s.name: a for s in specs if not s.baseline and (a := rp.replay_args(s.plan.argv)) is not None}
    decisions = [Decision.from_json(json.loads(args.cost.read_text()))] if args.cost else load_all()
    cost = next(
        (c for d in decisions if (c := est.CostModel.from_json((d.evidence.get("replay") or {}).get("cost")))), None
    )
    if cost is None:
        raise SystemExit("no tuned cost model: run `bonsai tune` first, or pass --cost DECISION.json")
    plain_plan = next(s.plan for s in specs if s.baseline)
    if args.streams:
        streams = [rp.Stream(tuple(p), tuple(g), n, c) for p, g, n, c in json.loads(args.streams.read_text())]
    else:
        streams = record(list(plain_plan.argv), prompts, args.max, plain_plan.ctx)
        kept = [[list(s.prompt), list(s.generated), s.n_predict, s.n_ctx] for s in streams]
        args.out.with_suffix(".streams").write_text(json.dumps(kept))
    tool = rp.tool_for(binary)
    lengths = [int(x) for x in args.lengths.split(",")]
    table: dict[int, list[tuple[str, float, float | None]]] = {}
    for length in lengths:
        cut = [rp.Stream(s.prompt, s.generated[:length], length, s.n_ctx) for s in streams]
        plain = est.plain_estimate((len(s.generated) - 1 for s in cut), cost)
        ranked = []
        for name, cand_args in candidates.items():
            e = est.estimate(rp.replay(tool, cand_args, cut), cost)
            ranked.append((name, e.tps / plain.tps, e.acceptance))
        table[length] = sorted(ranked, key=lambda r: r[1], reverse=True)
    at_longest = {n: r for n, r, _ in table[lengths[-1]]}
    best_longest = max(at_longest.values())
    print(f"cost model: step {cost.step_ms:.2f} ms, kappa {cost.kappa:.3f}; {len(prompts)} prompts; answers cut at L")
    print(f"| L | best (est. x plain) | 2nd | 3rd | the best at L on {lengths[-1]}-token answers, x their best |")
    print("|---:|---|---|---|---:|")
    for length, ranked in table.items():
        top = ranked[:3]
        cells = " | ".join(f"{n} {r:.2f}x" for n, r, _ in top)
        print(f"| {length} | {cells} | {at_longest[top[0][0]] / best_longest:.2f} |")
    args.out.write_text(json.dumps({str(k): v for k, v in table.items()}, indent=2))


if __name__ == "__main__":
    main()
