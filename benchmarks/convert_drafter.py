"""Time and peak memory of `bonsai convert-drafter` on a generated drafter of realistic shape.

The published Bonsai 27B drafter (`*-dspark-bf16.gguf`, 7.3 GB) has E=5120, F=5120, 6 layers,
V=248320, Markov rank 256, 40/4 heads of 128, five target layers and the log-SNR tensors. This
script writes a legacy file of that shape (tensor bytes are a repeated random block: the
conversion copies bytes and never looks at values), a header-only target with a 248320-token
vocabulary and 64 layers, then runs, each as its own process:

1. `bonsai convert-drafter --quantize none` (the conversion itself: read, rename, copy), and
2. `llama-quantize CONVERTED OUT Q4_0` (the quantize step bonsai runs next),

and reports wall time and peak RSS of each (its own VmHWM, sampled every 10 ms), plus
the sizes. `--vocab`, `--embedding`, `--layers` shrink the shape for a machine that cannot hold
the full file (disk: source + converted + quantized, about 10 GB at full size); time and disk
scale with the source's bytes, and peak RSS should not (that is what this measures).

Run it only on a quiet machine (nothing else on the cores), e.g.:

    python benchmarks/convert_drafter.py --dir /var/tmp/bonsai-bench --json > convert.json
    python benchmarks/convert_drafter.py --vocab 65536 --layers 2       # a smaller, quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

BLOCK = 16 * 2**20


def _write_streamed(writer: GGUFWriter, tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]]) -> None:
    """Write header and tensor infos with GGUFWriter, then every tensor's bytes block by block."""
    # valid BF16 values (llama-quantize refuses NaNs): the upper halves of random float32s
    values = np.random.default_rng(0).standard_normal(BLOCK // 4, dtype=np.float32) * 0.02
    pattern = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes() * 2
    sizes = []
    for name, ne, qtype in tensors:
        nbytes = int(np.prod(ne)) * (2 if qtype == GGMLQuantizationType.BF16 else 4)
        sizes.append(nbytes)
        writer.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    out = writer.fout[0]
    align = writer.data_alignment
    out.write(b"\0" * (-out.tell() % align))
    for nbytes in sizes:
        left = nbytes
        while left:
            n = min(left, BLOCK)
            out.write(pattern[:n])
            left -= n
        out.write(b"\0" * (-nbytes % align))
    writer.close()


def write_legacy(
    path: Path,
    *,
    e: int,
    f: int,
    layers: int,
    vocab: int,
    rank: int,
    heads: int,
    heads_kv: int,
    head_dim: int,
    target_layers: list[int],
) -> None:
    w = GGUFWriter(str(path), "dspark")
    w.add_string("general.name", "generated Bonsai-27B-dspark shape")
    for key, val in (
        ("block_count", layers),
        ("context_length", 4096),
        ("embedding_length", e),
        ("feed_forward_length", f),
        ("attention.head_count", heads),
        ("attention.head_count_kv", heads_kv),
        ("attention.key_length", head_dim),
        ("attention.value_length", head_dim),
        ("vocab_size", vocab),
    ):
        w.add_uint32(f"dspark.{key}", val)
    w.add_float32("dspark.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("dspark.rope.freq_base", 1e7)
    w.add_string("tokenizer.ggml.model", "none")
    w.add_uint32("dspark.dspark.block_size", 4)
    w.add_uint32("dspark.dspark.mask_token_id", vocab - 1)
    w.add_key_value("dspark.dspark.target_layers", target_layers, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    w.add_uint32("dspark.dspark.markov_rank", rank)
    w.add_bool("dspark.dspark.confidence_head", True)
    w.add_bool("dspark.dspark.confidence_head_with_markov", True)
    w.add_bool("dspark.dspark.log_snr_conditioning", True)
    w.add_float32("dspark.dspark.min_log_snr", -9.0)
    w.add_float32("dspark.dspark.max_log_snr", 9.0)
    BF, F32 = GGMLQuantizationType.BF16, GGMLQuantizationType.F32
    q, kv = heads * head_dim, heads_kv * head_dim
    tensors = [
        ("token_embd.weight", (e, vocab), BF),
        ("output.weight", (e, vocab), BF),
        ("output_norm.weight", (e,), F32),
        ("dspark.fc.weight", (len(target_layers) * e, e), BF),
        ("dspark.hidden_norm.weight", (e,), F32),
        ("dspark.markov_head_a.weight", (rank, vocab), BF),
        ("dspark.markov_head_b.weight", (rank, vocab), BF),
        ("dspark.confidence_head.weight", (e + rank, 1), BF),
        ("dspark.confidence_head.bias", (1,), F32),
        ("dspark.log_snr_fc1.weight", (128, e), BF),
        ("dspark.log_snr_fc1.bias", (e,), F32),
        ("dspark.log_snr_fc2.weight", (e, e), BF),
        ("dspark.log_snr_fc2.bias", (e,), F32),
    ]
    for i in range(layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (e,), F32),
            (f"blk.{i}.attn_q.weight", (e, q), BF),
            (f"blk.{i}.attn_k.weight", (e, kv), BF),
            (f"blk.{i}.attn_v.weight", (e, kv), BF),
            (f"blk.{i}.attn_output.weight", (q, e), BF),
            (f"blk.{i}.attn_q_norm.weight", (head_dim,), F32),
            (f"blk.{i}.attn_k_norm.weight", (head_dim,), F32),
            (f"blk.{i}.ffn_norm.weight", (e,), F32),
            (f"blk.{i}.ffn_gate.weight", (e, f), BF),
            (f"blk.{i}.ffn_up.weight", (e, f), BF),
            (f"blk.{i}.ffn_down.weight", (f, e), BF),
        ]
    _write_streamed(w, tensors)


def write_target_header(path: Path, *, e: int, layers: int, vocab: int) -> None:
    """A target with the real vocabulary size and no weights: the converter reads only its keys."""
    w = GGUFWriter(str(path), "qwen3")
    w.add_uint32("qwen3.block_count", layers)
    w.add_uint32("qwen3.embedding_length", e)
    w.add_uint32("qwen3.context_length", 262144)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_array("tokenizer.ggml.tokens", [f"<tok{i}>" for i in range(vocab)])
    w.add_array("tokenizer.ggml.token_type", [1] * vocab)
    w.add_array("tokenizer.ggml.merges", [f"a{i} b{i}" for i in range(min(vocab, 247587))])
    w.add_uint32("tokenizer.ggml.eos_token_id", vocab - 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    out = w.fout[0]
    out.write(b"\0" * (-out.tell() % w.data_alignment))  # an empty, aligned data section
    w.close()


def _hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def measure(argv: list[str], env: dict[str, str]) -> dict:
    """Wall time and peak RSS of one process.

    Peak RSS is the process's own high-water mark (VmHWM in /proc, Linux), read every 10 ms
    until it exits. wait4's ru_maxrss would be wrong here: a child inherits the parent's
    high-water mark across fork and exec, so it reports at least this script's own size.
    """
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _hwm_kib(proc.pid) or 0)
        time.sleep(0.01)
    seconds = time.monotonic() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-2000:]}")
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(peak / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedding", type=int, default=5120)
    ap.add_argument(
        "--ff", type=int, default=None, help="feed-forward size (default: the embedding size, as the 27B drafter)"
    )
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--no-quantize", action="store_true", help="skip the llama-quantize step")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    e, f = args.embedding, args.ff or args.embedding
    heads, head_dim = max(1, e // 128), 128 if e >= 128 else e
    heads_kv = max(1, heads // 10)
    work = Path(tempfile.mkdtemp(prefix="bonsai-convert-bench-", dir=args.dir))
    legacy, target, converted, quantized = (
        work / n for n in ("legacy-dspark-bf16.gguf", "target.gguf", "converted.gguf", "converted-Q4_0.gguf")
    )
    try:
        t0 = time.monotonic()
        write_legacy(
            legacy,
            e=e,
            f=f,
            layers=args.layers,
            vocab=args.vocab,
            rank=args.rank,
            heads=heads,
            heads_kv=heads_kv,
            head_dim=head_dim,
            target_layers=[1, 16, 31, 46, 61],
        )
        write_target_header(target, e=e, layers=64, vocab=args.vocab)
        generate = round(time.monotonic() - t0, 1)
        env = dict(os.environ)
        convert = measure(
            [
                sys.executable,
                "-m",
                "bonsai_launch",
                "convert-drafter",
                str(legacy),
                "--target",
                str(target),
                "-o",
                str(converted),
                "--quantize",
                "none",
            ],
            env,
        )
        result = {
            "shape": {"embedding": e, "ff": f, "layers": args.layers, "vocab": args.vocab, "rank": args.rank},
            "source_bytes": legacy.stat().st_size,
            "converted_bytes": converted.stat().st_size,
            "generate_seconds": generate,
            "convert": convert,
        }
        result["convert"]["mb_per_s"] = round(legacy.stat().st_size / 1e6 / max(convert["seconds"], 1e-9), 1)
        if not args.no_quantize:
            from bonsai_launch.models.drafters.quantize import find_quantize

            result["quantize_q4_0"] = measure([str(find_quantize()), str(converted), str(quantized), "Q4_0"], env)
            result["quantized_bytes"] = quantized.stat().st_size
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    print(
        f"shape E={e} F={f} layers={args.layers} V={args.vocab} R={args.rank}: source {gb(result['source_bytes'])}, "
        f"converted {gb(result['converted_bytes'])}"
        + (f", Q4_0 {gb(result['quantized_bytes'])}" if "quantized_bytes" in result else "")
    )
    print(f"convert-drafter: {convert['seconds']} s ({convert['mb_per_s']} MB/s), peak RSS {convert['peak_rss_mb']} MB")
    if "quantize_q4_0" in result:
        q = result["quantize_q4_0"]
        print(f"llama-quantize Q4_0: {q['seconds']} s, peak RSS {q['peak_rss_mb']} MB")


if __name__ == "__main__":
    main()
