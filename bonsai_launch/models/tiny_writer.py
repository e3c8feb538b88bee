"""Writing tiny GGUF files: the primitives the self-test's models (tiny_hybrid.py) and the test
suite's (tests/support/tiny_gguf.py) are made of. Atomic writes, the "test" tokenizer, weights
in ggml's shape order. Files of a few hundred kilobytes that llama-server loads in milliseconds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

DEFAULT_TOKEN_PREFIX = "tok"


_RMS_EPS = 1e-6
_ROPE_BASE = 10000.0
_CONST = 0.5  # every embedding of a constant-token model is this vector (times ones)


def tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def rand(rng: np.random.Generator, *ggml_shape: int, scale: float = 0.1) -> np.ndarray:
    """Random f32 weights; `ggml_shape` is ggml order {ne0, ne1}, numpy gets it reversed."""
    return (rng.standard_normal(tuple(reversed(ggml_shape))) * scale).astype(np.float32)


def zeros(*ggml_shape: int) -> np.ndarray:
    return np.zeros(tuple(reversed(ggml_shape)), dtype=np.float32)


def ones(*ggml_shape: int) -> np.ndarray:
    return np.ones(tuple(reversed(ggml_shape)), dtype=np.float32)


def token_texts(vocab: int, token_prefix: str = DEFAULT_TOKEN_PREFIX) -> list[str]:
    return [f"{token_prefix}{i}" for i in range(vocab)]


def write(path: str | Path, arch: str, kv: Sequence[tuple[str, str, object]], tensors: Sequence[tuple]) -> Path:
    """Write a GGUF file atomically. kv items are (kind, key, value), kind one of the
    GGUFWriter add_* suffixes (uint32, float32, bool, string, array). Tensors are (name, data)
    or (name, data, raw_dtype) for data already quantized (gguf.quants.quantize)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    writer = GGUFWriter(str(tmp), arch)
    try:
        for kind, key, value in kv:
            getattr(writer, f"add_{kind}")(key, value)
        for name, data, *raw in tensors:
            writer.add_tensor(name, data, raw_dtype=raw[0] if raw else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def tokenizer_kv(
    vocab: int, tokenizer: str, token_prefix: str, chat_template: str | None, mask_token_id: int | None = None
) -> list[tuple[str, str, object]]:
    if tokenizer != "test":
        raise ValueError("only the 'test' tokenizer is supported by tiny_gguf")
    kv: list[tuple[str, str, object]] = [
        ("string", "tokenizer.ggml.model", tokenizer),
        ("array", "tokenizer.ggml.tokens", token_texts(vocab, token_prefix)),
    ]
    if mask_token_id is not None:
        kv.append(("uint32", "tokenizer.ggml.mask_token_id", mask_token_id))
    if chat_template is not None:
        kv.append(("string", "tokenizer.chat_template", chat_template))
    return kv


def constant_head(embedding: int, vocab: int, token: int) -> tuple[np.ndarray, np.ndarray]:
    """(token_embd, output) so that any token's hidden state scores `token` highest."""
    if not 0 <= token < vocab:
        raise ValueError(f"constant_token {token} outside the vocabulary of {vocab}")
    embd = np.full((vocab, embedding), _CONST, dtype=np.float16)
    out = np.zeros((vocab, embedding), dtype=np.float16)
    out[token, :] = 1.0
    return embd, out


def attention_kv(
    arch: str,
    *,
    context_length: int,
    embedding: int,
    layers: int,
    ff: int,
    heads: int,
    heads_kv: int,
    head_dim: int,
    rope_base: float = _ROPE_BASE,
    rope_dims: int | None = None,
) -> list[tuple[str, str, object]]:
    """The attention keys every tiny writer sets (rope: the dense default unless given)."""
    return [
        ("uint32", f"{arch}.context_length", context_length),
        ("uint32", f"{arch}.embedding_length", embedding),
        ("uint32", f"{arch}.block_count", layers),
        ("uint32", f"{arch}.feed_forward_length", ff),
        ("uint32", f"{arch}.attention.head_count", heads),
        ("uint32", f"{arch}.attention.head_count_kv", heads_kv),
        ("uint32", f"{arch}.attention.key_length", head_dim),
        ("uint32", f"{arch}.attention.value_length", head_dim),
        ("float32", f"{arch}.attention.layer_norm_rms_epsilon", _RMS_EPS),
        ("float32", f"{arch}.rope.freq_base", rope_base),
        ("uint32", f"{arch}.rope.dimension_count", head_dim if rope_dims is None else rope_dims),
    ]
