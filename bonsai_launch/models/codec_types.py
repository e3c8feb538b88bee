"""The weight types of Bonsai 2 files (mainline Q2_0, PrismML's PQ2_0 and PTQ1_0): ids, block
sizes and names, without numpy, so that reading a GGUF header (every `bonsai start`) does not
import it; the byte-level codecs are in ternary_codecs."""

from __future__ import annotations

Q2_0, PQ2_0, PTQ1_0 = 42, 142, 143
# type id -> (weights per block, bytes per block)
BLOCKS = {Q2_0: (64, 18), PQ2_0: (128, 34), PTQ1_0: (128, 28)}
FORK_TYPES = {PQ2_0: "PQ2_0", PTQ1_0: "PTQ1_0"}
# names for the header reader, whose `gguf` package may predate these types
NAMES = {Q2_0: "Q2_0", **FORK_TYPES}


def q2_0_bytes(type_id: int, n_bytes: int) -> int:
    """How many bytes a tensor of n_bytes in type_id takes as Q2_0."""
    weights, size = BLOCKS[type_id]
    return n_bytes // size * weights // 64 * 18
