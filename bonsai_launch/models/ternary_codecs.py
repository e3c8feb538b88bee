"""PrismML's Bonsai 2 weight codecs (PQ2_0, PTQ1_0) and mainline's Q2_0, at the byte level.

Facts: shared/reference/bonsai2-format.md. All three store a code q per weight, value (q - 1) * d:
- Q2_0 (mainline type 42): 64 weights in 18 bytes, fp16 d then qs[16]; weight j in byte j/4 at
  bits 2*(j%4).
- PQ2_0 (fork type 142): the same codes with one d per 128 weights (34 bytes): exactly two Q2_0
  blocks that share d, so it becomes Q2_0 by copying bytes (36 bytes per 128 weights).
- PTQ1_0 (fork type 143): 128 ternary codes in 28 bytes, qs[24] then qh[2] then fp16 d (the
  scale last); five base-3 digits a byte, the first most significant, stored as
  ceil(v * 256 / 243) and read back as digit n = ((uint8)(b * 3^n) * 3) >> 8.

bonsai serves both fork codecs through mainline Q2_0 (every backend's kernels, our x86 ones
included): the conversion is lossless, and costs memory (2.25 bpw against 2.125 and 1.75).
"""

from __future__ import annotations

import numpy as np

from bonsai_launch.models.codec_types import BLOCKS, FORK_TYPES, NAMES, PQ2_0, PTQ1_0, Q2_0, q2_0_bytes

__all__ = ["BLOCKS", "FORK_TYPES", "NAMES", "PQ2_0", "PTQ1_0", "Q2_0", "q2_0_bytes"]  # the type table, for callers here

# PTQ1_0's element map: qs[m] (m < 16) holds elements m + 16n, n = 0..4 (0-79); qs[16 + m]
# (m < 8) holds 80 + m + 8n (80-119); qh[h] (h < 2) holds 120 + h + 2n, n = 0..3 (120-127).
_PTQ1_ELEMENT = np.full((26, 5), -1, dtype=np.int64)
for _m in range(16):
    _PTQ1_ELEMENT[_m] = [_m + 16 * _n for _n in range(5)]
for _m in range(8):
    _PTQ1_ELEMENT[16 + _m] = [80 + _m + 8 * _n for _n in range(5)]
for _h in range(2):
    _PTQ1_ELEMENT[24 + _h, :4] = [120 + _h + 2 * _n for _n in range(4)]
_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.int64)


def _blocks(data: bytes | np.ndarray, block_bytes: int) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if raw.size % block_bytes:
        raise ValueError(f"{raw.size} bytes is not a whole number of {block_bytes}-byte blocks")
    return raw.reshape(-1, block_bytes)


def _unpack2(qs: np.ndarray) -> np.ndarray:
    """2-bit codes, least significant first: (blocks, bytes) -> (blocks, 4 * bytes)."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)
    return ((qs[:, :, None] >> shifts) & 3).reshape(qs.shape[0], -1)


def _pack2(codes: np.ndarray) -> np.ndarray:
    c = codes.reshape(codes.shape[0], -1, 4).astype(np.uint8)
    return c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)


def _half(d: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(d.astype("<f2")).view(np.uint8).reshape(-1, 2)


def decode_q2_0(data: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes (blocks, 64) in 0..3, d (blocks,) float32) of Q2_0 blocks."""
    b = _blocks(data, 18)
    return _unpack2(b[:, 2:]), b[:, :2].copy().view("<f2").reshape(-1).astype(np.float32)


def decode_pq2_0(data: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes (blocks, 128) in 0..3, d (blocks,)) of PQ2_0 blocks: d first, then qs[32]."""
    b = _blocks(data, 34)
    return _unpack2(b[:, 2:]), b[:, :2].copy().view("<f2").reshape(-1).astype(np.float32)


def decode_ptq1_0(data: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes (blocks, 128) in 0..2, d (blocks,)) of PTQ1_0 blocks: qs[24], qh[2], then d."""
    b = _blocks(data, 28)
    packed = b[:, :26].astype(np.int64)
    codes = np.zeros((b.shape[0], 128), dtype=np.uint8)
    for n in range(5):
        digit = ((((packed * _POW3[n]) & 0xFF) * 3) >> 8).astype(np.uint8)
        cols = _PTQ1_ELEMENT[:, n]
        keep = cols >= 0
        codes[:, cols[keep]] = digit[:, keep]
    return codes, b[:, 26:28].copy().view("<f2").reshape(-1).astype(np.float32)


def values(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The reference decoding: (q - 1) * d, per block."""
    return (codes.astype(np.float32) - 1.0) * d[:, None]


def encode_q2_0(codes: np.ndarray, d: np.ndarray) -> bytes:
    """Q2_0 blocks of codes (blocks, 64) in 0..3 and one d each."""
    return np.concatenate([_half(d), _pack2(codes)], axis=1).tobytes()


def encode_pq2_0(codes: np.ndarray, d: np.ndarray) -> bytes:
    """PQ2_0 blocks of codes (blocks, 128) in 0..3 and one d each."""
    return np.concatenate([_half(d), _pack2(codes)], axis=1).tobytes()


def encode_ptq1_0(codes: np.ndarray, d: np.ndarray) -> bytes:
    """PTQ1_0 blocks of ternary codes (blocks, 128) in 0..2 and one d each."""
    if codes.max(initial=0) > 2:
        raise ValueError("PTQ1_0 holds ternary codes only (code 3, the value +2, has no PTQ1_0 form)")
    value = np.zeros((codes.shape[0], 26), dtype=np.int64)
    for n in range(5):
        cols = _PTQ1_ELEMENT[:, n]
        keep = cols >= 0
        value[:, keep] = value[:, keep] * 3 + codes[:, cols[keep]]
    value[:, 24:] *= 3  # qh's four trits take a fifth, zero digit so the same decoder reads them
    packed = ((value * 256 + 242) // 243).astype(np.uint8)
    return np.concatenate([packed, _half(d)], axis=1).tobytes()


def to_q2_0(type_id: int, data: bytes | np.ndarray) -> bytes:
    """A PQ2_0 or PTQ1_0 tensor's bytes as Q2_0 bytes of the same values (lossless)."""
    if type_id == PQ2_0:
        b = _blocks(data, 34)
        d, qs = b[:, :2], b[:, 2:]
        return np.concatenate([d, qs[:, :16], d, qs[:, 16:]], axis=1).tobytes()
    if type_id == PTQ1_0:
        codes, d = decode_ptq1_0(data)
        return encode_q2_0(codes.reshape(-1, 64), np.repeat(d, 2))
    raise ValueError(f"type {type_id} is not a PrismML codec (142 PQ2_0, 143 PTQ1_0)")
