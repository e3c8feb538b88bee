"""A synthetic Bonsai 2 2B for the CPU speculation benchmarks (issue 49): the qwen35 hybrid at
the 2B shape, every matrix ternary (token embedding included, tied LM head), folded by the
published rules, with a grafted MTP block, served as the Q2_0 repack `bonsai start` serves.

Shape: Qwen3.5-2B as third-party copies of its config give it (no Bonsai 2 2B file was seen):
E 2048, 24 layers with full attention every 4th (18 gated delta-net, 6 attention), FFN 6144,
attention 8 heads / 2 KV heads of 256 (64 rotary dimensions, sections [11, 11, 10]), delta-net
16 key and 16 value heads of 128, conv kernel 4, vocabulary 248320, tied embeddings. Types:
PrismML's small models are about 0.43 GB (shared/reference/bonsai-news-2026-11.md), which
only fits with the 509 M-weight embedding ternary too, so it is PQ2_0 here and the head reads
it (the fold's version 2, `tied_output`); the MTP block is Q8_0, as in the community's grafted
files (`...-PQ2_0-MTP-Q8_0.gguf`), and not folded.

Weights: "constant" (tiny_hybrid's mode): every back-projection into the residual stream is zero,
so the last hidden state is the input token's embedding, and the tied head makes one token win
for it: every row of token_embd is the same folded ternary vector, at scale d for TOKEN and d/2
for the others, so TOKEN scores exactly twice any other (a positive score: the state is that
vector). The MTP block keeps the token half of eh_proj and drafts TOKEN too: 100% acceptance.
The other matrices are random ternary codes: a random matrix rotated is a random matrix, so
drawing them in the folded basis costs what folding them would, without the 7 GB F32 model in
memory. The fold's keys, signs and names are real, so the build runs every transform a real
file needs.

Files (kept under the folder): SOURCE (int8 codes, deleted after), PQ2_0 (PrismML's codec), and
the served Q2_0 repack (codec_repack.fork_to_q2_0, the converter `bonsai start` uses).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import hadamard_fold
from bonsai_launch.models import codec_repack, ternary_codecs
from bonsai_launch.models import codec_types as codecs
from bonsai_launch.models import tiny_writer as tw

SHAPE = dict(
    embedding=2048, layers=24, interval=4, ff=6144, heads=8, heads_kv=2, head_dim=256, state=128, k_heads=16,
    v_heads=16, conv=4, vocab=248320, rope_dims=64, sections=[11, 11, 10, 0],
)  # fmt: skip
ARCH = "qwen35"
TOKEN = 1000  # what the target and its MTP block always say
LAYER_SCALE = 0.02  # d of the random ternary matrices (any value costs the same)
I8 = GGMLQuantizationType.I8
# (name, ggml dims, kind): kind "ternary" (random codes), "ternary-zero", "embd" (the tied constant
# head), "ones", "zeros", "rand" (F32), "ssm_a", "q8" / "q8-zero" / "q8-eh" (the MTP block)
Spec = tuple[str, tuple[int, ...], str]


def _ffn(i: int, e: int, ff: int, kind: str) -> list[Spec]:
    zero = "q8-zero" if kind == "q8" else "ternary-zero"
    return [(f"blk.{i}.ffn_gate.weight", (e, ff), kind), (f"blk.{i}.ffn_up.weight", (e, ff), kind),
            (f"blk.{i}.ffn_down.weight", (ff, e), zero)]  # fmt: skip


def _attention(i: int, s: dict, kind: str) -> list[Spec]:
    e, d = s["embedding"], s["head_dim"]
    zero = "q8-zero" if kind == "q8" else "ternary-zero"
    return [
        (f"blk.{i}.attn_norm.weight", (e,), "ones"), (f"blk.{i}.post_attention_norm.weight", (e,), "ones"),
        (f"blk.{i}.attn_q.weight", (e, 2 * s["heads"] * d), kind),  # query and its gate
        (f"blk.{i}.attn_k.weight", (e, s["heads_kv"] * d), kind),
        (f"blk.{i}.attn_v.weight", (e, s["heads_kv"] * d), kind),
        (f"blk.{i}.attn_output.weight", (s["heads"] * d, e), zero),
        (f"blk.{i}.attn_q_norm.weight", (d,), "ones"), (f"blk.{i}.attn_k_norm.weight", (d,), "ones"),
    ] + _ffn(i, e, s["ff"], kind)  # fmt: skip


def _delta_net(i: int, s: dict) -> list[Spec]:
    e, inner = s["embedding"], s["state"] * s["v_heads"]
    qkv = 2 * s["k_heads"] * s["state"] + inner
    return [
        (f"blk.{i}.attn_norm.weight", (e,), "ones"), (f"blk.{i}.post_attention_norm.weight", (e,), "ones"),
        (f"blk.{i}.attn_qkv.weight", (e, qkv), "ternary"), (f"blk.{i}.attn_gate.weight", (e, inner), "ternary"),
        (f"blk.{i}.ssm_conv1d.weight", (s["conv"], qkv), "rand"), (f"blk.{i}.ssm_dt.bias", (s["v_heads"],), "zeros"),
        (f"blk.{i}.ssm_a", (s["v_heads"],), "ssm_a"),
        (f"blk.{i}.ssm_beta.weight", (e, s["v_heads"]), "rand"), (f"blk.{i}.ssm_alpha.weight", (e, s["v_heads"]), "rand"),
        (f"blk.{i}.ssm_norm.weight", (s["state"],), "ones"), (f"blk.{i}.ssm_out.weight", (inner, e), "ternary-zero"),
    ] + _ffn(i, e, s["ff"], "ternary")  # fmt: skip


def tensor_specs(s: dict) -> list[Spec]:
    e, n = s["embedding"], s["layers"]
    out: list[Spec] = [("token_embd.weight", (e, s["vocab"]), "embd"), ("output_norm.weight", (e,), "ones")]
    for i in range(n):
        out += _attention(i, s, "ternary") if (i + 1) % s["interval"] == 0 else _delta_net(i, s)
    out += _attention(n, s, "q8") + [
        (f"blk.{n}.nextn.eh_proj.weight", (2 * e, e), "q8-eh"),
        (f"blk.{n}.nextn.enorm.weight", (e,), "ones"), (f"blk.{n}.nextn.hnorm.weight", (e,), "ones"),
        (f"blk.{n}.nextn.shared_head_norm.weight", (e,), "ones"),
    ]  # fmt: skip
    return out


def folded_names(specs: list[Spec], trunk: int) -> list[str]:
    """The trunk's ternary matrices (the MTP block is not folded; token_embd is the inverse)."""
    return [n for n, _, k in specs if k.startswith("ternary") and not n.startswith(f"blk.{trunk}.")]


def keys(s: dict, specs: list[Spec], signs: dict[int, np.ndarray]) -> list[tuple[str, str, object]]:
    kv: list[tuple[str, str, object]] = [("string", "general.name", "synthetic-bonsai2-2b-constant")]
    kv += tw.attention_kv(
        ARCH, context_length=32768, embedding=s["embedding"], layers=s["layers"] + 1, ff=s["ff"], heads=s["heads"],
        heads_kv=s["heads_kv"], head_dim=s["head_dim"], rope_base=1e7, rope_dims=s["rope_dims"],
    )  # fmt: skip
    kv += [
        ("array", f"{ARCH}.rope.dimension_sections", s["sections"]),
        ("uint32", f"{ARCH}.full_attention_interval", s["interval"]),
        ("uint32", f"{ARCH}.ssm.conv_kernel", s["conv"]),
        ("uint32", f"{ARCH}.ssm.state_size", s["state"]),
        ("uint32", f"{ARCH}.ssm.group_count", s["k_heads"]),
        ("uint32", f"{ARCH}.ssm.time_step_rank", s["v_heads"]),
        ("uint32", f"{ARCH}.ssm.inner_size", s["state"] * s["v_heads"]),
        ("uint32", f"{ARCH}.nextn_predict_layers", 1),
    ]
    kv += tw.tokenizer_kv(s["vocab"], "test", tw.DEFAULT_TOKEN_PREFIX, None)
    return kv + hadamard_fold.fold_kv(signs, folded_names(specs, s["layers"]), version=2, tied_output=True)


def embedding_row(e: int, signs: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(codes (e/128, 128), d) of the one folded vector every token embeds to: H(s * ones)."""
    return hadamard_fold.ternary_codes(hadamard_fold.fwht(signs[e] * np.ones(e)))


def _source_array(name: str, dims: tuple[int, ...], kind: str, rng: np.random.Generator, row: np.ndarray) -> np.ndarray:
    """The tensor as the source file holds it: int8 codes 0..2 for ternary matrices (encoded to
    PQ2_0 afterwards), quantized Q8_0 bytes for the MTP block, F32 for the rest."""
    shape = tuple(reversed(dims))
    if kind in ("ternary", "ternary-zero"):
        return rng.integers(0, 3, size=shape, dtype=np.int8)
    if kind == "embd":
        return np.broadcast_to(row.reshape(1, -1).astype(np.int8), shape)
    if kind.startswith("q8"):
        if kind == "q8-eh":
            data = np.zeros(shape, dtype=np.float32)
            data[:, : dims[1]] = np.eye(dims[1])  # numpy (out, in): keep the token half
        else:
            data = tw.zeros(*dims) if kind == "q8-zero" else tw.rand(rng, *dims, scale=LAYER_SCALE)
        return quantize(data, GGMLQuantizationType.Q8_0)
    if kind == "ssm_a":
        return -np.exp(tw.rand(rng, *dims, scale=0.5))
    if kind == "rand":
        return tw.rand(rng, *dims, scale=0.5)
    return tw.ones(*dims) if kind == "ones" else tw.zeros(*dims)


def _info(dims: tuple[int, ...], kind: str) -> tuple[tuple[int, ...], type, int, GGMLQuantizationType | None]:
    """(numpy shape, dtype, bytes, raw type) of a tensor in the source, without making it."""
    shape, n = tuple(reversed(dims)), int(np.prod(dims))
    if kind in ("ternary", "ternary-zero", "embd"):
        return shape, np.int8, n, I8
    if kind.startswith("q8"):
        return shape, np.float32, n // 32 * 34, GGMLQuantizationType.Q8_0
    return shape, np.float32, 4 * n, None


def write_source(path: Path, s: dict, seed: int = 0) -> dict[str, str]:
    """The int8-coded source, streamed (one tensor in memory at a time); returns {name: kind}."""
    specs = tensor_specs(s)
    signs = hadamard_fold.signs_for(sorted({s["embedding"], s["ff"]}), seed)
    codes, _ = embedding_row(s["embedding"], signs)
    writer = GGUFWriter(str(path), ARCH)
    for kind, key, value in keys(s, specs, signs):
        getattr(writer, f"add_{kind}")(key, value)
    for name, dims, kind in specs:
        shape, dtype, nbytes, raw = _info(dims, kind)
        writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = tw.rng(seed)
    for name, dims, kind in specs:
        writer.write_tensor_data(np.ascontiguousarray(_source_array(name, dims, kind, rng, codes)))
    writer.close()
    return {name: kind for name, _, kind in specs}


def _pq2_0(kinds: dict[str, str], e: int, d_embd: np.ndarray) -> codec_repack.Converter:
    """Source int8 codes -> PQ2_0: d = LAYER_SCALE (0 for the zero matrices), the embedding's
    per-block d for TOKEN's row and half of it for every other row."""

    def convert(name: str, type_id: int, dims: tuple[int, ...], nbytes: int):
        kind = kinds.get(name)
        if kind not in ("ternary", "ternary-zero", "embd"):
            return None
        size = dims[0] * dims[1] // 128 * codecs.BLOCKS[codecs.PQ2_0][1]
        at = [0]  # rows done: chunks arrive in order, whole rows at a time

        def encode(raw: bytes) -> bytes:
            c = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 128)
            if kind == "embd":
                rows = len(raw) // e
                scale = np.tile(d_embd / 2, rows).reshape(rows, -1)
                if at[0] <= TOKEN < at[0] + rows:
                    scale[TOKEN - at[0]] = d_embd
                at[0] += rows
                d = scale.reshape(-1)
            else:
                d = np.full(len(c), 0.0 if kind == "ternary-zero" else LAYER_SCALE, dtype=np.float32)
            return ternary_codecs.encode_pq2_0(c, d)

        return codecs.PQ2_0, size, encode

    return convert


def write(
    folder: Path, seed: int = 0, shape: dict | None = None, stem: str = "bonsai2-2b", log: Callable[[str], None] = print
) -> Path:
    """The served Q2_0 file (written once, reused): SOURCE -> PQ2_0 -> Q2_0 repack. `shape`
    overrides SHAPE (a small one checks the construction in seconds)."""
    s = {**SHAPE, **(shape or {})}
    folder.mkdir(parents=True, exist_ok=True)
    served = folder / f"{stem}-const-mtp-Q2_0.gguf"
    if served.is_file():
        return served
    pq2 = folder / f"{stem}-const-mtp-PQ2_0.gguf"
    if not pq2.is_file():
        source = folder / f"{stem}-const-mtp-i8.gguf"
        log(f"writing {source}")
        kinds = write_source(source, s, seed)
        signs = hadamard_fold.signs_for(sorted({s["embedding"], s["ff"]}), seed)
        _, d = embedding_row(s["embedding"], signs)
        log(f"encoding {pq2}")
        codec_repack.rewrite(source, pq2, _pq2_0(kinds, s["embedding"], d))
        source.unlink()
    log(f"repacking {served}")
    return codec_repack.rewrite(pq2, served, codec_repack.fork_to_q2_0, file_type=codec_repack.MOSTLY_Q2_0)
