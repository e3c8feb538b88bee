"""Reading for the conversion: a legacy `dspark` drafter through gguf.GGUFReader (memory-mapped), and a
target's key/value section only, through the one header reader (its weights may use types the
gguf package does not know)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models.gguf_format import ARRAY, NUMPY, SCALARS, STRING, HeaderReader, Truncated

SIDECAR_FIX = (
    "convert the `*-dspark-bf16.gguf` sidecar from the same Hugging Face repo instead "
    "(the Q4_1 file's fc tensor uses the retired legacy type 42)"
)


@dataclass(frozen=True)
class KeyValue:
    """One metadata entry with its GGUF type kept (strings as raw bytes, never re-encoded)."""

    key: str
    vtype: int
    value: Any
    sub_type: int | None = None


def read_key_values(path: Path) -> list[KeyValue]:
    """The key/value section of a GGUF file, parsed by hand up to the tensor infos.

    `gguf.GGUFReader` would also build the tensor list, and raises for tensor types it does
    not know (the ternary targets use types 42 and 142); we never need the target's tensors.
    """
    import numpy as np

    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = HeaderReader(buf)
        try:
            if r.take(4) != b"GGUF":
                raise BonsaiError(f"{path.name} is not a GGUF file", "point at a .gguf model file")
            r.scalar("<I")  # version
            r.scalar("<Q")  # tensor count
            out = []
            for _ in range(r.scalar("<Q")):
                key = r.string()
                vtype = r.scalar("<I")
                if vtype == STRING:
                    out.append(KeyValue(key, vtype, r.raw_string()))
                elif vtype == ARRAY:
                    sub, count = r.scalar("<I"), r.scalar("<Q")
                    if sub == STRING:
                        out.append(KeyValue(key, vtype, [r.raw_string() for _ in range(count)], sub))
                    elif sub in NUMPY:
                        raw = r.take(count * np.dtype(NUMPY[sub]).itemsize)
                        out.append(KeyValue(key, vtype, np.frombuffer(raw, NUMPY[sub]).tolist(), sub))
                    else:
                        raise BonsaiError(
                            f"{path.name}: key {key} holds an array of arrays, which bonsai cannot copy",
                            "use a target GGUF written by a current llama.cpp",
                        )
                elif vtype in SCALARS:
                    out.append(KeyValue(key, vtype, r.scalar(SCALARS[vtype])))
                else:
                    raise BonsaiError(
                        f"{path.name}: key {key} has unknown GGUF value type {vtype}",
                        "use a target GGUF written by a current llama.cpp",
                    )
            return out
        except (Truncated, struct.error):
            raise BonsaiError(
                f"{path.name} is truncated inside its header", "download it again (`bonsai pull` resumes and verifies)"
            ) from None


def _legacy_key_values(reader) -> list[KeyValue]:
    """The source's metadata in file order, with types, from GGUFReader's fields."""
    out = []
    for name, fld in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's pseudo-fields: version and counts
        vtype = int(fld.types[0])
        if vtype == STRING:
            value: Any = bytes(fld.parts[fld.data[0]])
        elif vtype == ARRAY:
            sub = int(fld.types[1]) if len(fld.types) > 1 else None
            if sub == STRING:
                value = [bytes(fld.parts[i]) for i in fld.data]
            else:
                value = [fld.parts[i].tolist()[0] for i in fld.data]
            out.append(KeyValue(name, vtype, value, sub))
            continue
        else:
            value = fld.parts[fld.data[0]].tolist()[0]
        out.append(KeyValue(name, vtype, value))
    return out


def _open_legacy(source: Path):
    """GGUFReader for the legacy file, with a useful refusal for the tensor types it cannot read."""
    from gguf import GGUFReader

    try:
        return GGUFReader(source)
    except ValueError as exc:
        if "is not a valid GGMLQuantizationType" in str(exc):
            raise BonsaiError(
                f"{source.name} has a tensor of a type the gguf package does not know ({exc})", SIDECAR_FIX
            ) from None
        raise BonsaiError(f"{source.name} cannot be read as GGUF: {exc}", "download it again") from None
