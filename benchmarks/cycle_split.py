"""Where a decode step and a speculative cycle spend their time on the CPU (issue 49).

Runs llama-server (this checkout's build, or BONSAI_LLAMA_SERVER's folder: an earlier patch
series' for a before/after) on the speculation ceiling's models (always-right drafts;
benchmarks/speculation_ceiling.py writes them), one request at a time, and samples the
server's MAIN thread with perf (`perf record -e cpu-clock --call-graph dwarf -t PID`: software
sampling, no hardware counters needed). The main thread runs the whole cycle in order: it drafts
(computing graph thread 0 of the drafter), verifies (thread 0 of the target's graph), samples,
and keeps the slot's books; the other compute thread works inside the same graphs. So its samples,
weighted by their period, are the cycle's wall time, and their stacks say what each part was:
- the phase, from the callers: common_speculative_draft (the drafter), common_speculative_process
  (the drafter reading the verified tokens: DSpark's target features into its KV, MTP's hidden
  states), server_context_impl::decode (the target's forward: the verify, or a plain step),
  common_sampler_*/llama_sampler_* (sampling on the CPU), llama_memory_seq_rm and state copies
  (rollback and checkpoints), and the rest (server bookkeeping);
- inside a graph, the op, from the kernel's name: the weight type's matmul (in a DSpark draft the
  target-type matmul is the borrowed LM head and a Q4_0 gemv is the Markov head, which since patch
  0020's Q4_0 tiles runs the layers' kernel and counts with them; in an MTP draft
  the ternary matmul is the tied LM head), top-k/argmax over the vocabulary, attention, delta-net,
  barrier waits (libgomp), graph setup (building, allocating, copying outputs).
Time the main thread was not on a CPU (blocked in a hand-off, or preempted by another thread on a
2-core machine) is the wall time minus the sampled time: "main thread off-CPU".
Per cycle = the request's generation time (the server's timings) / cycles, a cycle being one
target forward: plain, one per token; speculative, tokens - accepted drafts.

Also llama-bench's decode step (tg) and verify batch (pp of the cycle's size) on the same file
and thread count, the reference a server step is compared with. Run it on a quiet machine, from
the repo root, after the ceiling's models exist:

    python benchmarks/cycle_split.py --json /var/tmp/bonsai-kernels/ceiling/split.json

`--variant NAME="FLAGS"` also splits the speculative cycles with extra llama-server flags (a
candidate fix), interleaved with the unchanged launch; `--repeats N` runs every column N times,
interleaved, and shows medians (on a shared machine a neighbour spoils one repeat, not the
table). `--plain-server-args` adds flags to the plain runs. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bonsai2_2b_target
import speculation_ceiling as ceiling
from cpu_kernels import EXE, llama_bench
from cpu_kernels import after_bin as bin_dir
from split_classify import ROWS, classify, leaves, parse_perf_script

import tiny_gguf

PROMPT = "Write a long story about a lighthouse keeper."


def server_args(models: dict, spec: str | None, n_max: int, threads: int) -> list[str]:
    """The argv `bonsai start` plans for these files (-c smaller: the KV cache's size costs
    memory, not time; attention reads only the cells in use)."""
    args = ["-m", models["target"], "-ngl", "0", "-c", "4096", "-np", "1", "-t", str(threads), "--metrics"]
    if spec == "draft-dspark":
        args += ["-md", models["drafter"], "--spec-type", spec, "--spec-draft-n-max", str(n_max), "-ngld", "0"]
    elif spec == "draft-mtp":
        args += ["--spec-type", spec, "--spec-draft-n-max", str(n_max)]
    return [str(a) for a in args]


def thread_cpu(pid: int) -> dict[int, float]:
    """{thread id: CPU seconds so far} of a process (Linux /proc; empty elsewhere)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return out


def busy_cpu_s() -> float:
    """CPU seconds every process on the machine has used so far (Linux /proc/stat; 0 elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    busy = [int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4)]  # all but idle and iowait
    return sum(busy) / os.sysconf("SC_CLK_TCK")


def request(url: str, tokens: int, stream: bool) -> tuple[dict, float]:
    body = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "stream": stream, "cache_prompt": False}
    req = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as resp:
        if not stream:
            out = json.load(resp)
        else:
            out = {}
            for line in resp:  # server-sent events: the last one carries the timings
                if line.startswith(b"data: ") and b"timings" in line:
                    out = json.loads(line[6:])
    return out, time.monotonic() - t0


def profile(
    binary: Path, args: list[str], tokens: int, stream: bool, freq: int, work: Path, env: dict[str, str]
) -> dict:
    """Start llama-server, warm it up, then record its main thread through one request."""
    log = work / "server.log"
    load = float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").is_file() else None
    with tiny_gguf.serve(binary, args, log, timeout=600, env=env, request_timeout=600) as srv:
        request(srv.url, 16, stream)  # warm-up: first touches of the weights, graph reservations
        pid = srv.process.pid
        data = work / "perf.data"
        rec = subprocess.Popen(
            ["perf", "record", "-e", "cpu-clock", "-F", str(freq), "--call-graph", "dwarf,65528", "-t", str(pid),
             "-o", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # perf attaches
        before, client0, all0 = thread_cpu(pid), time.process_time(), busy_cpu_s()
        out, wall = request(srv.url, tokens, stream)
        after, client_cpu, everyone = thread_cpu(pid), time.process_time() - client0, busy_cpu_s() - all0
        rec.send_signal(2)
        rec.wait(timeout=120)
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "tid,period,ip,sym,dso"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    data.unlink()
    samples = parse_perf_script(script.stdout)
    t = out["timings"]
    accepted = t.get("draft_n_accepted", 0)
    cycles = t["predicted_n"] - accepted
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    busiest = sorted((v for tid, v in used.items() if tid != pid), reverse=True)
    return {
        "timings": t,
        "client_wall_s": wall,
        "cycles": cycles,
        "per_cycle_ms": (t["prompt_ms"] + t["predicted_ms"]) / (cycles + 1),  # + the prompt's forward
        "split_ms": {k: v / 1e6 / (cycles + 1) for k, v in classify(samples).items()},
        "samples": len(samples),
        "load_average": load,
        # CPU seconds during the request: the main thread, the busiest other server thread (the
        # other compute thread), the rest of the server's threads (HTTP, queue worker), the client
        "cpu_s": {
            "main": used.get(pid, 0.0),
            "compute worker": busiest[0] if busiest else 0.0,
            "other server threads": sum(busiest[1:]),
            "client (this script)": client_cpu,
            # everything else on the machine (perf's own unwinding copies included): a neighbour
            "other processes": max(0.0, everyone - sum(used.values()) - client_cpu),
            "wall": wall,
        },
        "leaves_ms": {r: [(f, ns / 1e6 / (cycles + 1)) for f, ns in top] for r, top in leaves(samples).items()},
    }


def bench_reference(binary_dir: Path, target: Path, threads: int, batches: list[int]) -> dict:
    r = llama_bench(binary_dir, target, str(threads), ",".join(map(str, batches)), 64, 3)
    tg = r[(threads, "tg")]
    return {"tg_tps": tg, "step_ms": 1000 / tg, **{f"pp{n}_ms": 1000 * n / r[(threads, f"pp{n}")] for n in batches}}


def table(runs: dict[str, dict]) -> str:
    names = list(runs)
    lines = ["| ms per cycle | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for row in ROWS:
        cells = [runs[n]["split_ms"].get(row, 0.0) for n in names]
        if any(c >= 0.05 for c in cells):
            lines.append(f"| {row} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    for label, key in (("sampled on the main thread", None), ("wall per cycle (server timings)", "per_cycle_ms")):
        vals = [runs[n][key] if key else sum(runs[n]["split_ms"].values()) for n in names]
        lines.append(f"| **{label}** | " + " | ".join(f"**{v:.2f}**" for v in vals) + " |")
    toks = [runs[n]["timings"]["predicted_n"] / runs[n]["cycles"] for n in names]
    lines.append("| tokens per cycle | " + " | ".join(f"{v:.2f}" for v in toks) + " |")
    tps = [runs[n]["timings"]["predicted_per_second"] for n in names]
    lines.append("| decode tok/s (server) | " + " | ".join(f"{v:.1f}" for v in tps) + " |")
    for key in ("compute worker", "other server threads", "client (this script)", "other processes"):
        share = [100 * runs[n]["cpu_s"][key] / runs[n]["cpu_s"]["wall"] for n in names]
        lines.append(f"| CPU of {key}, % of wall | " + " | ".join(f"{v:.0f}" for v in share) + " |")
    return "\n".join(lines)


def median_run(reps: list[dict]) -> dict:
    """One run from repeats: the median of each row, of the wall per cycle and of the speed
    (a busy neighbour on a shared machine spoils one repeat, not the table)."""
    rows = {r for rep in reps for r in rep["split_ms"]}
    out = dict(reps[len(reps) // 2])
    out["split_ms"] = {r: statistics.median(rep["split_ms"].get(r, 0.0) for rep in reps) for r in rows}
    out["per_cycle_ms"] = statistics.median(rep["per_cycle_ms"] for rep in reps)
    out["timings"] = dict(out["timings"])
    out["timings"]["predicted_per_second"] = statistics.median(rep["timings"]["predicted_per_second"] for rep in reps)
    out["repeats_tps"] = [rep["timings"]["predicted_per_second"] for rep in reps]
    out["repeats_load"] = [rep["load_average"] for rep in reps]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bonsai-kernels/ceiling"))
    ap.add_argument("--targets", default="dense,hybrid")
    ap.add_argument("--mtp-n-max", default="2", help="draft-mtp lengths to split (hybrid)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each column, interleaved; the table shows medians")
    ap.add_argument("--freq", type=int, default=999, help="perf samples per second of the main thread's CPU time")
    ap.add_argument("--no-stream", action="store_true", help="one JSON answer instead of server-sent events")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="also split the speculative cycles with these extra llama-server flags (repeatable), e.g. "
        "'no-bs=--no-spec-draft-backend-sampling'; interleaved with the unchanged launch",
    )
    ap.add_argument("--plain-server-args", default="", help="extra llama-server flags for the plain runs")
    ap.add_argument(
        "--server-env", default="", help="KEY=VALUE ... set for every llama-server (e.g. OMP_WAIT_POLICY=passive)"
    )
    ap.add_argument("--no-bench", action="store_true", help="skip the llama-bench reference")
    ap.add_argument("--no-plain", action="store_true", help="split only the speculative cycles")
    ap.add_argument(
        "--plain-both",
        action="store_true",
        help="split the plain step streamed and as one JSON answer (where the server's plain decode loses "
        "against llama-bench's)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    bins = bin_dir()
    binary = bins / f"llama-server{EXE}"
    variants = {"": []} | {v.split("=", 1)[0]: shlex.split(v.split("=", 1)[1]) for v in args.variant}
    env = dict(kv.split("=", 1) for kv in shlex.split(args.server_env))
    stream = not args.no_stream
    columns: dict[str, tuple[list[str], bool]] = {}  # column name -> (llama-server argv, streamed)
    refs: dict[str, dict] = {}
    targets = {}
    for which in args.targets.split(","):
        if which == "dense":
            target, drafter = ceiling.dense_models(bins, args.dir)
            models = {"target": target, "drafter": drafter}
            specs = [("draft-dspark", ceiling.BLOCK)]
        else:
            models = {"target": bonsai2_2b_target.write(args.dir)}
            specs = [("draft-mtp", int(n)) for n in args.mtp_n_max.split(",")]
        targets[which] = (models, specs)
        if not args.no_plain:
            plain = server_args(models, None, 0, args.threads) + shlex.split(args.plain_server_args)
            columns[f"{which} plain"] = (plain, stream)
            if args.plain_both:
                columns[f"{which} plain, {'one answer' if stream else 'streamed'}"] = (plain, not stream)
        for spec, n in specs:
            for vname, flags in variants.items():
                name = f"{which} {spec} n{n}" + (f" {vname}" if vname else "")
                columns[name] = (server_args(models, spec, n, args.threads) + flags, stream)
    reps: dict[str, list[dict]] = {name: [] for name in columns}
    info = ceiling.cpu()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, (argv, streamed) in columns.items():
                print(f"splitting {name} ({i + 1}/{args.repeats})", file=sys.stderr, flush=True)
                reps[name].append(profile(binary, argv, args.tokens, streamed, args.freq, Path(tmp), env))
            if args.json:  # what is done so far survives a timeout
                save(args.json, info, args.threads, {n: median_run(r) for n, r in reps.items()}, reps, refs)
    runs = {name: median_run(r) for name, r in reps.items()}
    if not args.no_bench:
        for which, (models, specs) in targets.items():
            batches = sorted({n + 1 for _, n in specs})
            refs[which] = bench_reference(bins, models["target"], args.threads, batches)
    print(f"\n{info['model']}, {info['cores']} cores, {args.threads} threads; flags: {' '.join(info['flags'])}")
    print(f"build: {bins}")
    print(f"variants: {variants}, plain: {args.plain_server_args!r}, env {env}, {args.repeats} repeat(s), medians")
    print(f"requests: {args.tokens} tokens, {'one JSON answer' if args.no_stream else 'streamed'}\n")
    print(table(runs))
    for name, run in runs.items():
        tps = ", ".join(f"{v:.1f}" for v in run["repeats_tps"])
        others = ", ".join(f"{100 * r['cpu_s']['other processes'] / r['cpu_s']['wall']:.0f}%" for r in reps[name])
        print(f"- {name}: tok/s per repeat {tps}; other processes' CPU (of one core) {others}")
    for which, ref in refs.items():
        cells = ", ".join(f"{k.removesuffix('_ms')} {v:.2f} ms" for k, v in ref.items() if k.endswith("_ms"))
        print(f"\nllama-bench, {which}: tg {ref['tg_tps']:.1f} tok/s; {cells}")
    if args.json:
        save(args.json, info, args.threads, runs, reps, refs)


def save(path: Path, info: dict, threads: int, runs: dict, reps: dict, refs: dict) -> None:
    doc = {
        "cpu": info,
        "threads": threads,
        "argv": sys.argv,
        "build": str(bin_dir()),
        "runs": runs,
        "repeats": reps,
        "llama_bench": refs,
    }
    path.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    os.environ.setdefault("LC_ALL", "C")
    main()
