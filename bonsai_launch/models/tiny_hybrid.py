"""A tiny hybrid `qwen35` target (gated delta-net + attention), optionally with an MTP layer.

Every Bonsai 27B model is a `qwen35` hybrid: gated delta-net layers (a recurrent state that a
speculative verify must roll back after a rejected draft) interleaved with full-attention
layers. This writer makes the smallest such file llama-server b11434 loads (milliseconds),
with the shapes of the 27B scaled down: 3 delta-net layers and 1 attention layer
(full_attention_interval 4), 2 key heads and 4 value heads (unequal, like the 27B's 16/48),
attention heads 4/2, rope sections [2,1,1,0]. Facts: shared/reference/hybrid-targets.md,
src/models/qwen35.cpp of the pin.

Weight modes (`mode=`), all deterministic at temperature 0:
- "pure": a counter. Output row j is embedding row j-1, and every projection back into the
  residual stream (ssm_out, attn_output, ffn_down) is zero, so the last hidden state is the
  last token's embedding and the model says last+1 whatever the context. Any other token is a
  wrong computation, never a near-tie (the margin is checked when writing). The other layer
  weights are random, so a kernel that reads the wrong weights moves the logits (the candidates
  behind the chosen token first; the margin keeps the chosen one).
- "counter": the same head, with small random projections back into the stream
  (`layer_scale`): mostly last+1, sometimes not, depending on the context. A drafter that
  predicts last+1 is then accepted only partly, so rollbacks happen mid-block.
- "constant": every token embeds to one vector and the head has one non-zero row
  (`constant_token`): it always says that token (100% acceptance with tiny_gguf's constant
  drafter of the same token).

MTP (`mtp=True`): block_count = trunk + 1, `qwen35.nextn_predict_layers` = 1, and the last block
`blk.{trunk}` is a full-attention block plus nextn.eh_proj/enorm/hnorm/shared_head_norm.
eh_proj takes the token-embedding half of its input, the block adds nothing, and the head is
the target's: the MTP layer predicts token+1 for the token it is given, which is exactly what a
"pure" target says next. `mtp_accept` in [0, 1] is the share of the vocabulary for which that
holds: for the other tokens the layer's own embedding table (nextn.embed_tokens) maps the
token to a far one, so its draft is wrong. On a "pure" target, 1.0 accepts every draft, 0.0
none, 0.5 about half. `mtp_only=True` writes only what an MTP-only file (`-md FILE --spec-type
draft-mtp`) holds: the embedding, the head and the MTP block. `nextn` overrides the declared
count (2 writes two MTP blocks, which llama-server refuses to run).

`weight_type` ("f32", "f16", "q8_0", "q4_0", "bf16") is the type of the layer matrices:
F16, Q8_0 and Q4_0 are the types ggml's AMX backend takes (vendor/llama.cpp/patches/0004-*).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from bonsai_launch.models import tiny_writer as tw

ARCH = "qwen35"
MODES = ("pure", "counter", "constant")
WEIGHT_TYPES = {
    "f32": None,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
}
# What the defaults give: layers 0-2 delta-net, layer 3 attention, MTP (if any) block 4.
TRUNK_LAYERS = 4


def _matrix(data: np.ndarray, weight_type: str) -> tuple[np.ndarray, dict]:
    """(data, add_tensor kwargs) for a layer matrix stored as weight_type."""
    qtype = WEIGHT_TYPES[weight_type]
    if qtype is None:
        return data.astype(np.float32), {}
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float16), {}
    return quantize(data.astype(np.float32), qtype), {"raw_dtype": qtype}


def counter_head(embedding: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(token_embd, output), numpy layout (vocab, embedding): output row j = embedding row j-1,
    so a hidden state equal to token i's embedding scores i+1 highest. Checked with a margin:
    a wrong token is never a near-tie."""
    rng = tw.rng(seed + 1000)
    embd = rng.standard_normal((vocab, embedding)).astype(np.float32)
    embd = embd.astype(np.float16).astype(np.float32)  # what the file will hold
    out = np.roll(embd, 1, axis=0)  # out[j] = embd[j-1]
    rows = max(1, (1 << 26) // vocab)  # scores a block of rows at a time: 256 MiB, whatever the vocabulary
    for start in range(0, vocab, rows):
        scores = embd[start : start + rows] @ out.T
        expected = (np.arange(start, start + len(scores)) + 1) % vocab
        if not (scores.argmax(axis=1) == expected).all():
            raise ValueError(f"seed {seed}: the counter head is not a counter for every token; pick another seed")
        top2 = np.partition(scores, -2, axis=1)[:, -2:]
        if (top2[:, 1] - top2[:, 0]).min() < 0.25 * embedding:
            raise ValueError(f"seed {seed}: the counter head's margin is too small; pick another seed")
    return embd.astype(np.float16), out.astype(np.float16)


def _mtp_embed_tokens(embd: np.ndarray, accept: float, seed: int) -> np.ndarray:
    """The MTP layer's own embedding table: token i keeps its row for a share `accept` of the
    vocabulary, the others get the row of a token half the vocabulary away (so the MTP draft
    i'+1 differs from the target's i+1)."""
    vocab = embd.shape[0]
    good = np.zeros(vocab, dtype=bool)
    good[tw.rng(seed + 2000).permutation(vocab)[: round(accept * vocab)]] = True
    far = (np.arange(vocab) + vocab // 2) % vocab
    return np.where(good[:, None], embd, embd[far]).astype(np.float16)


def _attention_block(
    rng: np.random.Generator,
    i: int,
    e: int,
    ff: int,
    heads: int,
    heads_kv: int,
    d: int,
    wt: str,
    still: bool,
    scale: float,
) -> list[tuple[str, np.ndarray, dict]]:
    """A full-attention qwen35 block; `still`: nothing flows back into the residual stream."""
    back = (lambda *s: tw.zeros(*s)) if still else (lambda *s: tw.rand(rng, *s, scale=scale))
    out = [
        (f"blk.{i}.attn_norm.weight", tw.ones(e), {}),
        (f"blk.{i}.post_attention_norm.weight", tw.ones(e), {}),
        (f"blk.{i}.attn_q.weight", *_matrix(tw.rand(rng, e, 2 * heads * d), wt)),
        (f"blk.{i}.attn_k.weight", *_matrix(tw.rand(rng, e, heads_kv * d), wt)),
        (f"blk.{i}.attn_v.weight", *_matrix(tw.rand(rng, e, heads_kv * d), wt)),
        (f"blk.{i}.attn_output.weight", *_matrix(back(heads * d, e), wt)),
        (f"blk.{i}.attn_q_norm.weight", tw.ones(d), {}),
        (f"blk.{i}.attn_k_norm.weight", tw.ones(d), {}),
    ]
    return out + _ffn(rng, i, e, ff, wt, back)


def _ffn(rng, i: int, e: int, ff: int, wt: str, back) -> list[tuple[str, np.ndarray, dict]]:
    return [
        (f"blk.{i}.ffn_gate.weight", *_matrix(tw.rand(rng, e, ff), wt)),
        (f"blk.{i}.ffn_down.weight", *_matrix(back(ff, e), wt)),
        (f"blk.{i}.ffn_up.weight", *_matrix(tw.rand(rng, e, ff), wt)),
    ]


def _delta_net_block(
    rng: np.random.Generator,
    i: int,
    e: int,
    ff: int,
    state: int,
    k_heads: int,
    v_heads: int,
    conv_kernel: int,
    wt: str,
    still: bool,
    scale: float,
) -> list[tuple[str, np.ndarray, dict]]:
    back = (lambda *s: tw.zeros(*s)) if still else (lambda *s: tw.rand(rng, *s, scale=scale))
    inner = state * v_heads
    qkv = 2 * k_heads * state + inner
    out = [
        (f"blk.{i}.attn_norm.weight", tw.ones(e), {}),
        (f"blk.{i}.post_attention_norm.weight", tw.ones(e), {}),
        (f"blk.{i}.attn_qkv.weight", *_matrix(tw.rand(rng, e, qkv), wt)),
        (f"blk.{i}.attn_gate.weight", *_matrix(tw.rand(rng, e, inner), wt)),
        (f"blk.{i}.ssm_conv1d.weight", tw.rand(rng, conv_kernel, qkv, scale=0.5), {}),
        (f"blk.{i}.ssm_dt.bias", tw.zeros(v_heads), {}),
        (f"blk.{i}.ssm_a", -np.exp(tw.rand(rng, v_heads, scale=0.5)), {}),
        (f"blk.{i}.ssm_beta.weight", tw.rand(rng, e, v_heads), {}),
        (f"blk.{i}.ssm_alpha.weight", tw.rand(rng, e, v_heads), {}),
        (f"blk.{i}.ssm_norm.weight", tw.ones(state), {}),
        # weights of every type around ssm_out stay random: a kernel reading past it (the AMX
        # offset bug) then gets garbage, not zeros
        (f"blk.{i}.ssm_out.weight", *_matrix(back(inner, e), wt)),
    ]
    return out + _ffn(rng, i, e, ff, wt, back)


def _mtp_block(
    rng, i: int, e: int, ff: int, heads: int, heads_kv: int, d: int, wt: str, embed_tokens: np.ndarray | None
) -> list[tuple[str, np.ndarray, dict]]:
    eh = np.zeros((e, 2 * e), dtype=np.float32)  # numpy (out, in): ggml {2E, E}
    eh[:, :e] = np.eye(e)  # keep the token half of concat(enorm(embed(t+1)), hnorm(h_t))
    out = _attention_block(rng, i, e, ff, heads, heads_kv, d, wt, still=True, scale=0.1)
    out += [
        (f"blk.{i}.nextn.eh_proj.weight", *_matrix(eh, wt)),
        (f"blk.{i}.nextn.enorm.weight", tw.ones(e), {}),
        (f"blk.{i}.nextn.hnorm.weight", tw.ones(e), {}),
        (f"blk.{i}.nextn.shared_head_norm.weight", tw.ones(e), {}),
    ]
    if embed_tokens is not None:
        out.append((f"blk.{i}.nextn.embed_tokens.weight", embed_tokens, {}))
    return out


def write_hybrid_target(path: str | Path, **kwargs) -> Path:
    """Write a tiny qwen35 target (see the module docstring); returns the path."""
    return write_parts(path, *hybrid_target_parts(**kwargs))


def hybrid_target_parts(
    *,
    mode: str = "pure",
    mtp: bool = False,
    mtp_accept: float = 1.0,
    mtp_only: bool = False,
    nextn: int | None = None,
    weight_type: str = "f32",
    embedding: int = 64,
    layers: int = TRUNK_LAYERS,
    full_attention_interval: int = 4,
    vocab: int = 512,
    ff: int = 128,
    heads: int = 4,
    heads_kv: int = 2,
    head_dim: int = 16,
    state: int = 16,
    k_heads: int = 2,
    v_heads: int = 4,
    conv_kernel: int = 4,
    context_length: int = 32768,
    seed: int = 0,
    constant_token: int = 7,
    layer_scale: float = 0.1,
    token_prefix: str = tw.DEFAULT_TOKEN_PREFIX,
    chat_template: str | None = None,
    name: str = "tiny-hybrid",
) -> tuple[list[tuple[str, str, object]], list[tuple[str, np.ndarray, dict]]]:
    """(key/values, tensors) of a tiny qwen35 target, for write_parts (or a fold first)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type {weight_type!r}: one of {', '.join(WEIGHT_TYPES)}")
    if not 0.0 <= mtp_accept <= 1.0:
        raise ValueError(f"mtp_accept {mtp_accept} outside [0, 1]")
    if head_dim != state:
        raise ValueError("qwen35 needs the attention head size equal to the delta-net state size")
    n_mtp = (nextn if nextn is not None else 1) if (mtp or mtp_only) else 0
    e = embedding
    kv: list[tuple[str, str, object]] = [("string", "general.name", name)]
    kv += tw.attention_kv(
        ARCH,
        context_length=context_length,
        embedding=e,
        layers=layers + n_mtp,
        ff=ff,
        heads=heads,
        heads_kv=heads_kv,
        head_dim=head_dim,
        rope_base=1e7,
        rope_dims=head_dim // 2,
    )
    kv += [
        ("array", f"{ARCH}.rope.dimension_sections", [head_dim // 8, head_dim // 16, head_dim // 16, 0]),
        ("uint32", f"{ARCH}.full_attention_interval", full_attention_interval),
        ("uint32", f"{ARCH}.ssm.conv_kernel", conv_kernel),
        ("uint32", f"{ARCH}.ssm.state_size", state),
        ("uint32", f"{ARCH}.ssm.group_count", k_heads),
        ("uint32", f"{ARCH}.ssm.time_step_rank", v_heads),
        ("uint32", f"{ARCH}.ssm.inner_size", state * v_heads),
    ]
    if n_mtp:
        kv.append(("uint32", f"{ARCH}.nextn_predict_layers", n_mtp))
    kv += tw.tokenizer_kv(vocab, "test", token_prefix, chat_template)

    if mode == "constant":
        embd, out = tw.constant_head(e, vocab, constant_token)
    else:
        embd, out = counter_head(e, vocab, seed)
    tensors: list[tuple[str, np.ndarray, dict]] = [
        ("token_embd.weight", embd, {}),
        ("output_norm.weight", tw.ones(e), {}),
        ("output.weight", out, {}),
    ]
    rng = tw.rng(seed)
    still = mode in ("pure", "constant")
    if not mtp_only:
        for i in range(layers):
            if (i + 1) % full_attention_interval:
                tensors += _delta_net_block(
                    rng, i, e, ff, state, k_heads, v_heads, conv_kernel, weight_type, still, layer_scale
                )
            else:
                tensors += _attention_block(rng, i, e, ff, heads, heads_kv, head_dim, weight_type, still, layer_scale)
    embed_tokens = None if mtp_accept >= 1.0 else _mtp_embed_tokens(embd.astype(np.float32), mtp_accept, seed)
    for i in range(layers, layers + n_mtp):
        tensors += _mtp_block(rng, i, e, ff, heads, heads_kv, head_dim, weight_type, embed_tokens)
    return kv, tensors


def write_parts(path: str | Path, kv, tensors: Sequence[tuple[str, np.ndarray, dict]]) -> Path:
    """tiny_writer._write, with the quantized tensors' ggml type passed along."""
    return tw.write(path, ARCH, kv, [(n, d, extra["raw_dtype"]) if extra else (n, d) for n, d, extra in tensors])


def counter_prompt(start: int = 10, length: int = 16, vocab: int = 512) -> list[int]:
    """A prompt a counter continues: start, start+1, ... (token ids)."""
    return [(start + i) % vocab for i in range(length)]
