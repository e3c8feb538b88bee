"""Bonsai 2 on our build: the fold's cost, each codec's memory, and speed against Q4_0 (issue 36).

Writes (once, kept under --dir) a synthetic qwen35 hybrid at a Bonsai 2 layer shape (3 delta-net
layers and 1 attention layer; --shape 1.7b: E=2048, FF 6144, 16 value/key heads of 128, 16/4
attention heads; random weights: the shape sets the cost, the values do not), then:
- `plain-Q2_0`: the layer matrices ternary (PrismML's quantizer, one scale per 128) in the plain
  basis, written as mainline Q2_0;
- `folded-Q2_0`: the same model folded by the published rules (block 1024), quantized the same
  way, as PQ2_0, repacked by bonsai into Q2_0 (what `bonsai start` serves): the fold's cost is
  folded against plain, the same codec and shapes with and without the transforms;
- `Q4_0`: the plain model through the build's llama-quantize (token_embd and output kept F32,
  as in the ternary files, so that every row has the same LM head);
and runs llama-bench (tg, pp1, pp5, pp64, pp512 at 1 and 2 threads) on each, printing a markdown
table. It also prints each codec's bytes for the folded model's layer matrices (PQ2_0, PTQ1_0 and
the Q2_0 repack). Run it on a quiet machine, from the repo root:

    python benchmarks/bonsai2_fold.py --shape 1.7b --json /var/tmp/bonsai-fold/result.json

--shape 4b and 9b are Qwen3.5-4B's and 9B's layer shapes (attention heads of 256 written as twice
as many of 128, the same matrices): the 4B's residual (2560) is a multiple of 512, not of 1024, so
its fold uses block 512 and, as the 2026-12-05 reading infers, a tied LM head (version 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernels import EXE, after_bin, llama_bench, run

import hadamard_fold
from bonsai_launch.models import codec_repack
from bonsai_launch.models import ternary_codecs as codecs

SHAPES = {
    "1.7b": dict(embedding=2048, ff=6144, heads=16, heads_kv=4, head_dim=128, state=128, k_heads=16, v_heads=16),
    "4b": dict(
        embedding=2560,
        ff=9216,
        heads=32,
        heads_kv=8,
        head_dim=128,
        state=128,
        k_heads=16,
        v_heads=32,
        block=512,
        tied=True,
    ),
    "9b": dict(embedding=4096, ff=12288, heads=32, heads_kv=8, head_dim=128, state=128, k_heads=16, v_heads=32),
    "tiny": dict(embedding=1024, ff=2048, heads=8, heads_kv=2, head_dim=128, state=128, k_heads=4, v_heads=8),
}
LAYERS = dict(layers=4, full_attention_interval=4, vocab=4096, mode="counter", layer_scale=0.02)


def _q2_0_of(path: Path, out: Path) -> Path:
    """Layer matrices (F32) as ternary Q2_0 with one scale per 128 weights (a PQ2_0 block's)."""

    def convert(name: str, type_id: int, dims: tuple[int, ...], nbytes: int):
        if not (name.startswith("blk.") and name.split(".")[-2] in hadamard_fold.TERNARY and type_id == 0):
            return None
        weights = nbytes // 4

        def encode(raw: bytes) -> bytes:
            c, d = hadamard_fold.ternary_codes(np.frombuffer(raw, dtype="<f4"))
            return codecs.encode_q2_0(c.reshape(-1, 64), np.repeat(d, 2))

        return codecs.Q2_0, weights // 64 * 18, encode

    return codec_repack.rewrite(path, out, convert)


def files(folder: Path, shape: str, bin_dir: Path) -> tuple[dict[str, Path], dict[str, int]]:
    folder.mkdir(parents=True, exist_ok=True)
    dims = {**SHAPES[shape], **LAYERS}
    plain_f32 = folder / f"{shape}-plain-F32.gguf"
    folded_f32 = folder / f"{shape}-folded-F32.gguf"
    if not folded_f32.is_file():
        pair = hadamard_fold.write_fold_pair(folder, shape=dims)
        pair.plain.replace(plain_f32)
        pair.folded.replace(folded_f32)
        pair.unfolded.unlink()
    out = {"plain-Q2_0": folder / f"{shape}-plain-Q2_0.gguf", "Q4_0": folder / f"{shape}-plain-Q4_0.gguf"}
    if not out["plain-Q2_0"].is_file():
        _q2_0_of(plain_f32, out["plain-Q2_0"])
    if not out["Q4_0"].is_file():
        # the LM head and embedding stay F32 as in the ternary files, so the rows compare layer kernels
        quantize = [bin_dir / f"llama-quantize{EXE}", "--output-tensor-type", "f32", "--token-embedding-type", "f32"]
        run([*quantize, plain_f32, out["Q4_0"], "Q4_0"])
    pq2 = folder / f"{shape}-folded-PQ2_0.gguf"
    ptq1 = folder / f"{shape}-folded-PTQ1_0.gguf"
    if not pq2.is_file():
        hadamard_fold.write_ternary(None, pq2, codecs.PQ2_0, source=folded_f32)
    if not ptq1.is_file():
        hadamard_fold.write_ternary(None, ptq1, codecs.PTQ1_0, source=folded_f32)
    repacked = folder / f"{shape}-folded-as-Q2_0.gguf"
    if not repacked.is_file():
        codec_repack.rewrite(pq2, repacked, codec_repack.fork_to_q2_0, file_type=codec_repack.MOSTLY_Q2_0)
    out["folded-Q2_0"] = repacked
    sizes = {k: p.stat().st_size for k, p in (("PQ2_0", pq2), ("PTQ1_0", ptq1), ("Q2_0 repack", repacked))}
    return out, sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bonsai-fold"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="1,5,64,512")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    bin_dir = after_bin()
    models, sizes = files(args.dir / args.shape, args.shape, bin_dir)
    results = {}
    for name in ("plain-Q2_0", "folded-Q2_0", "Q4_0"):
        r = llama_bench(bin_dir, models[name], args.threads, args.prompts, args.gen, args.reps)
        results[name] = {f"{t}:{k}": v for (t, k), v in r.items()}
    tests = ["tg"] + [f"pp{p}" for p in args.prompts.split(",")]
    print(f"| type ({args.shape} layer shape, 4 layers) | threads | " + " | ".join(tests) + " | file bytes |")
    print("|---|---:|" + "---:|" * (len(tests) + 1))
    for name in results:
        for t in args.threads.split(","):
            cells = [f"{results[name].get(f'{t}:{k}', float('nan')):.1f}" for k in tests]
            print(f"| {name} | {t} | " + " | ".join(cells) + f" | {models[name].stat().st_size:,} |")
    for t in args.threads.split(","):
        plain, folded = results["plain-Q2_0"][f"{t}:tg"], results["folded-Q2_0"][f"{t}:tg"]
        print(f"fold cost of a decode step, {t} thread(s): {100 * (plain / folded - 1):+.1f}%")
    print("codec bytes of the folded model (whole file): " + ", ".join(f"{k} {v:,}" for k, v in sizes.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"shape": args.shape, "results": results, "sizes": sizes}, indent=1))


if __name__ == "__main__":
    main()
