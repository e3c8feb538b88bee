"""PQ2_0 / PTQ1_0 files (PrismML's fork types 142, 143) rewritten once as mainline Q2_0 (42).

The values are the same bit for bit (models/ternary_codecs.py), so the Bonsai 2 and 2.5 files
run through every backend's Q2_0 kernels, our x86 ones included, instead of the fork's scalar
paths. Every key, tensor name, shape and order is kept; only the fork tensors' type and bytes
change, and `general.file_type` becomes Q2_0's (28). The output sits in
BONSAI_HOME/cache/repacked/, one file per source (path, size, mtime), written to a temporary
name and renamed at the end, so an interrupted repack leaves nothing that looks finished.
Memory on the device: 2.25 bits per weight, against 2.125 (PQ2_0) and 1.75 (PTQ1_0).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import bonsai_home
from bonsai_launch.models import codec_types as codecs
from bonsai_launch.models.gguf_format import HeaderReader, Truncated

REPACK_VERSION = 1
MOSTLY_Q2_0 = 28  # llama_ftype LLAMA_FTYPE_MOSTLY_Q2_0
_CHUNK_BLOCKS = 1 << 16  # blocks converted at a time: bounded memory on a 17408-wide tensor


@dataclass(frozen=True)
class _Tensor:
    name: bytes
    dims: tuple[int, ...]
    type_id: int
    offset: int
    nbytes: int  # in the source (0 when the type is unknown to us and not converted)


def output_path(source: Path) -> Path:
    st = source.stat()
    key = hashlib.sha256(f"{source.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{REPACK_VERSION}".encode()).hexdigest()
    # the source's own name, so the served model keeps its name (llama-server's alias)
    return bonsai_home() / "cache" / "repacked" / key[:16] / source.name


def current(source: Path) -> Path | None:
    """The finished repack of this source, if there is one."""
    out = output_path(source)
    return out if out.is_file() else None


def _type_size(type_id: int) -> tuple[int, int] | None:
    from bonsai_launch.models.gguf_format import type_tables

    if type_id in codecs.BLOCKS:
        return codecs.BLOCKS[type_id]
    quant_sizes, qtype = type_tables()
    try:
        return quant_sizes[qtype(type_id)]
    except (ValueError, KeyError):
        return None


def _read(buf: mmap.mmap, path: Path) -> tuple[int, list[tuple[str, bytes]], list[_Tensor], int, int]:
    """(version, [(key, raw key/value bytes)], tensors, alignment, data start)."""
    r = HeaderReader(buf)
    if r.take(4) != b"GGUF":
        raise BonsaiError(f"{path.name} is not a GGUF file", "check the path")
    version = r.scalar("<I")
    n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
    kvs: list[tuple[str, bytes]] = []
    alignment = 32
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        vtype = r.scalar("<I")
        value = r.value(vtype, keep_arrays=False)
        if key == "general.alignment" and isinstance(value, int):
            alignment = value
        kvs.append((key, bytes(buf[start : r.pos])))
    tensors = []
    for _ in range(n_tensors):
        name = r.raw_string()
        n_dims = r.scalar("<I")
        dims = tuple(r.scalar("<Q") for _ in range(n_dims))
        type_id, offset = r.scalar("<I"), r.scalar("<Q")
        size = _type_size(type_id)
        elements = 1
        for d in dims:
            elements *= d
        nbytes = elements // size[0] * size[1] if size else 0
        tensors.append(_Tensor(name, dims, type_id, offset, nbytes))
    data_start = (r.pos + alignment - 1) // alignment * alignment
    return version, kvs, tensors, alignment, data_start


def _u32_kv(key: str, value: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


# (name, type id, dims, bytes) -> None (copied as is) or (new type id, new bytes, bytes -> bytes)
Converter = Callable[[str, int, tuple[int, ...], int], tuple[int, int, Callable[[bytes], bytes]] | None]


def fork_to_q2_0(name: str, type_id: int, dims: tuple[int, ...], nbytes: int):
    """The converter of `repack`: PQ2_0 and PTQ1_0 tensors to Q2_0, everything else as it is."""
    if type_id not in codecs.FORK_TYPES:
        return None
    return codecs.Q2_0, codecs.q2_0_bytes(type_id, nbytes), lambda raw: _to_q2_0(type_id, raw)


def repack(source: Path, *, progress: Callable[[int], None] | None = None) -> Path:
    """Write (or reuse) the Q2_0 form of a PQ2_0/PTQ1_0 file; returns its path."""
    source = Path(source)
    out = output_path(source)
    if not out.is_file():
        rewrite(source, out, fork_to_q2_0, file_type=MOSTLY_Q2_0, progress=progress)
    return out


def rewrite(
    source: Path,
    out: Path,
    convert: Converter,
    *,
    file_type: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """A copy of a GGUF file with tensors re-encoded by `convert`, keys and order kept (and
    general.file_type set when given); written to a temporary name and renamed at the end.
    `progress` is told each tensor's source bytes as it is done."""
    with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            version, kvs, tensors, alignment, data_start = _read(buf, source)
        except Truncated:
            raise BonsaiError(
                f"{source.name} is truncated", "download it again (`bonsai pull` resumes and verifies)"
            ) from None
        plans = [convert(t.name.decode(errors="replace"), t.type_id, t.dims, t.nbytes) for t in tensors]
        unknown = [
            t.name.decode(errors="replace") for t, p in zip(tensors, plans, strict=True) if t.nbytes == 0 and p is None
        ]
        if unknown:
            raise BonsaiError(
                f"{source.name}: tensor {unknown[0]} has a type bonsai cannot size",
                "update bonsai (pip install -U bonsai), or run the file with a PrismML fork build",
            )
        header = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
        for key, raw in kvs:
            header += _u32_kv(key, file_type) if key == "general.file_type" and file_type is not None else raw
        offset = 0
        offsets = []
        for t, plan in zip(tensors, plans, strict=True):
            offsets.append(offset)
            header += struct.pack("<Q", len(t.name)) + t.name + struct.pack("<I", len(t.dims))
            header += b"".join(struct.pack("<Q", d) for d in t.dims)
            header += struct.pack("<IQ", plan[0] if plan else t.type_id, offset)
            offset += ((plan[1] if plan else t.nbytes) + alignment - 1) // alignment * alignment
        header += b"\0" * ((-len(header)) % alignment)

        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as w:
                w.write(header)
                for t, plan, at in zip(tensors, plans, offsets, strict=True):
                    w.seek(len(header) + at)
                    src = data_start + t.offset
                    if src + t.nbytes > len(buf):
                        raise BonsaiError(f"{source.name} is truncated", "download it again (`bonsai pull`)")
                    if plan is None:
                        w.write(buf[src : src + t.nbytes])
                    else:
                        # whole blocks at a time, bounded memory on a 17408-wide tensor
                        step = _chunk(t.type_id, t.nbytes)
                        for at_src in range(src, src + t.nbytes, step):
                            w.write(plan[2](buf[at_src : min(at_src + step, src + t.nbytes)]))
                    if progress:
                        progress(t.nbytes)
                w.truncate(len(header) + offset)
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return out


def _chunk(type_id: int, nbytes: int) -> int:
    size = _type_size(type_id)
    block_bytes = size[1] if size else 1
    return max(block_bytes, block_bytes * _CHUNK_BLOCKS)


def _to_q2_0(type_id: int, raw: bytes) -> bytes:
    # numpy is imported here, when a file is repacked, not on every `bonsai start` that plans one
    from bonsai_launch.models import ternary_codecs

    return ternary_codecs.to_q2_0(type_id, raw)
