"""PTQ1_0 served natively (patch 0013) against the same codes as the Q2_0 repack (issue 48).

Writes (once, kept under --dir) a PTQ1_0 file of a shape from the build's Q2_0 of a synthetic
F16 model (benchmarks/cpu_kernels.py writes those: every matrix Q2_0, embedding and head too):
each pair of Q2_0 blocks becomes one PTQ1_0 block, code +2 clamped to +1 and the first block's
scale kept (the values change, the shape and the codec's cost do not). Then the PTQ1_0 file's
lossless Q2_0 repack, made by the same code `bonsai start` uses on builds without the native
path (models/codec_repack.py): the two files hold the same codes. Then, per file:
- the weight memory llama-server holds: its resident set (VmRSS) after one request, with the
  KV cache kept small (-c 256) so the matrices dominate;
- llama-bench tg and pp1..pp16 at 2 threads (and 1 with --threads 1,2), c(n) per file.
Prints two markdown tables. Run it on a quiet machine, from the repo root, after `bonsai build`:

    python benchmarks/ptq1_0_memory.py --shape 1.7b --json /var/tmp/bonsai-kernels/ptq1_0.json

--shape 2b is the Bonsai 2 2B's dense part (hidden 2048, FFN 6144, 28 layers, vocab 248320);
--shape 27b the full 27B width and depth (hidden 5120, FFN 17408, 64 layers, vocab 248320):
its F16 source is 54 GB, so that shape is written as PTQ1_0 directly from random codes
(--synthetic-codes), without an F16 or Q2_0 file.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernels import EXE, after_bin, costs, llama_bench, quantized_targets

from bonsai_launch.models import codec_repack
from bonsai_launch.models import ternary_codecs as codecs

SHAPES = {
    "1.7b": dict(embedding=2048, layers=28, vocab=151936, ff=6144, heads=16, heads_kv=8, head_dim=128),
    "2b": dict(embedding=2048, layers=28, vocab=248320, ff=6144, heads=16, heads_kv=8, head_dim=128),
    "27b": dict(embedding=5120, layers=64, vocab=248320, ff=17408, heads=24, heads_kv=4, head_dim=256),
    "tiny": dict(embedding=256, layers=2, vocab=4096, ff=768, heads=4, heads_kv=2, head_dim=64),
}


def q2_0_pairs_to_ptq1_0(raw: bytes) -> bytes:
    """Q2_0 blocks (64 weights) two at a time as one PTQ1_0 block: codes clamped to 0..2, the
    first block's scale."""
    codes, d = codecs.decode_q2_0(raw)
    codes = np.minimum(codes, 2).reshape(-1, 128)
    return codecs.encode_ptq1_0(codes, d[0::2])


def to_ptq1_0(name: str, type_id: int, dims: tuple[int, ...], nbytes: int):
    if type_id != codecs.Q2_0 or dims[0] % 128:
        return None
    return codecs.PTQ1_0, nbytes // 36 * 28, q2_0_pairs_to_ptq1_0


def files(bins: Path, out: Path, shape: str, synthetic: bool) -> dict[str, Path]:
    """{"PTQ1_0": native file, "Q2_0 repack": its lossless repack (absent with `synthetic`)}"""
    ptq = out / f"qwen3-{shape}-ptq1_0-all{'-random' if synthetic else ''}.gguf"
    if not ptq.is_file():
        if synthetic:
            write_random_ptq1_0(ptq, **SHAPES[shape])
        else:
            q2 = quantized_targets(bins, out, f"qwen3-{shape}", ["Q2_0"], seed=1, layer_scale=1.0, **SHAPES[shape])
            codec_repack.rewrite(q2["Q2_0"], ptq, to_ptq1_0, file_type=codecs.PTQ1_0)
    if synthetic:
        return {"PTQ1_0": ptq}
    return {"PTQ1_0": ptq, "Q2_0 repack": codec_repack.repack(ptq)}


def write_random_ptq1_0(
    path: Path, *, embedding: int, layers: int, vocab: int, ff: int, heads: int, heads_kv: int, head_dim: int
) -> Path:
    """A qwen3 file of this shape whose every matrix is PTQ1_0 of random codes (scale 0.01),
    written a chunk at a time: the 27B shape's 5 GB never sits in memory, and it has no F16
    source (that would be 54 GB). The values mean nothing; the shape and the codec set the cost."""
    import struct

    from bonsai_launch.models import tiny_writer as tw

    kv = [("string", "general.name", path.stem), ("uint32", "general.file_type", codecs.PTQ1_0)]
    kv += tw.attention_kv(
        "qwen3", context_length=4096, embedding=embedding, layers=layers, ff=ff, heads=heads,
        heads_kv=heads_kv, head_dim=head_dim,
    )  # fmt: skip
    kv += tw.tokenizer_kv(vocab, "test", tw.DEFAULT_TOKEN_PREFIX, None)
    keys_only = tw.write(path.with_suffix(".keys.gguf"), "qwen3", kv, [])
    with open(keys_only, "rb") as f:
        import mmap

        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _, kvs, _, alignment, _ = codec_repack._read(buf, keys_only)
    keys_only.unlink()
    q, kvd, e = heads * head_dim, heads_kv * head_dim, embedding
    tensors: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (e, vocab), codecs.PTQ1_0)]
    tensors.append(("output_norm.weight", (e,), 0))  # F32
    for i in range(layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (e,), 0),
            (f"blk.{i}.attn_q.weight", (e, q), codecs.PTQ1_0),
            (f"blk.{i}.attn_k.weight", (e, kvd), codecs.PTQ1_0),
            (f"blk.{i}.attn_v.weight", (e, kvd), codecs.PTQ1_0),
            (f"blk.{i}.attn_output.weight", (q, e), codecs.PTQ1_0),
            (f"blk.{i}.attn_q_norm.weight", (head_dim,), 0),
            (f"blk.{i}.attn_k_norm.weight", (head_dim,), 0),
            (f"blk.{i}.ffn_norm.weight", (e,), 0),
            (f"blk.{i}.ffn_gate.weight", (e, ff), codecs.PTQ1_0),
            (f"blk.{i}.ffn_up.weight", (e, ff), codecs.PTQ1_0),
            (f"blk.{i}.ffn_down.weight", (ff, e), codecs.PTQ1_0),
        ]

    def nbytes(dims: tuple[int, ...], type_id: int) -> int:
        n = int(np.prod(dims))
        return n * 4 if type_id == 0 else n // 128 * 28

    header = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for _, raw in kvs:
        header += raw
    offset = 0
    for name, dims, type_id in tensors:
        header += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
        header += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", type_id, offset)
        offset += (nbytes(dims, type_id) + alignment - 1) // alignment * alignment
    header += b"\0" * ((-len(header)) % alignment)
    rng = np.random.default_rng(5)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as w:
        w.write(header)
        for _name, dims, type_id in tensors:
            size = nbytes(dims, type_id)
            start = w.tell()
            if type_id == 0:
                w.write(np.ones(int(np.prod(dims)), dtype=np.float32).tobytes())
            else:
                left = size // 28
                while left:
                    n = min(left, 1 << 20)
                    blocks = rng.integers(0, 243, size=(n, 28), dtype=np.uint8)
                    blocks[:, 26:] = scale
                    w.write(blocks.tobytes())
                    left -= n
            w.write(b"\0" * ((-(w.tell() - start)) % alignment))
    tmp.replace(path)
    return path


def server_rss(bins: Path, model: Path, threads: int, extra: tuple[str, ...] = ()) -> dict[str, float]:
    """llama-server's VmRSS after one completion (MiB), and its load time; `extra`: more flags."""
    port = 18000 + os.getpid() % 1000
    cmd = [bins / f"llama-server{EXE}", "-m", model, "-c", "256", "-t", threads, "--port", port, "--no-webui", *extra]
    start = time.time()
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        import urllib.request

        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited: {proc.stderr.read()[-2000:]}") from None
                time.sleep(0.05)  # the load time is read to within this
        loaded = time.time() - start
        body = json.dumps({"prompt": "one two three", "n_predict": 8}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024
        return {"rss_mib": rss, "load_s": loaded}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bonsai-kernels"))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--prompts", default="1,2,3,4,5,8,16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--synthetic-codes",
        action="store_true",
        help="write the PTQ1_0 file from random codes (no F16 source, no Q2_0 twin): the 27B shape's memory",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    bins = after_bin()
    pair = files(bins, args.dir, args.shape, args.synthetic_codes or args.shape == "27b")
    threads = [int(t) for t in args.threads.split(",")]
    mem = {label: server_rss(bins, path, threads[-1]) for label, path in pair.items()}
    if len(pair) == 1:  # the synthetic file: its memory against its size and KV cache, no twin
        path = pair["PTQ1_0"]
        print(f"## {path.name}: {path.stat().st_size / 2**30:.2f} GiB, llama-server -c 256")
        print(
            f"RSS after a request {mem['PTQ1_0']['rss_mib'] / 1024:.2f} GiB, loaded in {mem['PTQ1_0']['load_s']:.0f} s"
        )
        if args.json:
            args.json.write_text(json.dumps({"shape": args.shape, "memory": mem, "file_bytes": path.stat().st_size}))
        return
    speed = {label: llama_bench(bins, path, args.threads, args.prompts, 32, args.reps) for label, path in pair.items()}
    print(f"## PTQ1_0 native against its Q2_0 repack, {args.shape} shape\n")
    print("| file | size | llama-server RSS after a request | load |")
    print("|---|---:|---:|---:|")
    for label, path in pair.items():
        print(
            f"| {label} | {path.stat().st_size / 2**20:.0f} MiB | {mem[label]['rss_mib']:.0f} MiB | "
            f"{mem[label]['load_s']:.1f} s |"
        )
    ratio = mem["PTQ1_0"]["rss_mib"] / mem["Q2_0 repack"]["rss_mib"]
    print(f"\nRSS, PTQ1_0 / Q2_0 repack: {ratio:.2f}x")
    for th in threads:
        print(f"\n### {th} thread{'s' if th > 1 else ''}: tok/s and c(n)\n")
        ns = sorted(costs(speed["PTQ1_0"], th))
        print("| file | tg | " + " | ".join(f"pp{n}" for n in ns) + " | " + " | ".join(f"c({n})" for n in ns) + " |")
        print("|---|" + "---:|" * (1 + 2 * len(ns)))
        for label in pair:
            r = speed[label]
            c = costs(r, th)
            print(
                f"| {label} | {r[(th, 'tg')]:.1f} | "
                + " | ".join(f"{r[(th, f'pp{n}')]:.1f}" for n in ns)
                + " | "
                + " | ".join(f"{c[n]:.2f}" for n in ns)
                + " |"
            )
        tg = speed["PTQ1_0"][(th, "tg")] / speed["Q2_0 repack"][(th, "tg")]
        print(f"\ndecode, PTQ1_0 / Q2_0 repack: {tg:.2f}x")
    if args.json:
        flat = {k: {f"t{t}-{n}": v for (t, n), v in r.items()} for k, r in speed.items()}
        args.json.write_text(json.dumps({"shape": args.shape, "memory": mem, "bench": flat}, indent=1))


if __name__ == "__main__":
    main()
