"""What a converted drafter records about where it came from (`bonsai.drafter.*` keys), and
whether a file is a legacy drafter or a conversion that went stale."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models.drafters.legacy import (
    KeyValue,
    read_key_values,
)
from bonsai_launch.models.gguf import inspect_gguf
from bonsai_launch.models.gguf_format import STRING

CONVERTER_VERSION = "1"


QUANT_TYPES = ("Q4_0", "Q8_0", "none")


DEFAULT_QUANT = "Q4_0"  # what PrismML's recipe uses: ~0.6 GB for the 27B drafter


PROVENANCE_PREFIX = "bonsai.drafter."


SOURCE_SHA256_KEY = PROVENANCE_PREFIX + "source_sha256"


SOURCE_NAME_KEY = PROVENANCE_PREFIX + "source_name"


TARGET_VOCAB_KEY = PROVENANCE_PREFIX + "target_vocab_fingerprint"


VERSION_KEY = PROVENANCE_PREFIX + "converter_version"


SHARED_KEY = PROVENANCE_PREFIX + "shared_tensors"


QUANT_KEY = PROVENANCE_PREFIX + "quantization"


@dataclass(frozen=True)
class Provenance:
    source_sha256: str
    source_name: str
    target_vocab_fingerprint: str
    converter_version: str
    shared_tensors: str  # "dropped" or "kept"
    quantization: str

    def key_values(self) -> list[KeyValue]:
        return [
            KeyValue(k, STRING, v.encode())
            for k, v in (
                (SOURCE_SHA256_KEY, self.source_sha256),
                (SOURCE_NAME_KEY, self.source_name),
                (TARGET_VOCAB_KEY, self.target_vocab_fingerprint),
                (VERSION_KEY, self.converter_version),
                (SHARED_KEY, self.shared_tensors),
                (QUANT_KEY, self.quantization),
            )
        ]

    def to_json(self) -> dict[str, str]:
        return dict(self.__dict__)


def read_provenance(path: str | Path) -> Provenance | None:
    """The bonsai.drafter.* record of a converted file; None for any other file."""
    path = Path(path)
    try:
        kv = {k.key: k.value for k in read_key_values(path) if k.key.startswith(PROVENANCE_PREFIX)}
    except (BonsaiError, OSError):
        return None
    try:
        return Provenance(
            *(
                kv[k].decode()
                for k in (SOURCE_SHA256_KEY, SOURCE_NAME_KEY, TARGET_VOCAB_KEY, VERSION_KEY, SHARED_KEY, QUANT_KEY)
            )
        )
    except (KeyError, AttributeError):
        return None


def stale_reasons(converted: Path, source_sha256: str | None, target: Path) -> list[str]:
    """Why `converted` is not the current conversion of that source for that target (empty: it is)."""
    prov = read_provenance(converted)
    if prov is None:
        return [f"{converted.name} carries no conversion record"]
    reasons = []
    if prov.converter_version != CONVERTER_VERSION:
        reasons.append(f"made by converter version {prov.converter_version}, this bonsai has {CONVERTER_VERSION}")
    if source_sha256 is not None and prov.source_sha256 != source_sha256:
        reasons.append(f"made from another source file (sha256 {prov.source_sha256[:12]}…, now {source_sha256[:12]}…)")
    fingerprint = inspect_gguf(target).vocab_fingerprint
    if prov.target_vocab_fingerprint != fingerprint:
        reasons.append(
            f"made for another vocabulary ({prov.target_vocab_fingerprint}, {target.name} has {fingerprint})"
        )
    return reasons


def is_legacy_drafter(path: Path) -> bool:
    with contextlib.suppress(BonsaiError, OSError):
        return inspect_gguf(path).architecture == "dspark"
    return False


def default_output_name(source: Path, quantization: str = DEFAULT_QUANT) -> str:
    """`X-dspark-bf16.gguf` -> `X-dspark-dflash-Q4_0.gguf` (PrismML's tools look for `*dspark-dflash*`)."""
    stem = source.name.removesuffix(".gguf")
    base = re.sub(r"-dspark(-[A-Za-z0-9_]+)?$", "", stem)
    suffix = "" if quantization == "none" else f"-{quantization}"
    return f"{base}-dspark-dflash{suffix}.gguf"
