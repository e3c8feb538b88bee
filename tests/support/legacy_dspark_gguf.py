"""Tiny drafters in PrismML's legacy `dspark` layout, as the published `*-dspark-bf16.gguf` files are.

The layout (keys, types, tensor names) follows shared/reference/dspark-conversion.md §1:
`general.architecture = "dspark"`; standard keys as `dspark.*`; DSpark keys double-prefixed as
`dspark.dspark.*` (target_layers an INT32 array, unshifted: the legacy runtime tapped layer
*outputs*); the `"none"` tokenizer stub as the only tokenizer key plus `dspark.vocab_size`;
matrices in BF16 and norms/biases in F32; the Markov head as `dspark.markov_head_a/b`, the
confidence head as `dspark.confidence_head.*`, and the log-SNR family's four extra tensors
`dspark.log_snr_fc{1,2}.{weight,bias}`.

Default shape: E=64, V=512, R=8, one draft layer, target_layers=[0, 2] against a 4-layer
tests/tiny_gguf.write_target. `constant_token=k` makes the converted drafter draft k against
a `write_target(constant_token=k)` target (its own heads are constant, the attention and FFN
outputs are zero, the Markov head adds nothing and the log-SNR MLP adds a positive constant,
so the hidden state keeps a positive sum and the one non-zero output row, k, wins).

Variants of the reference's fixture table: `log_snr`, `confidence_head_with_markov=False`
(a {E,1} confidence head), `extra_tensor` (an unmapped `dspark.*` tensor), and
`patch_tensor_type(path, name, 42)` for the Q4_1 file's retired type-42 fc tensor.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

from bonsai_launch.models.tiny_writer import constant_head as _constant_head
from bonsai_launch.models.tiny_writer import rng as _rng

LOG_SNR_TENSORS = (
    "dspark.log_snr_fc1.weight",
    "dspark.log_snr_fc1.bias",
    "dspark.log_snr_fc2.weight",
    "dspark.log_snr_fc2.bias",
)


def _bf16(x: np.ndarray) -> tuple[np.ndarray, GGMLQuantizationType]:
    return quants.quantize(x.astype(np.float32), GGMLQuantizationType.BF16), GGMLQuantizationType.BF16


def _rand(rng: np.random.Generator, *ggml_shape: int, scale: float = 0.1) -> np.ndarray:
    return (rng.standard_normal(tuple(reversed(ggml_shape))) * scale).astype(np.float32)


def _full(value: float, *ggml_shape: int) -> np.ndarray:
    return np.full(tuple(reversed(ggml_shape)), value, dtype=np.float32)


def write_legacy_drafter(
    path: str | Path,
    *,
    embedding: int = 64,
    vocab: int = 512,
    markov_rank: int = 8,
    draft_layers: int = 1,
    target_layers: Sequence[int] = (0, 2),
    block_size: int = 4,
    mask_token_id: int | None = None,
    log_snr: bool = True,
    min_log_snr: float = -9.0,
    max_log_snr: float = 9.0,
    confidence_head_with_markov: bool = True,
    extra_tensor: str | None = None,
    extra_dflash_key: bool = False,
    constant_token: int | None = None,
    heads: int = 4,
    heads_kv: int = 2,
    head_dim: int = 16,
    ff: int = 128,
    context_length: int = 4096,
    seed: int = 0,
    name: str = "tiny-legacy-dspark",
) -> Path:
    """Write a legacy drafter; see the module docstring. Returns the path."""
    e, v, r = embedding, vocab, markov_rank
    mask = v - 1 if mask_token_id is None else mask_token_id
    rng = _rng(seed)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    w = GGUFWriter(str(tmp), "dspark")
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", 32)  # MOSTLY_BF16
    for key, val in (
        ("block_count", draft_layers),
        ("context_length", context_length),
        ("embedding_length", e),
        ("feed_forward_length", ff),
        ("attention.head_count", heads),
        ("attention.head_count_kv", heads_kv),
        ("attention.key_length", head_dim),
        ("attention.value_length", head_dim),
    ):
        w.add_uint32(f"dspark.{key}", val)
    w.add_float32("dspark.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("dspark.rope.freq_base", 1e7)
    w.add_uint32("dspark.vocab_size", v)
    w.add_string("tokenizer.ggml.model", "none")
    w.add_uint32("dspark.dspark.block_size", block_size)
    w.add_uint32("dspark.dspark.mask_token_id", mask)
    w.add_key_value(
        "dspark.dspark.target_layers",
        [int(i) for i in target_layers],
        GGUFValueType.ARRAY,
        sub_type=GGUFValueType.INT32,
    )
    w.add_uint32("dspark.dspark.markov_rank", r)
    w.add_bool("dspark.dspark.confidence_head", True)
    w.add_bool("dspark.dspark.confidence_head_with_markov", confidence_head_with_markov)
    if log_snr:
        w.add_bool("dspark.dspark.log_snr_conditioning", True)
        w.add_float32("dspark.dspark.min_log_snr", min_log_snr)
        w.add_float32("dspark.dspark.max_log_snr", max_log_snr)
    if extra_dflash_key:  # a key that collides with dspark.dspark.block_size after renaming
        w.add_uint32("dspark.block_size", block_size)

    constant = constant_token is not None
    tensors: list[tuple[str, np.ndarray, bool]] = []  # (name, f32 data, as BF16)
    if constant:
        embd, out = _constant_head(e, v, constant_token)
        embd, out = embd.astype(np.float32), out.astype(np.float32)
    else:
        embd, out = _rand(rng, e, v, scale=1.0), _rand(rng, e, v)
    tensors += [
        ("token_embd.weight", embd, True),
        ("output.weight", out, True),
        ("output_norm.weight", _full(1.0, e), False),
    ]
    tensors += [
        ("dspark.fc.weight", _rand(rng, len(target_layers) * e, e), True),
        ("dspark.hidden_norm.weight", _full(1.0, e), False),
    ]
    w2 = _full(0.0, r, v) if constant else _rand(rng, r, v)
    tensors += [("dspark.markov_head_a.weight", _rand(rng, r, v), True), ("dspark.markov_head_b.weight", w2, True)]
    conf_width = e + r if confidence_head_with_markov else e
    tensors += [
        ("dspark.confidence_head.weight", _rand(rng, conf_width, 1), True),
        ("dspark.confidence_head.bias", _full(0.0, 1), False),
    ]
    if log_snr:
        fc2 = _full(0.0, e, e) if constant else _rand(rng, e, e)
        fc2_bias = _full(0.1, e) if constant else _rand(rng, e)
        tensors += [
            ("dspark.log_snr_fc1.weight", _rand(rng, 128, e), True),
            ("dspark.log_snr_fc1.bias", _rand(rng, e), False),
            ("dspark.log_snr_fc2.weight", fc2, True),
            ("dspark.log_snr_fc2.bias", fc2_bias, False),
        ]
    if extra_tensor:
        tensors.append((extra_tensor, _full(0.0, e), False))
    q, kv = head_dim * heads, head_dim * heads_kv
    for i in range(draft_layers):
        wo = _full(0.0, q, e) if constant else _rand(rng, q, e)
        down = _full(0.0, ff, e) if constant else _rand(rng, ff, e)
        tensors += [
            (f"blk.{i}.attn_norm.weight", _full(1.0, e), False),
            (f"blk.{i}.attn_q.weight", _rand(rng, e, q), True),
            (f"blk.{i}.attn_k.weight", _rand(rng, e, kv), True),
            (f"blk.{i}.attn_v.weight", _rand(rng, e, kv), True),
            (f"blk.{i}.attn_output.weight", wo, True),
            (f"blk.{i}.attn_q_norm.weight", _full(1.0, head_dim), False),
            (f"blk.{i}.attn_k_norm.weight", _full(1.0, head_dim), False),
            (f"blk.{i}.ffn_norm.weight", _full(1.0, e), False),
            (f"blk.{i}.ffn_gate.weight", _rand(rng, e, ff), True),
            (f"blk.{i}.ffn_up.weight", _rand(rng, e, ff), True),
            (f"blk.{i}.ffn_down.weight", down, True),
        ]
    try:
        for tname, data, as_bf16 in tensors:
            if as_bf16:
                raw, qtype = _bf16(data)
                w.add_tensor(tname, raw, raw_dtype=qtype)
            else:
                w.add_tensor(tname, data)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)
    return path


def patch_tensor_type(path: str | Path, tensor: str, ggml_type: int) -> Path:
    """Rewrite one tensor's type id in its tensor-info record, leaving every byte else alone
    (the published `-dspark-Q4_1` file's fc tensor carries the retired legacy id 42)."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    encoded = tensor.encode()
    at = data.find(struct.pack("<Q", len(encoded)) + encoded)
    if at < 0:
        raise ValueError(f"{tensor} not found in {path}")
    pos = at + 8 + len(encoded)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    pos += 4 + 8 * n_dims
    struct.pack_into("<I", data, pos, ggml_type)
    path.write_bytes(bytes(data))
    return path


def with_key(src: str | Path, dest: str | Path, key: str, value: int) -> Path:
    """A copy of a GGUF file (tiny ones: read whole) with one extra u32 key, e.g. a target
    that defines its own tokenizer.ggml.mask_token_id."""
    reader = GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(str(dest), arch)
    for fname, fld in reader.fields.items():
        if fname.startswith("GGUF.") or fname == "general.architecture":
            continue
        vtype = GGUFValueType(int(fld.types[0]))
        if vtype == GGUFValueType.STRING:
            w.add_key_value(fname, bytes(fld.parts[fld.data[0]]), vtype)
        elif vtype == GGUFValueType.ARRAY:
            sub = GGUFValueType(int(fld.types[1]))
            items = [bytes(fld.parts[i]) if sub == GGUFValueType.STRING else fld.parts[i].tolist()[0] for i in fld.data]
            w.add_key_value(fname, items, vtype, sub_type=sub)
        else:
            w.add_key_value(fname, fld.parts[fld.data[0]].tolist()[0], vtype)
    w.add_uint32(key, value)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dest)
