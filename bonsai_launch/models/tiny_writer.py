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


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _rand(rng: np.random.Generator, *ggml_shape: int, scale: float = 0.1) -> np.ndarray:
    """Random f32 weights; `ggml_shape` is ggml order {ne0, ne1}, numpy gets it reversed."""
    return (rng.standard_normal(tuple(reversed(ggml_shape))) * scale).astype(np.float32)


def _zeros(*ggml_shape: int) -> np.ndarray:
    return np.zeros(tuple(reversed(ggml_shape)), dtype=np.float32)


def _ones(*ggml_shape: int) -> np.ndarray:
    return np.ones(tuple(reversed(ggml_shape)), dtype=np.float32)


def token_texts(vocab: int, token_prefix: str = DEFAULT_TOKEN_PREFIX) -> list[str]:
    return [f"{token_prefix}{i}" for i in range(vocab)]


def _write(path: str | Path, arch: str, kv: Sequence[tuple[str, str, object]], tensors: Sequence[tuple]) -> Path:
    """Write a GGUF file atomically. kv items are (kind, key, value), kind one of the
    GGUFWriter add_* suffixes (uint32, float32, bool, string, array). Tensors are (name, data)
    or (name, data, raw_dtype) for data already quantized (gguf.quants.quantize)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
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


def _tokenizer_kv(
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
