"""Converting a legacy `dspark` drafter into the `dflash` layout upstream llama.cpp loads.

PrismML publishes the Bonsai 27B DSpark drafters in the legacy layout of their old fork
(`general.architecture = "dspark"`, keys under `dspark.dspark.*`, tensors under `dspark.*`,
a `"none"` tokenizer stub). Upstream llama.cpp knows the same network as `dflash`. The
conversion (facts: shared/reference/dspark-conversion.md) renames keys and tensors,
shifts the target layer ids by one (the legacy runtime tapped a layer's output, upstream taps
the next layer's input), takes the tokenizer from the target, and copies every tensor's bytes
unchanged. Then `llama-quantize` from our own build makes it small (Q4_0 by default).

Reading (legacy.py): the legacy file through `gguf.GGUFReader` (memory-mapped); the target only
up to the end of its key/value section (its weights may use types the `gguf` package does not
know). Planning (plan.py) decides every key and tensor before anything is written. Writing
(here): `gguf.GGUFWriter` for the header, then the tensor bytes streamed from the source in
blocks, hashing the whole source on the way, so memory stays flat for a 7 GB file. The output
is written under a temporary name and renamed only when complete.

The output records where it came from (`bonsai.drafter.*` keys, kept by llama-quantize;
provenance.py): the source's sha256, the target's vocabulary fingerprint and this converter's version, so
`is_current` can tell a stale conversion from a good one without redoing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models.drafters import provenance as versions
from bonsai_launch.models.drafters.plan import ConversionPlan, plan_conversion
from bonsai_launch.models.drafters.provenance import (
    DEFAULT_QUANT,
    Provenance,
)
from bonsai_launch.models.drafters.quantize import find_quantize, quantize

COPY_BLOCK = 16 * 2**20


# GGUF value types


@dataclass(frozen=True)
class ConversionResult:
    output: Path
    source: Path
    target: Path
    provenance: Provenance
    tensors: int
    dropped: tuple[str, ...]
    size: int
    seconds: float
    log_snr: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "output": str(self.output),
            "source": str(self.source),
            "target": str(self.target),
            "tensors": self.tensors,
            "dropped": list(self.dropped),
            "size": self.size,
            "seconds": round(self.seconds, 2),
            "log_snr_conditioning": self.log_snr,
            "provenance": self.provenance.to_json(),
        }


# --- writing ------------------------------------------------------------------------------------


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def write_converted(plan: ConversionPlan, dest: Path, *, on_bytes: Callable[[int], None] | None = None) -> Provenance:
    """Write the dflash file to `dest` (the caller's temporary name); returns its provenance.

    The source's sha256 is only known after the full pass, but the header comes first: the
    header gets a placeholder of the same length, overwritten in place at the end.
    """
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    placeholder = ("pending-" + uuid.uuid4().hex).ljust(64, "0")
    provenance = Provenance(
        placeholder,
        plan.source.name,
        plan.target_vocab_fingerprint,
        versions.CONVERTER_VERSION,  # read at call time: one value for writing and for stale_reasons
        "kept" if plan.keep_shared_tensors else "dropped",
        plan.quantization,
    )
    writer = GGUFWriter(str(dest), "dflash")
    writer.data_alignment = plan.alignment
    try:
        for item in plan.key_values + provenance.key_values():
            writer.add_key_value(
                item.key,
                item.value,
                GGUFValueType(item.vtype),
                sub_type=GGUFValueType(item.sub_type) if item.sub_type is not None else None,
            )
        for t in plan.tensors:
            writer.add_tensor_info(
                t.name,
                tuple(reversed(t.ne)),
                np.dtype(np.float32),
                t.nbytes,
                raw_dtype=GGMLQuantizationType(t.ggml_type),
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None  # opened by write_header_to_file
        out = writer.fout[0]
        header_end = out.tell()
        out.write(b"\0" * (_pad(header_end, plan.alignment) - header_end))
        digest = _stream_tensors(plan, out, on_bytes)
        out.flush()
    finally:
        writer.close()
    sha = digest.hexdigest()
    with dest.open("r+b") as fh:  # the placeholder sits in the header, before the tensor data
        head = fh.read(header_end)
        at = head.find(placeholder.encode())
        if at < 0:
            raise ActionFailed(f"internal error: the provenance placeholder is missing from {dest}")
        fh.seek(at)
        fh.write(sha.encode())
    return dataclasses.replace(provenance, source_sha256=sha)


def _stream_tensors(plan: ConversionPlan, out, on_bytes: Callable[[int], None] | None) -> hashlib._Hash:
    """One sequential pass over the source: every byte is hashed, the kept tensors' bytes are
    copied, each padded to the alignment. Memory: one block, whatever the file size."""
    digest = hashlib.sha256()
    buf = bytearray(COPY_BLOCK)
    view = memoryview(buf)
    with plan.source.open("rb") as src:
        pos = 0

        def advance(until: int, sink=None) -> None:
            nonlocal pos
            while pos < until:
                n = src.readinto(view[: min(COPY_BLOCK, until - pos)])
                if not n:
                    raise ActionFailed(
                        f"{plan.source.name} ended at byte {pos:,} while its tensors need {until:,}",
                        "download it again (`bonsai pull` verifies it)",
                    )
                chunk = view[:n]
                digest.update(chunk)
                if sink is not None:
                    sink.write(chunk)
                pos += n
                if on_bytes is not None:
                    on_bytes(n)

        written = 0
        for t in plan.tensors:
            if t.offset < pos:
                raise ActionFailed(
                    f"{plan.source.name}: tensor {t.source_name} overlaps the one before it",
                    "the file is damaged; download it again",
                )
            advance(t.offset)
            advance(t.offset + t.nbytes, out)
            padded = _pad(t.nbytes, plan.alignment)
            out.write(b"\0" * (padded - t.nbytes))
            written += padded
        size = os.fstat(src.fileno()).st_size
        advance(size)  # the rest (dropped tensors, padding) still counts toward the sha256
    return digest


# --- the whole job ------------------------------------------------------------------------------


def _temp(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}.tmp")


def convert_drafter(
    source: str | Path,
    target: str | Path,
    output: str | Path,
    *,
    keep_shared_tensors: bool = False,
    quantization: str = DEFAULT_QUANT,
    force: bool = False,
    reporter=None,
    quantize_finder: Callable[[], Path] | None = None,
) -> ConversionResult:
    """Convert (and quantize) a legacy drafter for `target` into `output`.

    Refuses before writing anything when a file is wrong or `output` exists without `force`.
    `reporter` (see download_progress) draws the progress; nothing half-written is left
    behind after a failure or Ctrl+C: the output appears only by the final rename.
    `quantize_finder` returns llama-quantize once the files are known to be fine.
    """
    from bonsai_launch.models.progress import RecordingReporter

    source, target, output = Path(source), Path(target), Path(output)
    started = time.monotonic()
    reporter = reporter or RecordingReporter()
    if output.suffix != ".gguf":
        raise BonsaiError(f"-o {output} must end in .gguf", "name the output like NAME-dspark-dflash-Q4_0.gguf")
    for other, what in ((source, "the source"), (target, "--target")):
        if other.exists() and output.exists() and output.resolve() == other.resolve():
            raise BonsaiError(f"-o {output} is {what}: converting in place would destroy it", "choose another -o")
    if output.exists() and not force:
        raise BonsaiError(f"{output} already exists", "add --force to replace it, or choose another -o")
    if not output.parent.is_dir():
        raise BonsaiError(f"-o {output}: folder {output.parent} does not exist", "create it, or choose another -o")
    plan = plan_conversion(source, target, keep_shared_tensors=keep_shared_tensors, quantization=quantization)
    for note in plan.notes:
        reporter.note(f"note: {note}")

    converted = _temp(output, "dflash")
    quantized = _temp(output, quantization)
    try:
        quantize_bin = (quantize_finder or find_quantize)() if quantization != "none" else None
        bar = reporter.bar(f"converting {source.name}", source.stat().st_size)
        try:
            provenance = write_converted(plan, converted, on_bytes=bar.update)
        finally:
            bar.close()
        final = converted
        if quantize_bin is not None:
            sizes = {t.name: t.nbytes for t in plan.tensors}  # the bar counts source bytes done
            qbar = reporter.bar(f"quantizing to {quantization}", sum(sizes.values()))
            try:
                quantize(
                    converted,
                    quantized,
                    quantization,
                    on_tensor=lambda name: qbar.update(sizes.pop(name, 0)),
                    binary=quantize_bin,
                )
            finally:
                qbar.close()
            converted.unlink()
            final = quantized
        os.replace(final, output)
    except BaseException:
        converted.unlink(missing_ok=True)
        quantized.unlink(missing_ok=True)
        raise
    return ConversionResult(
        output,
        source,
        target,
        provenance,
        len(plan.tensors),
        tuple(plan.dropped),
        output.stat().st_size,
        time.monotonic() - started,
        plan.log_snr,
    )
