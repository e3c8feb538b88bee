"""A tiny dense `qwen3` (or `llama`) target: the self-test's dense speculative pair, and the
test suite's everyday model (tests/support/tiny_gguf.py re-exports it). Two layers, a 512-token
"test" vocabulary, milliseconds to load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bonsai_launch.models import tiny_writer as tw


def _layer_tensors(
    rng: np.random.Generator,
    i: int,
    *,
    embedding: int,
    ff: int,
    heads: int,
    heads_kv: int,
    head_dim: int,
    qk_norm: bool,
    constant: bool,
    scale: float = 0.1,
) -> list[tuple[str, np.ndarray]]:
    e, q, kv = embedding, head_dim * heads, head_dim * heads_kv
    # constant models zero the projections back into the residual stream, so it never changes
    wo = tw.zeros(q, e) if constant else tw.rand(rng, q, e, scale=scale)
    down = tw.zeros(ff, e) if constant else tw.rand(rng, ff, e, scale=scale)
    out = [
        (f"blk.{i}.attn_norm.weight", tw.ones(e)),
        (f"blk.{i}.attn_q.weight", tw.rand(rng, e, q, scale=scale)),
        (f"blk.{i}.attn_k.weight", tw.rand(rng, e, kv, scale=scale)),
        (f"blk.{i}.attn_v.weight", tw.rand(rng, e, kv, scale=scale)),
        (f"blk.{i}.attn_output.weight", wo),
        (f"blk.{i}.ffn_norm.weight", tw.ones(e)),
        (f"blk.{i}.ffn_gate.weight", tw.rand(rng, e, ff, scale=scale)),
        (f"blk.{i}.ffn_up.weight", tw.rand(rng, e, ff, scale=scale)),
        (f"blk.{i}.ffn_down.weight", down),
    ]
    if qk_norm:
        out += [
            (f"blk.{i}.attn_q_norm.weight", tw.ones(head_dim)),
            (f"blk.{i}.attn_k_norm.weight", tw.ones(head_dim)),
        ]
    return out


def write_target(
    path: str | Path,
    *,
    arch: str = "qwen3",
    embedding: int = 64,
    layers: int = 2,
    vocab: int = 512,
    ff: int = 128,
    heads: int = 4,
    heads_kv: int = 2,
    head_dim: int = 16,
    context_length: int = 32768,
    seed: int = 0,
    constant_token: int | None = None,
    tokenizer: str = "test",
    chat_template: str | None = None,
    token_prefix: str = tw.DEFAULT_TOKEN_PREFIX,
    name: str = "tiny-target",
    layer_scale: float = 0.1,
    matrix_dtype: type = np.float32,
) -> Path:
    """A tiny `qwen3` or `llama` target. `constant_token=k`: it always predicts k.
    With the default layer_scale the embedding dominates and the model mostly repeats its last
    token; layer_scale=1.0 makes its greedy output vary with the context (lossless tests).
    matrix_dtype=np.float16 stores the layers' matrices as F16 (half the memory and file: the
    benchmarks' full-size synthetic models)."""
    if arch not in ("qwen3", "llama"):
        raise ValueError(f"unsupported target architecture {arch!r} (qwen3 or llama)")
    rng = tw.rng(seed)
    kv: list[tuple[str, str, object]] = [("string", "general.name", name)]
    kv += tw.attention_kv(
        arch,
        context_length=context_length,
        embedding=embedding,
        layers=layers,
        ff=ff,
        heads=heads,
        heads_kv=heads_kv,
        head_dim=head_dim,
    )
    kv += tw.tokenizer_kv(vocab, tokenizer, token_prefix, chat_template)

    tensors: list[tuple[str, np.ndarray]] = []
    if constant_token is not None:
        embd, out = tw.constant_head(embedding, vocab, constant_token)
        tensors += [("token_embd.weight", embd), ("output.weight", out)]
    else:
        # tied output head; f16 keeps the vocabulary-sized matrix small
        tensors += [("token_embd.weight", tw.rand(rng, embedding, vocab, scale=1.0).astype(np.float16))]
    tensors.append(("output_norm.weight", tw.ones(embedding)))
    for i in range(layers):
        layer = _layer_tensors(
            rng,
            i,
            embedding=embedding,
            ff=ff,
            heads=heads,
            heads_kv=heads_kv,
            head_dim=head_dim,
            qk_norm=arch == "qwen3",
            constant=constant_token is not None,
            scale=layer_scale,
        )
        tensors += [(n, a.astype(matrix_dtype) if a.ndim == 2 else a) for n, a in layer]
    return tw.write(path, arch, kv, tensors)
