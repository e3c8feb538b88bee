"""A tiny qwen35 target folded by PrismML's published rules (shared/reference/bonsai2-format.md).

`write_fold_pair` writes the same model twice: in the plain basis (F32), and folded, as Bonsai 2
files are: every folded weight row w stored as w' = H(s * w) per block of n along its input axis
(H the normalized Sylvester-Walsh-Hadamard matrix, s a +-1 vector per input width), token_embd's
rows the same way (the graph turns them back after the lookup), ssm_out's input columns first
moved from llama.cpp's tiled value heads [hd, nk, rep] to grouped [hd, rep, nk] (gdn_v_grouped),
and the prism.hadamard.* keys. A third file, `unfolded`, holds the folded weights without the
keys: a build that ignores the fold reads exactly that.

The shapes give three distinct sign widths at block 1024: 1024 (the residual stream's readers
and token_embd), 2048 (ffn_down) and 3072 (ssm_out and attn_output: 24 value heads of 128 over 4
key heads, so the permutation is not the identity), in one delta-net and one attention layer.
SHAPE_4B and SHAPE_9B are the Bonsai 2 4B's and 9B's widths at the same depth (what the format
allows beyond the 27B's block 1024: block 512 with a tied head, and a 4096-wide residual).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bonsai_launch.models import tiny_hybrid

BLOCK = 1024
SHAPE = dict(
    embedding=1024,
    ff=2048,
    layers=2,
    full_attention_interval=2,
    heads=24,
    heads_kv=2,
    head_dim=128,
    state=128,
    k_heads=4,
    v_heads=24,
    vocab=512,
    mode="counter",
    layer_scale=0.04,
)
# Qwen3.5-4B's widths (shared/reference/bonsai2-format.md, 2026-12-05): residual 2560, a multiple
# of 512 but not of 1024, so block 512; 16 key heads with 32 value heads of 128 (rep 2: ssm_out
# reads 4096); the LM head tied to token_embd (version 2). The FFN (1536, 3 x 512, not the 4B's
# 9216) and the attention (16 heads of 128: 2048) are narrower to keep the file ~300 MB; every
# width is still a multiple of 512 and two of them are not of 1024.
SHAPE_4B = dict(SHAPE, embedding=2560, ff=1536, heads=16, heads_kv=2, k_heads=16, v_heads=32, block=512, tied=True)
# Qwen3.5-9B's residual (4096) at block 1024, with 8 value heads over 4 key heads (rep 2) and a
# 2048-wide FFN: the widths 4096, 1024 and 2048, an untied head (version 1).
SHAPE_9B = dict(SHAPE, embedding=4096, ff=2048, heads=8, heads_kv=2, k_heads=4, v_heads=8)
# token-id prompts every fold test asks (the counter's run, a mixed one, a single token)
PROMPTS = ([10, 11, 12, 13, 14, 15, 16, 17], [300, 7, 7, 42, 199, 3], [5])
# what the fold rotates (the names of bonsai2-format.md; output.weight included)
FOLDED = (
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "attn_qkv",
    "attn_gate",
    "ssm_out",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
)


def fwht(x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """The normalized Walsh-Hadamard transform of the last axis, in blocks of `block` (float64)."""
    shape = x.shape
    y = x.astype(np.float64).reshape(-1, block)
    h = 1
    while h < block:
        y = y.reshape(-1, block // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = np.stack([a + b, a - b], axis=2)
        h *= 2
    return (y.reshape(shape) / np.sqrt(block)).astype(np.float64)


def grouped_columns(w: np.ndarray, hd: int, nk: int, rep: int) -> np.ndarray:
    """ssm_out's columns (numpy (out, in)) from tiled [hd, nk, rep] to grouped [hd, rep, nk]."""
    out = w.shape[0]
    return w.reshape(out, rep, nk, hd).transpose(0, 2, 1, 3).reshape(out, -1)


def signs_for(widths: list[int], seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed + 77)
    return {w: rng.choice(np.array([-1.0, 1.0]), size=w) for w in widths}


@dataclass(frozen=True)
class FoldPair:
    plain: Path
    folded: Path
    unfolded: Path
    widths: tuple[int, ...]
    # what the folded file was made of, to write variants of its keys
    kv: list = field(repr=False)
    plain_tensors: list = field(repr=False)
    folded_tensors: list = field(repr=False)
    names: list[str] = field(repr=False)
    signs: dict[int, np.ndarray] = field(repr=False)
    block: int = BLOCK
    tied: bool = False
    inverse: bool = True  # token_embd rotated (False: write_partial_fold's files)
    heads: tuple[int, int, int] = (128, 4, 6)  # ssm_out's value heads: (hd, nk, rep)

    def variant(self, path: Path, *, signs: dict[int, np.ndarray] | None = None, **keys) -> Path:
        """The folded file with other prism.hadamard.* keys (fold_kv's overrides)."""
        keys = {"block": self.block, "inverse": self.inverse, **keys}
        keys.update({"version": 2, "tied_output": True} if self.tied else {})
        return tiny_hybrid.write_parts(
            path, self.kv + fold_kv(signs or self.signs, self.names, **keys), self.folded_tensors
        )


def _widths(dims: dict) -> list[int]:
    return sorted({dims["embedding"], dims["ff"], dims["state"] * dims["v_heads"], dims["heads"] * dims["head_dim"]})


def _kind(name: str) -> str:
    return name.split(".")[-2] if name.startswith("blk.") else name.removesuffix(".weight")


def fold_tensors(
    tensors: list,
    signs: dict[int, np.ndarray],
    hd: int,
    nk: int,
    rep: int,
    trunk_layers: int = 2,
    block: int = BLOCK,
    kinds: tuple[str, ...] = (*FOLDED, "output", "token_embd"),
) -> tuple[list, list[str]]:
    """(tensors with the folded ones rotated, the names folded); `kinds`: what to fold."""
    out, names = [], []
    for name, data, extra in tensors:
        kind = _kind(name)
        in_trunk = ".nextn." not in name and not name.startswith(f"blk.{trunk_layers}.")
        folded = kind in kinds and (in_trunk or not name.startswith("blk."))
        if not folded or extra:
            out.append((name, data, extra))
            continue
        w = np.asarray(data, dtype=np.float64)
        if kind == "ssm_out":
            w = grouped_columns(w, hd, nk, rep)
        w = fwht(w * signs[w.shape[1]], block)
        out.append((name, w.astype(np.float32), {}))
        if kind != "token_embd":
            names.append(name)
    return out, names


def fold_kv(
    signs: dict[int, np.ndarray], names: list[str], *, grouped: bool = True, block: int = BLOCK, **override: object
) -> list:
    widths = sorted(signs)
    kv = [
        ("uint32", "prism.hadamard.version", override.get("version", 1)),
        ("uint32", "prism.hadamard.block_size", override.get("block_size", block)),
        ("string", "prism.hadamard.transform", override.get("transform", "normalized-sylvester-walsh-hadamard")),
        ("string", "prism.hadamard.axis", override.get("axis", "input-last-dimension")),
        ("string", "prism.hadamard.sign_mode", "explicit"),
        ("array", "prism.hadamard.sign_widths", override.get("sign_widths", widths)),
        ("array", "prism.hadamard.sign_values", [int(v) for w in widths for v in signs[w]]),
        ("array", "prism.hadamard.weight_names", override.get("weight_names", names)),
        ("array", "prism.hadamard.inverse_weight_names", ["token_embd.weight"]),
        ("bool", "prism.hadamard.gdn_v_grouped", grouped),
    ]
    if override.get("tied_output"):
        kv.append(("bool", "prism.hadamard.tied_output", True))
    if override.get("inverse") is False:  # nothing read through token_embd is rotated
        kv = [k for k in kv if k[1] != "prism.hadamard.inverse_weight_names"]
    return kv


def write_fold_pair(folder: Path, *, seed: int = 0, mtp: bool = False, shape: dict | None = None) -> FoldPair:
    """Plain, folded and folded-without-keys twins of one tiny qwen35 target (F32); `shape`
    overrides SHAPE (SHAPE_4B, SHAPE_9B; the benchmarks write Bonsai 2 layer shapes), with
    `block` the fold's block size and `tied` a version 2 file: no output.weight in either twin,
    so the LM head is token_embd (the plain twin's as it is, the folded one's through the fold)."""
    dims = {**SHAPE, **(shape or {})}
    block, tied = dims.pop("block", BLOCK), dims.pop("tied", False)
    kv, tensors = tiny_hybrid.hybrid_target_parts(**dims, seed=seed, mtp=mtp)
    if tied:
        tensors = [t for t in tensors if t[0] != "output.weight"]
    # all F32, so that both twins run the same float path (an F16 matrix rounds its input to F16)
    tensors = [(n, d.astype(np.float32) if d.dtype == np.float16 else d, e) for n, d, e in tensors]
    hd, nk, rep = dims["state"], dims["k_heads"], dims["v_heads"] // dims["k_heads"]
    widths = _widths(dims)
    signs = signs_for(widths, seed)
    folded_tensors, names = fold_tensors(tensors, signs, hd, nk, rep, dims["layers"], block)
    extra_kv = fold_kv(signs, names, block=block, **({"version": 2, "tied_output": True} if tied else {}))
    tag = "-mtp" if mtp else ""
    plain = tiny_hybrid.write_parts(folder / f"fold{tag}-plain.gguf", kv, tensors)
    folded = tiny_hybrid.write_parts(folder / f"fold{tag}-folded.gguf", kv + extra_kv, folded_tensors)
    unfolded = tiny_hybrid.write_parts(folder / f"fold{tag}-unfolded.gguf", kv, folded_tensors)
    pair = (plain, folded, unfolded, tuple(widths), kv, tensors, folded_tensors, names, signs)
    return FoldPair(*pair, block, tied, True, (hd, nk, rep))


# A small qwen35 (one delta-net and one attention layer, 64 wide) whose layers weigh in its
# answer, for folds of one kind of weight: the cheapest files that try one block size or one
# grouping of the value heads.
SMALL = dict(layers=2, full_attention_interval=2, vocab=512, mode="counter", layer_scale=0.5)


def write_partial_fold(folder: Path, kinds: tuple[str, ...], *, block: int, seed: int = 0, **shape) -> FoldPair:
    """Plain, folded and unfolded twins of SMALL (overridden by `shape`) where only the weights
    of `kinds` (e.g. ffn_down, ssm_out) are folded at `block`: token_embd and the LM head stay
    plain (no inverse), so the file's sign widths are those weights' input widths."""
    dims = {**SMALL, **shape}
    kv, tensors = tiny_hybrid.hybrid_target_parts(**dims, seed=seed)
    hd, nk, rep = dims.get("state", 16), dims.get("k_heads", 2), dims.get("v_heads", 4) // dims.get("k_heads", 2)
    widths = sorted({d.shape[1] for n, d, _ in tensors if n.startswith("blk.") and _kind(n) in kinds})
    signs = signs_for(widths, seed)
    folded_tensors, names = fold_tensors(tensors, signs, hd, nk, rep, dims["layers"], block, kinds)
    # the plain twin depends on the shape only: one file for every block and kind folded
    model = hashlib.sha256(repr(sorted(dims.items())).encode() + bytes([seed])).hexdigest()[:8]
    tag = f"{model}-{'-'.join(kinds)}-b{block}"
    plain = folder / f"partial-{model}-plain.gguf"
    if not plain.is_file():
        tiny_hybrid.write_parts(plain, kv, tensors)
    folded = tiny_hybrid.write_parts(
        folder / f"partial-{tag}-folded.gguf", kv + fold_kv(signs, names, block=block, inverse=False), folded_tensors
    )
    unfolded = tiny_hybrid.write_parts(folder / f"partial-{tag}-unfolded.gguf", kv, folded_tensors)
    pair = (plain, folded, unfolded, tuple(widths), kv, tensors, folded_tensors, names, signs)
    return FoldPair(*pair, block, False, False, (hd, nk, rep))


# --- ternary files of the folded model: PrismML's PQ2_0/PTQ1_0, and their plain-basis twin -------

TERNARY = FOLDED  # the layer matrices Bonsai 2 stores ternary are the ones it folds


def ternary_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PrismML's reference quantizer per 128 weights: d = amax, q = clamp(round(x/d) + 1, 0, 3)."""
    blocks = w.astype(np.float32).reshape(-1, 128)
    d = np.abs(blocks).max(axis=1).astype(np.float16).astype(np.float32)
    safe = np.where(d == 0, 1.0, d)
    codes = np.clip(np.round(blocks / safe[:, None]) + 1, 0, 3).astype(np.uint8)
    return codes, d


def write_ternary(pair: FoldPair | None, path: Path, type_id: int, source: Path | None = None) -> Path:
    """The folded file with its layer matrices in PQ2_0 (142) or PTQ1_0 (143), through bonsai's
    own GGUF rewriter (the `gguf` package cannot write the fork's types)."""
    from bonsai_launch.models import codec_repack
    from bonsai_launch.models import ternary_codecs as codecs

    encode = {codecs.PQ2_0: codecs.encode_pq2_0, codecs.PTQ1_0: codecs.encode_ptq1_0}[type_id]

    def convert(name: str, type_id_in: int, dims: tuple[int, ...], nbytes: int):
        if not (name.startswith("blk.") and name.split(".")[-2] in TERNARY and type_id_in == 0):
            return None
        weights = nbytes // 4
        size = weights // 128 * codecs.BLOCKS[type_id][1]
        return type_id, size, lambda raw: encode(*ternary_codes(np.frombuffer(raw, dtype="<f4")))

    return codec_repack.rewrite(source or pair.folded, path, convert)  # type: ignore[union-attr]


def unfold_tensor(name: str, w: np.ndarray, pair: FoldPair) -> np.ndarray:
    """The inverse of the fold for one stored (folded) matrix of `pair`, numpy (out, in)."""
    hd, nk, rep = pair.heads
    plain = fwht(w.astype(np.float64), pair.block) * pair.signs[w.shape[1]]  # H is its own inverse, s * s = 1
    if name.endswith("ssm_out.weight"):
        out = plain.shape[0]
        plain = plain.reshape(out, nk, rep, hd).transpose(0, 2, 1, 3).reshape(out, -1)
    return plain.astype(np.float32)


def write_ternary_twin(pair: FoldPair, path: Path) -> Path:
    """The plain-basis F32 twin of write_ternary's file: the same ternary values, unfolded."""
    from bonsai_launch.models import ternary_codecs as codecs

    tensors = []
    for name, data, extra in pair.folded_tensors:
        if name.startswith("blk.") and name.split(".")[-2] in TERNARY:
            data = codecs.values(*ternary_codes(np.asarray(data))).reshape(data.shape)
        if name in pair.names or name == "token_embd.weight":
            data = unfold_tensor(name, np.asarray(data), pair)
        tensors.append((name, data, extra))
    return tiny_hybrid.write_parts(path, pair.kv, tensors)
