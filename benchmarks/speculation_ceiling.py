"""The ceiling of speculation on this CPU, on targets stored like the real files (issues 24, 49).

Two targets, each with the drafter the real ones run, both always right (100% acceptance), so
the measured speculative speed is the most speculation can reach here. The shape and the tensor
types set the cost; the values do not.
- dense: a "constant" qwen3 at the Bonsai 1.7B shape (E=2048, 28 layers, FF 6144, 16/8 heads of
  128, V=151936) with EVERY matrix in Q1_0, token embedding and LM head included, as the real
  Bonsai 1-bit files keep them (build's llama-quantize), and a DSpark drafter for it: dflash with
  a Markov head of rank 256 (the published drafters'), 3 layers at the target's width, block 4,
  Q4_0, and no token_embd/output of its own: it borrows the target's Q1_0 head and embedding as
  the real drafters do (tiny_gguf borrow_head), so each draft passes through the 151936-row
  Q1_0 head.
- hybrid: a synthetic Bonsai 2 2B (qwen35, 18 delta-net + 6 attention layers, V=248320, every
  matrix ternary with the tied head, folded by the published rules, served as the Q2_0 repack
  `bonsai start` serves; benchmarks/bonsai2_2b_target.py) with a grafted Q8_0 MTP block, drafted
  by llama-server's draft-mtp at n-max 1, 2 and 3.

Per target and draft length, with this checkout's build (BONSAI_LLAMA_SERVER=PATH runs another,
an earlier patch series' for a before/after) and LLAMA_ARG_THREADS=--threads:
- `bonsai bench --model T [--drafter D] --configs plain,SPEC` (T=0, completion API, 96 tokens,
  6 prompts x 3 repeats): plain and speculative decode tok/s (the server's own timings) at
  100% acceptance, and their ratio;
- the estimate at a per-token acceptance a: a cycle drafts g tokens and costs about the same
  whatever is accepted, so speed scales with the expected tokens per cycle,
  E(a) = 1 + a + ... + a^g (accepted until the first miss, plus the verify's own token), over
  the g + 1 a perfect cycle yields: ratio(a) = ratio(1) x E(a) / (g + 1). Break-even: ratio(a) = 1;
- `bonsai tune --model T [--drafter D] --configs plain,SPEC`: the verdict a user gets.

Run it only on a quiet machine, from the repo root, after `bonsai build`:

    python benchmarks/speculation_ceiling.py --json /var/tmp/bonsai-kernels/ceiling/ceiling.json

`--targets dense` or `--targets hybrid` runs one (each about 8-12 minutes on 2 cores). Writing
the models the first time takes about 6 minutes more and 6 GB of /var/tmp.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bonsai2_2b_target
from cpu_kernels import EXE, SHAPES, quantized_targets, run
from cpu_kernels import after_bin as bin_dir

import tiny_gguf

SHAPE = SHAPES["1.7b"]
TOKEN = 1000  # the one token each target and its drafter predict
BLOCK = 4  # Bonsai's DSpark drafters (v1): 4 drafted tokens per verify
MARKOV_RANK = 256  # the published DSpark drafters' (shared/reference/dspark-conversion.md)
MTP_N_MAX = (1, 2, 3)  # what `bonsai tune` measures for draft-mtp
ACCEPTANCE = (0.5, 0.6, 0.7, 0.8)


def dense_models(bins: Path, out: Path) -> tuple[Path, Path]:
    target = quantized_targets(bins, out, "const-1.7b", ["Q1_0"], all_matrices=True, constant_token=TOKEN, **SHAPE)
    drafter = out / f"const-1.7b-dspark-r{MARKOV_RANK}-borrowed-head-q4_0.gguf"
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
            markov_rank=MARKOV_RANK,
            constant_token=TOKEN,
            borrow_head=True,
        )
        run([bins / f"llama-quantize{EXE}", f32, drafter, "Q4_0"])
        f32.unlink()
    return target["Q1_0"], drafter


def bonsai(*args: object, env: dict[str, str]) -> dict:
    out = run([sys.executable, "-m", "bonsai_launch", *args, "--json"], env={**os.environ, **env})
    return json.loads(out.stdout)


def measure(target: Path, drafter: Path | None, spec: str, n_max: int | None, work: Path, threads: int) -> dict:
    env = {"LLAMA_ARG_THREADS": str(threads), **({"BONSAI_SPEC_NMAX": str(n_max)} if n_max else {})}
    pair = ["--model", target, *(["--drafter", drafter] if drafter else [])]
    bench = bonsai(
        "bench", *pair, "--configs", f"plain,{spec}",
        "--api", "completion", "--temps", "0", "--max-tokens", "96", "--repeats", "3",
        "--per-category", "1", "--concurrency", "1", "--no-tradeoffs", "--no-chart", "--out", work,
        env=env,
    )  # fmt: skip
    pooled = {r["config"]: r for r in bench["results"] if r["category"] == "all"}
    plain, fast = pooled["plain"], pooled[spec]
    ratio = fast["decode_tps"]["median"] / plain["decode_tps"]["median"]
    drafted = n_max or BLOCK
    return {
        "config": spec if not n_max else f"{spec}/n{n_max}",
        "drafted": drafted,
        "plain_tps": plain["decode_tps"]["median"],
        "spec_tps": fast["decode_tps"]["median"],
        "acceptance": fast["acceptance_rate"],
        "ratio_at_100": ratio,
        "ratio_estimated": {f"{a:.2f}": ratio * expected_tokens(a, drafted) / (drafted + 1) for a in ACCEPTANCE},
        "break_even_acceptance": break_even(ratio, drafted),
        "load_average": bench["environment"].get("load_average_start"),
    }


def tune(target: Path, drafter: Path | None, spec: str, threads: int) -> dict:
    pair = ["--model", target, *(["--drafter", drafter] if drafter else [])]
    out = bonsai(
        "tune", *pair, "--configs", f"plain,{spec}", "--max-tokens", "96", env={"LLAMA_ARG_THREADS": str(threads)}
    )
    return out["decision"]["choice"]


def expected_tokens(acceptance: float, drafted: int) -> float:
    """Tokens one verify cycle yields when each drafted token is accepted with this
    probability until the first miss, plus the verify's own token."""
    return sum(acceptance**k for k in range(drafted + 1))


def break_even(ratio_at_100: float, drafted: int) -> float | None:
    """The acceptance below which speculation is slower than plain, from the 100% ratio (None
    when even perfect drafts do not pay)."""
    if ratio_at_100 <= 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        slower = ratio_at_100 * expected_tokens(mid, drafted) / (drafted + 1) < 1
        lo, hi = (mid, hi) if slower else (lo, mid)
    return hi


def cpu() -> dict[str, object]:
    """The CPU's model name and the flags that pick kernels (what docs/benchmarks.md names)."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    picked = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    return {"model": model, "cores": os.cpu_count(), "flags": picked}


def table(rows: list[dict]) -> str:
    est = "".join(f" est. at {a:.0%} |" for a in ACCEPTANCE)
    lines = [
        f"| target | config | plain tok/s | at 100% tok/s | ratio |{est} break-even | `bonsai tune` |",
        "|---|---|---:|---:|---:|" + "---:|" * len(ACCEPTANCE) + "---:|---|",
    ]
    for r in rows:
        cells = "".join(f" {v:.2f}x |" for v in r["ratio_estimated"].values())
        even = "never" if r["break_even_acceptance"] is None else f"{r['break_even_acceptance']:.0%}"
        lines.append(
            f"| {r['target']} | {r['config']} | {r['plain_tps']:.1f} | {r['spec_tps']:.1f} "
            f"({r['acceptance']:.0%} accepted) | {r['ratio_at_100']:.2f}x |{cells} {even} | {r['tune']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bonsai-kernels/ceiling"))
    ap.add_argument("--targets", default="dense,hybrid")
    ap.add_argument("--mtp-n-max", default=",".join(map(str, MTP_N_MAX)), help="draft-mtp lengths (hybrid)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-tune", action="store_true", help="skip `bonsai tune` (it stores a decision)")
    ap.add_argument("--json", type=Path, help="write every number here too")
    args = ap.parse_args()
    bins, rows = bin_dir(), []
    for which in args.targets.split(","):
        if which == "dense":
            target, drafter = dense_models(bins, args.dir)
            plans: list[tuple[Path | None, str, int | None]] = [(drafter, "draft-dspark", None)]
            spec = "draft-dspark"
        else:
            target, drafter = bonsai2_2b_target.write(args.dir, log=lambda m: print(m, file=sys.stderr)), None
            plans = [(None, "draft-mtp", int(n)) for n in args.mtp_n_max.split(",")]
            spec = "draft-mtp"
        verdict = {} if args.no_tune else tune(target, drafter, spec, args.threads)
        for d, s, n in plans:
            r = measure(target, d, s, n, args.dir / f"bench-{which}-{s}{n or ''}", args.threads)
            rows.append({"target": which, **r, "tune": verdict.get("label", "-"), "tune_reason": verdict.get("reason")})
    info = cpu()
    print(f"\n{info['model']}, {info['cores']} cores, {args.threads} threads; flags: {' '.join(info['flags'])}")
    print(f"build: {bins}\n")
    print(table(rows))
    for which in dict.fromkeys(r["target"] for r in rows):
        r = next(r for r in rows if r["target"] == which)
        if r["tune_reason"]:
            print(f"- {which}: bonsai tune chose {r['tune']}: {r['tune_reason']}")
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": info, "threads": args.threads, "build": str(bins), "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
