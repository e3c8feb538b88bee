"""Before/after tables for Bonsai's formats on the CPU kernels (issues 24 and 49: patches 0005-0006,
0011).

Writes (once, kept under --dir) a synthetic qwen3 model at the Qwen3-1.7B shape (E=2048, 28
layers, FF 6144, 16/8 heads of 128, V=151936; random F16 weights: the shape sets the cost, the
values do not), quantizes it with the build's llama-quantize to each type, every matrix in that
type, token embedding and LM head included, as the real Bonsai 1-bit files keep them
(`--keep-head-type` gives llama-quantize's default of a higher type for those two), then runs
llama-bench from the BEFORE build and the AFTER build on every file: tg and the prompt sizes
(default 1-9, 16, 64, 512) at threads 1 and 2, alternating which binary goes first. Prints:
- tok/s before and after, "effective bandwidth" (file size x tg) as a share of Q4_0's in the
  same binary and thread count, and as a share of this machine's read bandwidth (measured by
  benchmarks/read_bandwidth.c at the same thread count);
- the cost of an n-token batch in decode steps, c(n) = n x tg / pp_n, before and after, and the
  largest step between neighbours (a cliff) up to n = 9.
With --kl also the correctness yardstick: each quantized file against its own dequantized F16
twin (llama-perplexity --kl-divergence: top-1 agreement and mean KL), built into the AFTER
build's work folder if absent.

Run it only on a quiet machine (nothing else on the cores). The full run, from the repo root:

    python benchmarks/cpu_kernels.py --kl --json /var/tmp/bonsai-kernels/result.json

Expect about 35 minutes on a quiet 2-core machine (measured 2026-12-02, --kl included); the
BEFORE build's scalar Q2_0 takes a third of it even with its pp512 skipped (--long-budget).
The models and the twins' .kld
files stay in --dir, so a second run only benchmarks.

Patch 0011 (Q1_0/Q2_0 repacked sixteen rows at a time) against the previous series (patches
0001-0010, with the four-row 0008-0009): `--before BIN` of a build of that series (git worktree
of an earlier commit, `bonsai build` there). Against 0005-0006 alone, in one build:
`--before-no-repack` runs "before" with llama-bench's `--repack 0` for Q1_0 and Q2_0.

A quick proof that it works (tiny shape, about a minute):

    python benchmarks/cpu_kernels.py --shape tiny --threads 1 --prompts 1,5 --reps 1 --kl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import tiny_gguf

SHAPES = {
    # name: write_target keyword arguments
    "1.7b": dict(embedding=2048, layers=28, vocab=151936, ff=6144, heads=16, heads_kv=8, head_dim=128),
    "tiny": dict(embedding=256, layers=2, vocab=4096, ff=768, heads=4, heads_kv=2, head_dim=64),
}
BEFORE_KEY = "cpu-4a10ccecb885"  # the pin with patches 0001-0002 only (default --before)
EXE = ".exe" if os.name == "nt" else ""
REPACKED_BY_OURS = ("Q1_0", "Q2_0")  # patch 0011: --repack 0 gives back 0005-0006's vec_dot path
COST_UP_TO = 9  # c(n) cliffs are judged between neighbours up to this n
LONG = 256  # prompts this long run once: minutes each, and a long run averages its own noise


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("$ " + " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True, **kw)


def after_bin() -> Path:
    """The folder of this checkout's build, or of BONSAI_LLAMA_SERVER (a llama-server file or its
    folder) where set: the variable bonsai itself obeys, so one setting runs a benchmark and the
    `bonsai bench` it calls on another build (an earlier patch series)."""
    from bonsai_launch.llamacpp.builds import find_installed

    chosen = os.environ.get("BONSAI_LLAMA_SERVER")
    if chosen:
        path = Path(chosen).expanduser()
        return path if path.is_dir() else path.resolve().parent
    server = find_installed("cpu")
    if server is None:
        sys.exit("no build of this checkout: run `bonsai build` first")
    return server.resolve().parent


def models(bin_dir: Path, out: Path, shape: str, types: list[str], all_matrices: bool = True) -> dict[str, Path]:
    return quantized_targets(
        bin_dir, out, f"qwen3-{shape}", types, all_matrices=all_matrices, seed=1, layer_scale=1.0, **SHAPES[shape]
    )


def quantized_targets(
    bin_dir: Path, out: Path, stem: str, types: list[str], all_matrices: bool = True, **target: Any
) -> dict[str, Path]:
    """{type: STEM-type[-all].gguf}: tiny_gguf.write_target(**target) as F16 once, then each type
    made from it by the build's llama-quantize; every file is kept in `out` and reused. With
    all_matrices the token embedding and the LM head take the type too, as in the real Bonsai
    1-bit files (at the 1.7B shape the head alone is as large as a third of the layers)."""
    out.mkdir(parents=True, exist_ok=True)
    src = out / f"{stem}-f16.gguf"
    if not src.is_file():
        t = time.time()
        tiny_gguf.write_target(src, matrix_dtype=np.float16, **target)
        print(f"wrote {src} in {time.time() - t:.0f} s", file=sys.stderr)
    files = {}
    for qtype in types:
        dst = out / f"{stem}-{qtype.lower()}{'-all' if all_matrices else ''}.gguf"
        if not dst.is_file():
            same = ["--token-embedding-type", qtype.lower(), "--output-tensor-type", qtype.lower()]
            run([bin_dir / f"llama-quantize{EXE}", *(same if all_matrices else []), src, dst, qtype])
        files[qtype] = dst
    return files


def llama_bench(
    bin_dir: Path,
    model: Path,
    threads: str,
    prompts: str,
    gen: int,
    reps: int,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> dict[tuple[int, str], float]:
    """{(threads, "tg"|"ppN"): tok/s}; `env`: variables added to this run's environment
    (GGML_ROWS16_AMX=0, for instance)."""
    cmd = [
        bin_dir / f"llama-bench{EXE}",
        *extra,
        "-m",
        model,
        "-t",
        threads,
        "-p",
        prompts,
        "-n",
        gen,
        "-r",
        reps,
        "-o",
        "json",
    ]
    if env:
        print("  with " + " ".join(f"{k}={v}" for k, v in env.items()), file=sys.stderr)
    rows = json.loads(run(cmd, env={**os.environ, **env} if env else None).stdout)
    out = {}
    for r in rows:
        test = "tg" if r["n_gen"] > 0 else f"pp{r['n_prompt']}"
        out[(int(r["n_threads"]), test)] = float(r["avg_ts"])
    return out


def bench(
    bin_dir: Path,
    model: Path,
    threads: str,
    prompts: str,
    gen: int,
    reps: int,
    long_budget: float,
    extra: tuple[str, ...] = (),
) -> dict[tuple[int, str], float]:
    """The short tests (tg and prompts under LONG tokens) `reps` times in one llama-bench call;
    then each long prompt once per thread count, if the rate the largest short prompt reached
    says it ends within long_budget seconds. The scalar Q2_0 kernel of the build before the
    patches prefills 512 tokens in about 9 minutes on one thread: a number that adds nothing
    to its flat pp8/pp64 rate. A skipped test is absent and shows as "-" in the table."""
    sizes = [int(p) for p in prompts.split(",")]
    short = ",".join(str(p) for p in sizes if p < LONG)
    out = llama_bench(bin_dir, model, threads, short, gen, reps, extra) if short else {}
    for p in (p for p in sizes if p >= LONG):
        for t in threads.split(","):
            rate = out.get((int(t), f"pp{max((q for q in sizes if q < LONG), default=0)}"))
            if rate and p / rate > long_budget:
                print(
                    f"skipped pp{p} at {t} thread(s): about {p / rate / 60:.0f} min at {rate:.1f} tok/s",
                    file=sys.stderr,
                )
                continue
            out.update(llama_bench(bin_dir, model, t, str(p), 0, 1, extra))
    return out


def perplexity_bin(bin_dir: Path) -> Path:
    exe = bin_dir / f"llama-perplexity{EXE}"
    work = bin_dir.parent / "work"
    if not exe.is_file():
        built = work / "bin" / f"llama-perplexity{EXE}"
        if not built.is_file():  # one more target in the kept build folder, with the cmake that made it
            cache = (work / "CMakeCache.txt").read_text()
            cmake = re.search(r"^CMAKE_COMMAND:INTERNAL=(.+)$", cache, re.M)
            run([cmake.group(1) if cmake else "cmake", "--build", work, "--target", "llama-perplexity"])
        return built
    return exe


def kl_yardstick(bin_dir: Path, files: dict[str, Path], out: Path, threads: str) -> dict[str, dict[str, float]]:
    """Each file against its own dequantized F16 twin: what the kernels add to the format's loss."""
    ppl = perplexity_bin(bin_dir)
    text = out / "kl-text.txt"
    if not text.is_file():  # any text does for random weights; fixed, so runs are comparable
        rng = np.random.default_rng(3)
        text.write_text(" ".join(f"w{int(i)}" for i in rng.integers(0, 3000, 6000)))
    t = threads.split(",")[-1]
    result = {}
    for qtype, model in files.items():
        twin = out / f"{model.stem}-twin-f16.gguf"
        base = out / f"{model.stem}-twin.kld"
        if not base.is_file():
            if not twin.is_file():
                run([bin_dir / f"llama-quantize{EXE}", "--allow-requantize", model, twin, "F16"])
            run([ppl, "-m", twin, "-f", text, "-c", "128", "--chunks", "8", "-t", t, "--kl-divergence-base", base])
            twin.unlink()  # 3.4 GB at the 1.7B shape; the .kld file is what is reused
        proc = run(
            [
                ppl,
                "-m",
                model,
                "-f",
                text,
                "-c",
                "128",
                "--chunks",
                "8",
                "-t",
                t,
                "--kl-divergence-base",
                base,
                "--kl-divergence",
            ]
        )
        log = proc.stdout + proc.stderr
        kld = re.search(r"Mean\s+KLD:\s+([-\d.eE+]+)", log)
        top = re.search(r"Same top p:\s+([\d.]+)", log)
        result[qtype] = {
            "mean_kld": float(kld.group(1)) if kld else float("nan"),
            "same_top_pct": float(top.group(1)) if top else float("nan"),
        }
    return result


def read_bandwidth(threads: list[int], work: Path) -> dict[int, float]:
    """{threads: GB/s}: benchmarks/read_bandwidth.c, compiled here for this machine."""
    exe = work / f"read_bandwidth{EXE}"
    src = Path(__file__).with_name("read_bandwidth.c")
    if not exe.is_file() or exe.stat().st_mtime < src.stat().st_mtime:
        run([os.environ.get("CC", "cc"), "-O2", "-march=native", "-pthread", src, "-o", exe])
    return {t: float(run([exe, t]).stdout.split()[1]) for t in threads}


def costs(r: dict[tuple[int, str], float], th: int) -> dict[int, float]:
    """{n: c(n)}: an n-token batch's cost in decode steps, n x tg / pp_n."""
    tg = r.get((th, "tg"))
    out = {}
    for (t, test), rate in r.items():
        if t == th and test.startswith("pp") and tg and rate:
            n = int(test[2:])
            out[n] = n * tg / rate
    return dict(sorted(out.items()))


def cliff(c: dict[int, float]) -> float | None:
    """The largest c(n+1) - c(n) for n < COST_UP_TO, where both were measured."""
    steps = [c[n + 1] - c[n] for n in c if n < COST_UP_TO and n + 1 in c]
    return max(steps) if steps else None


def cost_table(results: dict, files: dict[str, Path], threads: list[int]) -> str:
    lines = []
    for th in threads:
        ns = sorted({n for q in files for w in results for n in costs(results[w][q], th)})
        lines.append(f"\n### c(n), {th} thread{'s' if th > 1 else ''} (decode steps, before -> after)\n")
        lines.append("| type | " + " | ".join(f"c({n})" for n in ns) + f" | largest step up to {COST_UP_TO} |")
        lines.append("|---|" + "---:|" * (len(ns) + 1))
        for qtype in files:
            c = {w: costs(results[w][qtype], th) for w in ("before", "after")}
            cells = [" -> ".join("-" if n not in c[w] else f"{c[w][n]:.2f}" for w in ("before", "after")) for n in ns]
            steps = " -> ".join("-" if cliff(c[w]) is None else f"{cliff(c[w]):.2f}" for w in ("before", "after"))
            lines.append(f"| {qtype} | " + " | ".join(cells) + f" | {steps} |")
    return "\n".join(lines)


def table(
    results: dict, files: dict[str, Path], tests: list[str], threads: list[int], bandwidth: dict[int, float]
) -> str:
    lines = []
    for th in threads:
        bw_note = f", read bandwidth {bandwidth[th]:.1f} GB/s" if th in bandwidth else ""
        lines.append(f"\n### {th} thread{'s' if th > 1 else ''} (tok/s, before -> after{bw_note})\n")
        lines.append("| type (file) | " + " | ".join(tests) + " | size x tg (GB/s) | vs Q4_0 | of read bandwidth |")
        lines.append("|---|" + "---:|" * (len(tests) + 3))
        q4 = {
            w: results[w].get("Q4_0", {}).get((th, "tg"), 0) * files["Q4_0"].stat().st_size / 1e9
            if "Q4_0" in files
            else 0
            for w in ("before", "after")
        }
        for qtype, model in files.items():
            size = model.stat().st_size
            cells = []
            for test in tests:
                b, a = (results[w][qtype].get((th, test)) for w in ("before", "after"))
                cells.append(f"{'-' if b is None else f'{b:.1f}'} -> **{'-' if a is None else f'{a:.1f}'}**")
            bw = {w: results[w][qtype].get((th, "tg"), 0) * size / 1e9 for w in ("before", "after")}
            share = " -> ".join(f"{100 * bw[w] / q4[w]:.0f}%" if q4[w] else "-" for w in ("before", "after"))
            of_read = " -> ".join(
                f"{100 * bw[w] / bandwidth[th]:.0f}%" if bandwidth.get(th) else "-" for w in ("before", "after")
            )
            shown = f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.2f} MB"
            lines.append(
                f"| {qtype} ({shown}) | "
                + " | ".join(cells)
                + f" | {bw['before']:.1f} -> {bw['after']:.1f} | {share} | {of_read} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dir", type=Path, default=Path("/var/tmp/bonsai-kernels"), help="models are written and kept here"
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    ap.add_argument("--types", default="Q4_0,TQ2_0,Q1_0,Q2_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="1,2,3,4,5,6,7,8,9,16,64,512")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of tg and prompts under 256 tokens")
    ap.add_argument(
        "--long-budget",
        type=float,
        default=180,
        help="seconds a long prompt (256+ tokens, run once) may take, judged from the largest short prompt's rate",
    )
    ap.add_argument(
        "--before", type=Path, help=f"bin folder of the build without the patches (default: builds/{BEFORE_KEY}/bin)"
    )
    ap.add_argument("--after", type=Path, help="bin folder of the patched build (default: this checkout's build)")
    ap.add_argument(
        "--before-no-repack",
        action="store_true",
        help="before = the after build with --repack 0 for Q1_0/Q2_0 (their vec_dot kernels, patches 0005-0006, "
        "without 0008-0009's repacked gemv/gemm); other types run as after, so their rows show the run's noise",
    )
    ap.add_argument(
        "--keep-head-type",
        action="store_true",
        help="token embedding and LM head at llama-quantize's default (higher) type, not the file's type",
    )
    ap.add_argument("--kl", action="store_true", help="also top-1 agreement and KL against each file's F16 twin")
    ap.add_argument("--json", type=Path, help="write every number here too")
    args = ap.parse_args()

    from bonsai_launch.core.paths import builds_dir

    after = args.after or after_bin()
    before = after if args.before_no_repack else args.before or builds_dir() / BEFORE_KEY / "bin"
    for label, d in (("--before", before), ("--after", after)):
        if not (d / f"llama-bench{EXE}").is_file():
            sys.exit(f"{label} {d}: no llama-bench there; pass the bin folder of a bonsai build")
    types = args.types.split(",")
    files = models(after, args.dir, args.shape, types, all_matrices=not args.keep_head_type)
    threads = [int(t) for t in args.threads.split(",")]
    bandwidth = read_bandwidth(threads, args.dir)
    results: dict = {"before": {}, "after": {}}
    for i, (qtype, model) in enumerate(files.items()):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")  # alternate who runs first
        for which in order:
            repack_off = which == "before" and args.before_no_repack and qtype in REPACKED_BY_OURS
            results[which][qtype] = bench(
                before if which == "before" else after,
                model,
                args.threads,
                args.prompts,
                args.gen,
                args.reps,
                args.long_budget,
                ("--repack", "0") if repack_off else (),
            )
    tests = ["tg"] + [f"pp{p}" for p in args.prompts.split(",")]
    before_label = f"{after} with --repack 0 for {'/'.join(REPACKED_BY_OURS)}" if args.before_no_repack else before
    print(f"## llama-bench, {args.shape} shape, before = {before_label}, after = {after}")
    print(table(results, files, tests, threads, bandwidth))
    print(cost_table(results, files, threads))
    kl = kl_yardstick(after, files, args.dir, args.threads) if args.kl else {}
    if kl:
        print("\n### Against each file's own F16 twin (after build; llama-perplexity -c 128 --chunks 8)\n")
        print("| type | same top-1 (%) | mean KL |\n|---|---:|---:|")
        for qtype, r in kl.items():
            print(f"| {qtype} | {r['same_top_pct']:.2f} | {r['mean_kld']:.6f} |")
    if args.json:
        flat = {
            w: {q: {f"t{t}-{n}": v for (t, n), v in r.items()} for q, r in res.items()} for w, res in results.items()
        }
        args.json.write_text(
            json.dumps(
                {
                    "shape": args.shape,
                    "read_bandwidth_gbs": bandwidth,
                    "all_matrices": not args.keep_head_type,
                    "bench": flat,
                    "kl": kl,
                    "sizes": {q: f.stat().st_size for q, f in files.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
