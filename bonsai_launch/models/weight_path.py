"""Which form of a model's weights the server holds, and how many bytes that is: the file as it
is ("native"), or PrismML's PQ2_0/PTQ1_0 tensors rewritten as mainline Q2_0 ("repack to Q2_0").

Pure: a function of the file's tensor types and bytes, the backend and what the build can do.
The plan sizes memory from `weight_bytes`, and `start`, `inspect` and the dry run show the path.
Why each way (shared/reference/bonsai2-format.md):
- A PrismML fork build runs both types itself.
- Our builds have no PQ2_0 kernels: PQ2_0 is repacked, losslessly, into Q2_0 (36 bytes per 128
  weights instead of 34: 2.25 bits per weight against 2.125).
- PTQ1_0 (1.75 bits per weight) is served as it is by a CPU build whose ggml has the type
  (Capabilities.ptq1_0_cpu); on other builds and backends it is repacked (2.25, 29% more), which
  decides whether a 27B fits an 8 GB machine (about 5.5 GB of matrices against 7.0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bonsai_launch.models import codec_types as codecs

NATIVE = "native"
REPACK_Q2_0 = "repack to Q2_0"


@dataclass(frozen=True)
class WeightPath:
    path: str  # NATIVE or REPACK_Q2_0
    codec: str | None  # the file's own codec (its most common quantized type)
    served: str | None  # the codec the server holds: the file's, or Q2_0
    weight_bytes: int  # tensor bytes the server holds
    file_bytes: int  # tensor bytes in the file
    why: str

    def describe(self) -> str:
        """`PTQ1_0 repacked to Q2_0 (why): 7.0 GB of weights, the file's 5.5 GB`."""
        held = f"{gb(self.weight_bytes)} of weights"
        if self.path == NATIVE:
            return f"{self.codec or 'the file'} as it is ({self.why}): {held}"
        return f"{self.codec} repacked to {self.served} ({self.why}): {held}, the file's {gb(self.file_bytes)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "codec": self.codec,
            "served": self.served,
            "weight_bytes": self.weight_bytes,
            "file_bytes": self.file_bytes,
            "why": self.why,
        }


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def choose(
    tensor_types: Mapping[str, int],
    type_bytes: Mapping[str, int],
    backend: str,
    *,
    fork_build: bool,
    ptq1_0_cpu: bool,
) -> WeightPath:
    """The path for a file with these tensor types (counts) and bytes per type, on a build of
    `backend` (cpu, cuda, vulkan, ...) that is PrismML's fork or not and serves PTQ1_0 on the
    CPU or not."""
    quantized = {k: v for k, v in tensor_types.items() if k not in ("F32", "F16", "BF16")}
    codec = max(quantized, key=lambda k: quantized[k]) if quantized else None
    total = sum(type_bytes.values())
    fork = [t for t in codecs.FORK_TYPES.values() if t in tensor_types]

    def native(why: str) -> WeightPath:
        return WeightPath(NATIVE, codec, codec, total, total, why)

    if not fork:
        return native("no PrismML type to repack")
    if fork_build:
        return native("PrismML's fork build runs its own types")
    if fork == ["PTQ1_0"] and backend == "cpu" and ptq1_0_cpu:
        return native("this CPU build serves PTQ1_0 itself")
    ids = {name: type_id for type_id, name in codecs.FORK_TYPES.items()}
    held = total + sum(codecs.q2_0_bytes(ids[t], type_bytes.get(t, 0)) - type_bytes.get(t, 0) for t in fork)
    if fork == ["PTQ1_0"]:
        why = f"no PTQ1_0 kernels {'on the ' + backend + ' backend' if backend != 'cpu' else 'in this build'}"
    else:
        why = "no PQ2_0 kernels in our builds"
    return WeightPath(REPACK_Q2_0, codec, "Q2_0", held, total, why + ", lossless")
