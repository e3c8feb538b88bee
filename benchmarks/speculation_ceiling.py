"""The ceiling of speculation on this CPU for Bonsai's formats (issue 24).

Writes (once, kept under --dir) a "constant" qwen3 target at the Qwen3-1.7B shape (the Bonsai
1.7B shape: E=2048, 28 layers, FF 6144, 16/8 heads of 128, V=151936), quantizes it with the
build's llama-quantize to Q1_0 and Q2_0, and a DSpark drafter for it (architecture dflash with a
Markov head, 3 layers at the target's width, block size 4, Q4_0). Both models always predict the
same token, so every draft is accepted: the measured speculative speed is the most DSpark can
reach here, with free-to-check perfect drafts. The shape sets the cost; the values do not.

Then, per format, with this checkout's build:
- `bonsai bench --model T --drafter D --configs plain,draft-dspark` (T=0, completion API,
  96 tokens, 3 repeats): plain and speculative decode tok/s at 100% acceptance;
- the estimate at the published drafters' acceptance (65-77% per drafted token): a verify
  cycle costs about the same whatever is accepted, so speed scales with the expected tokens per
  cycle, (1 - a^(n+1)) / (1 - a) of n + 1 (n = 4 drafted, plus the verify's own token);
- `bonsai tune --model T --drafter D --configs plain,draft-dspark`: the verdict a user gets.

Run it only on a quiet machine, from the repo root, after `bonsai build`:

    python benchmarks/speculation_ceiling.py --json /var/tmp/bonsai-kernels/ceiling.json

About 15 minutes on 2 cores the first time (writing and quantizing the models takes 3 of them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from cpu_kernels import EXE, SHAPES, quantized_targets, run
from cpu_kernels import after_bin as bin_dir

import tiny_gguf

SHAPE = SHAPES["1.7b"]
TOKEN = 1000  # the one token both models predict
BLOCK = 4  # Bonsai's DSpark drafters (v1): 4 drafted tokens per verify
PUBLISHED_ACCEPTANCE = (0.65, 0.77)


def write_models(bins: Path, out: Path, types: list[str]) -> tuple[dict[str, Path], Path]:
    targets = quantized_targets(bins, out, "const-1.7b", types, constant_token=TOKEN, **SHAPE)
    drafter = out / "const-1.7b-dspark-q4_0.gguf"
    if not drafter.is_file():
        f32 = out / "const-1.7b-dspark-f32.gguf"
        tiny_gguf.write_dspark_drafter(
            f32,
            target_embedding=SHAPE["embedding"],
            target_layers=(2, 14, 26),
            vocab=SHAPE["vocab"],
            block_size=BLOCK,
            draft_layers=3,
            heads=SHAPE["heads"],
            heads_kv=SHAPE["heads_kv"],
            head_dim=SHAPE["head_dim"],
            ff=SHAPE["ff"],
            constant_token=TOKEN,
        )
        run([bins / f"llama-quantize{EXE}", f32, drafter, "Q4_0"])
        f32.unlink()
    return targets, drafter


def bonsai(*args: object) -> dict:
    out = run([sys.executable, "-m", "bonsai_launch", *args, "--json"])
    return json.loads(out.stdout)


def measure(target: Path, drafter: Path, work: Path) -> dict:
    bench = bonsai(
        "bench",
        "--model", target, "--drafter", drafter, "--configs", "plain,draft-dspark",
        "--api", "completion", "--temps", "0", "--max-tokens", "96", "--repeats", "3",
        "--per-category", "1", "--concurrency", "1", "--no-tradeoffs", "--no-chart",
        "--out", work,
    )  # fmt: skip
    pooled = {r["config"]: r for r in bench["results"] if r["category"] == "all"}
    plain, spec = pooled["plain"], pooled["draft-dspark"]
    tune = bonsai(
        "tune", "--model", target, "--drafter", drafter, "--configs", "plain,draft-dspark", "--max-tokens", "96"
    )
    ratio = spec["decode_tps"]["median"] / plain["decode_tps"]["median"]
    at = {f"{a:.2f}": ratio * expected_tokens(a, BLOCK) / (BLOCK + 1) for a in PUBLISHED_ACCEPTANCE}
    return {
        "plain_tps": plain["decode_tps"]["median"],
        "dspark_tps": spec["decode_tps"]["median"],
        "acceptance": spec["acceptance_rate"],
        "ratio_at_100": ratio,
        "ratio_estimated": at,
        "break_even_acceptance": break_even(ratio),
        "tune": tune["decision"]["choice"],
        "load_average": bench["environment"].get("load_average_start"),
    }


def expected_tokens(acceptance: float, drafted: int) -> float:
    """Tokens one verify cycle yields when each drafted token is accepted with this
    probability until the first miss, plus the verify's own token."""
    return sum(acceptance**k for k in range(drafted + 1))


def break_even(ratio_at_100: float) -> float | None:
    """The acceptance below which speculation is slower than plain, from the 100% ratio (None
    when even perfect drafts do not pay)."""
    if ratio_at_100 <= 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio_at_100 * expected_tokens(mid, BLOCK) / (BLOCK + 1) < 1 else (lo, mid)
    return hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bonsai-kernels/ceiling"))
    ap.add_argument("--types", default="Q1_0,Q2_0")
    ap.add_argument("--json", type=Path, help="write every number here too")
    args = ap.parse_args()
    bins = bin_dir()
    targets, drafter = write_models(bins, args.dir, args.types.split(","))
    results = {q: measure(t, drafter, args.dir / f"bench-{q.lower()}") for q, t in targets.items()}
    lo, hi = (f"{a:.2f}" for a in PUBLISHED_ACCEPTANCE)
    print(
        f"\n| target | plain tok/s | DSpark at 100% | ratio | est. at {lo} | est. at {hi} | break-even | bonsai tune |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for qtype, r in results.items():
        est = r["ratio_estimated"]
        verdict = f"{r['tune']['label']}: {r['tune']['reason']}"
        even = "never" if r["break_even_acceptance"] is None else f"{r['break_even_acceptance']:.0%}"
        print(
            f"| {qtype} | {r['plain_tps']:.1f} | {r['dspark_tps']:.1f} ({r['acceptance']:.0%} accepted) | "
            f"{r['ratio_at_100']:.2f}x | {est[lo]:.2f}x | {est[hi]:.2f}x | "
            f"{even} | {verdict} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
