"""The GGUF file format at the byte level: value types, and a cursor over a header.

One reader for bonsai: `gguf.inspect_gguf` reads the header bonsai needs (skipping large arrays,
keeping where their bytes are), and the drafter conversion copies a target's key/value section
with it. The `gguf` package is not used for headers: it raises on tensor types it does not know
(the ternary targets use 42 and 142), and it builds the whole tensor list we never need; only its
type tables are read (type_tables).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError

# GGUF value types (see gguf.constants.GGUFValueType): id -> struct format, or None.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
U64 = struct.Struct("<Q")


class Truncated(Exception):
    pass


# The same types as numpy dtypes, for arrays read whole.
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


class HeaderReader:
    """A cursor over the memory-mapped file that refuses to read past its end."""

    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise Truncated
        chunk = self.buf[self.pos : end]
        self.pos = end
        return chunk

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def raw_string(self) -> bytes:
        return self.take(self.scalar("<Q"))

    def string(self) -> str:
        return self.raw_string().decode("utf-8", errors="replace")

    def value(self, vtype: int, keep_arrays: bool) -> Any:
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type = self.scalar("<I")
            count = self.scalar("<Q")
            start = self.pos
            if item_type in SCALARS and not keep_arrays:
                self.pos += count * struct.calcsize(SCALARS[item_type])
                if self.pos > len(self.buf):
                    raise Truncated
                return ArrayRef(item_type, count, start, self.pos)
            if item_type == STRING and not keep_arrays:
                # A tight loop: vocabularies hold 150-262k strings, and method calls per item
                # cost ~0.3 s of `bonsai start` time.
                buf, pos, end, unpack = self.buf, self.pos, len(self.buf), U64.unpack_from
                for _ in range(count):
                    if pos + 8 > end:
                        raise Truncated
                    pos += 8 + unpack(buf, pos)[0]
                if pos > end:
                    raise Truncated
                self.pos = pos
                return ArrayRef(item_type, count, start, self.pos)
            return [self.value(item_type, keep_arrays) for _ in range(count)]
        raise BonsaiError(f"unknown GGUF value type {vtype}")


@dataclass(frozen=True)
class ArrayRef:
    """A large array we skipped over; we keep where its bytes are, to hash them."""

    item_type: int
    count: int
    start: int
    end: int


def type_tables():
    """gguf's type tables, without importing the gguf package: its __init__ imports numpy
    (~0.15 s on every `bonsai start`), while gguf/constants.py needs only the standard library."""
    import importlib.util
    import sys

    loaded = sys.modules.get("gguf.constants")
    if loaded is None:
        try:
            spec = importlib.util.find_spec("gguf")  # locates the package without running it
            origin = Path(spec.origin).parent / "constants.py" if spec and spec.origin else None
            file_spec = importlib.util.spec_from_file_location("_bonsai_gguf_constants", origin) if origin else None
            if file_spec is not None and file_spec.loader is not None:
                loaded = importlib.util.module_from_spec(file_spec)
                file_spec.loader.exec_module(loaded)
        except Exception:  # any surprise: the ordinary import below
            loaded = None
    if loaded is None:
        import gguf.constants

        loaded = gguf.constants
    return loaded.GGML_QUANT_SIZES, loaded.GGMLQuantizationType
