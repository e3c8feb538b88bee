"""Converting a legacy `dspark` drafter into the `dflash` layout upstream llama.cpp loads.

PrismML publishes the Bonsai 27B DSpark drafters in the legacy layout of their old fork
(`general.architecture = "dspark"`, keys under `dspark.dspark.*`, tensors under `dspark.*`,
a `"none"` tokenizer stub). Upstream llama.cpp knows the same network as `dflash`. The
conversion (facts: /work/shared/reference/dspark-conversion.md) renames keys and tensors,
shifts the target layer ids by one (the legacy runtime tapped a layer's output, upstream taps
the next layer's input), takes the tokenizer from the target, and copies every tensor's bytes
unchanged. Then `llama-quantize` from our own build makes it small (Q4_0 by default).

Reading: the legacy file through `gguf.GGUFReader` (memory-mapped); the target only up to the
end of its key/value section (its weights may use types the `gguf` package does not know).
Writing: `gguf.GGUFWriter` for the header, then the tensor bytes streamed from the source in
blocks, hashing the whole source on the way, so memory stays flat for a 7 GB file. The output
is written under a temporary name and renamed only when complete.

The output records where it came from (`bonsai.drafter.*` keys, kept by llama-quantize):
the source's sha256, the target's vocabulary fingerprint and this converter's version, so
`is_current` can tell a stale conversion from a good one without redoing it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import mmap
import os
import re
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models.gguf import GGUFInfo, inspect_gguf
from bonsai_launch.models.gguf_format import ARRAY, NUMPY, SCALARS, STRING, HeaderReader, Truncated

CONVERTER_VERSION = "1"
QUANT_TYPES = ("Q4_0", "Q8_0", "none")
DEFAULT_QUANT = "Q4_0"  # what PrismML's recipe uses: ~0.6 GB for the 27B drafter
COPY_BLOCK = 16 * 2**20

# legacy tensor name -> dflash tensor name; `blk.*`, `output_norm`, `token_embd`, `output` keep theirs
TENSOR_MAP = {
    "dspark.fc.weight": "fc.weight",
    "dspark.hidden_norm.weight": "enc.output_norm.weight",
    "dspark.markov_head_a.weight": "markov_w1.weight",
    "dspark.markov_head_b.weight": "markov_w2.weight",
    "dspark.confidence_head.weight": "conf_proj.weight",
    "dspark.confidence_head.bias": "conf_proj.bias",
    "dspark.log_snr_fc1.weight": "log_snr_fc1.weight",
    "dspark.log_snr_fc1.bias": "log_snr_fc1.bias",
    "dspark.log_snr_fc2.weight": "log_snr_fc2.weight",
    "dspark.log_snr_fc2.bias": "log_snr_fc2.bias",
}
# The drafter's copies of the target's embedding and output head: upstream borrows the
# target's when they are absent, which is safe because the drafter's vocabulary is the target's.
SHARED_TENSORS = ("token_embd.weight", "output.weight")

PROVENANCE_PREFIX = "bonsai.drafter."
SOURCE_SHA256_KEY = PROVENANCE_PREFIX + "source_sha256"
SOURCE_NAME_KEY = PROVENANCE_PREFIX + "source_name"
TARGET_VOCAB_KEY = PROVENANCE_PREFIX + "target_vocab_fingerprint"
VERSION_KEY = PROVENANCE_PREFIX + "converter_version"
SHARED_KEY = PROVENANCE_PREFIX + "shared_tensors"
QUANT_KEY = PROVENANCE_PREFIX + "quantization"

SIDECAR_FIX = (
    "convert the `*-dspark-bf16.gguf` sidecar from the same Hugging Face repo instead "
    "(the Q4_1 file's fc tensor uses the retired legacy type 42)"
)

# GGUF value types


class DrafterDoesNotFit(BonsaiError):
    """The legacy drafter was not made for this target (vocabulary, embedding size, layers, mask)."""


@dataclass(frozen=True)
class KeyValue:
    """One metadata entry with its GGUF type kept (strings as raw bytes, never re-encoded)."""

    key: str
    vtype: int
    value: Any
    sub_type: int | None = None


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


@dataclass(frozen=True)
class TensorCopy:
    source_name: str
    name: str
    ne: tuple[int, ...]  # ggml order, ne0 first
    ggml_type: int
    offset: int  # absolute, in the source file
    nbytes: int


@dataclass
class ConversionPlan:
    """Everything decided before a byte is written: output keys, tensors and what was dropped."""

    source: Path
    target: Path
    key_values: list[KeyValue]
    tensors: list[TensorCopy]
    dropped: list[str]
    alignment: int
    block_size: int
    mask_token_id: int
    target_layers: tuple[int, ...]
    log_snr: bool
    target_vocab_fingerprint: str
    keep_shared_tensors: bool
    quantization: str
    notes: list[str] = field(default_factory=list)


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


# --- reading ------------------------------------------------------------------------------------


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


# --- planning -----------------------------------------------------------------------------------


def _refuse_source(info: GGUFInfo) -> None:
    name = info.path.name
    if info.architecture == "dflash":
        raise BonsaiError(
            f"{name} is already in the dflash layout (nothing to convert)",
            f"pass it to llama-server as it is: bonsai start --drafter {info.path}",
        )
    if info.architecture != "dspark":
        raise BonsaiError(
            f"{name} has architecture {info.architecture!r}, not a legacy 'dspark' drafter",
            "convert-drafter takes PrismML's `*-dspark-bf16.gguf` drafter file",
        )
    unknown = [t for t in info.tensor_types if t.startswith("type")]
    if unknown:
        raise BonsaiError(
            f"{name} has tensors of legacy type {unknown[0].removeprefix('type')}, which no current llama.cpp reads",
            SIDECAR_FIX,
        )


def _renamed_key(key: str) -> str | None:
    """The dflash name of a legacy key; None for keys the output does not keep."""
    if key.startswith(("tokenizer.", PROVENANCE_PREFIX)) or key == "general.architecture":
        return None  # the stub tokenizer is replaced by the target's; the writer sets the arch
    if key.startswith("dspark.dspark."):
        return "dflash." + key.removeprefix("dspark.dspark.")
    if key.startswith("dspark."):
        return "dflash." + key.removeprefix("dspark.")
    return key


def plan_conversion(
    source: str | Path, target: str | Path, *, keep_shared_tensors: bool = False, quantization: str = DEFAULT_QUANT
) -> ConversionPlan:
    """Read both headers and decide the output; raises BonsaiError naming the fix for any file
    that cannot give a drafter llama-server loads for this target."""
    source, target = Path(source), Path(target)
    if quantization not in QUANT_TYPES:
        raise BonsaiError(f"--quantize {quantization!r} is not supported", "use one of " + ", ".join(QUANT_TYPES))
    src_info = inspect_gguf(source)
    _refuse_source(src_info)
    tgt_info = inspect_gguf(target)
    if tgt_info.architecture in ("dspark", "dflash"):
        raise BonsaiError(
            f"--target {target.name} is a drafter ({tgt_info.architecture}), not a target model",
            "pass the target model the drafter will serve (its tokenizer is copied)",
        )

    reader = _open_legacy(source)
    legacy = _legacy_key_values(reader)
    kv = {k.key: k for k in legacy}

    def value(key: str) -> Any:
        item = kv.get(key)
        return None if item is None else item.value

    # keys that would land on the same dflash name (dspark.X and dspark.dspark.X)
    seen: dict[str, str] = {}
    for item in legacy:
        new = _renamed_key(item.key)
        if new is None:
            continue
        if new in seen:
            raise BonsaiError(
                f"{source.name} has both {seen[new]} and {item.key}, which both become {new}",
                "remove one of them from the legacy file",
            )
        seen[new] = item.key

    block_size = value("dspark.dspark.block_size")
    if block_size is None:
        raise BonsaiError(
            f"{source.name} has no dspark.dspark.block_size",
            "the drafter file is incomplete; download the `*-dspark-bf16.gguf` sidecar again",
        )
    layers_item = kv.get("dspark.dspark.target_layers")
    if layers_item is None or layers_item.vtype != ARRAY or not layers_item.value:
        raise BonsaiError(f"{source.name} has no dspark.dspark.target_layers", "the drafter file is incomplete")
    shifted = tuple(int(x) + 1 for x in layers_item.value)
    embedding = value("dspark.embedding_length")
    log_snr = bool(value("dspark.dspark.log_snr_conditioning"))

    tensors, dropped, by_name = [], [], {}
    for t in reader.tensors:
        ne = tuple(int(x) for x in t.shape)
        if t.name in SHARED_TENSORS and not keep_shared_tensors:
            dropped.append(t.name)
            by_name[t.name] = ne
            continue
        if t.name.startswith("dspark."):
            new = TENSOR_MAP.get(t.name)
            if new is None:
                raise BonsaiError(
                    f"{source.name} has tensor {t.name}, which has no dflash equivalent",
                    "this drafter needs a newer bonsai (or the PrismML fork): it cannot be converted",
                )
        else:
            new = t.name
        by_name[new] = ne
        tensors.append(TensorCopy(t.name, new, ne, int(t.tensor_type), int(t.data_offset), int(t.n_bytes)))
    tensors.sort(key=lambda c: c.offset)  # output in source order: one sequential pass over the source
    if log_snr:
        missing = [
            n
            for n in ("log_snr_fc1.weight", "log_snr_fc1.bias", "log_snr_fc2.weight", "log_snr_fc2.bias")
            if n not in by_name
        ]
        if missing:
            raise BonsaiError(
                f"{source.name} declares log-SNR conditioning but lacks {', '.join(missing)}",
                "the drafter file is incomplete; download it again",
            )

    # --- the target: the checks PrismML's script does not make ----------------------------------
    donor = read_key_values(target)
    donor_tok = [k for k in donor if k.key.startswith("tokenizer.")]
    tokens = next((k for k in donor_tok if k.key == "tokenizer.ggml.tokens"), None)
    fix = "pass the target model this drafter was trained for (the matching `--target`)"
    if tokens is None or not tgt_info.vocab_fingerprint:
        raise DrafterDoesNotFit(
            f"--target {target.name} has no tokenizer.ggml.tokens, so it cannot give the drafter a vocabulary", fix
        )
    n_vocab = len(tokens.value)
    for name in ("markov_w1.weight", "markov_w2.weight") + (SHARED_TENSORS if keep_shared_tensors else ()):
        if name in by_name and by_name[name][-1] != n_vocab:
            raise DrafterDoesNotFit(
                f"{source.name} has a {by_name[name][-1]}-token vocabulary ({name}) but --target "
                f"{target.name} has {n_vocab} tokens",
                fix,
            )
    if embedding is not None and tgt_info.embedding is not None and int(embedding) != tgt_info.embedding:
        raise DrafterDoesNotFit(
            f"{source.name} has embedding size {embedding} but --target {target.name} has {tgt_info.embedding}", fix
        )
    if tgt_info.layers is not None and max(shifted) > tgt_info.layers - 1:
        raise DrafterDoesNotFit(
            f"{source.name} reads target layers {list(layers_item.value)} (inputs of {list(shifted)}) "
            f"but --target {target.name} has only {tgt_info.layers} layers",
            fix,
        )
    legacy_mask = value("dspark.dspark.mask_token_id")
    donor_mask = next((k.value for k in donor_tok if k.key == "tokenizer.ggml.mask_token_id"), None)
    mask = legacy_mask if legacy_mask is not None else donor_mask
    if mask is None:
        raise DrafterDoesNotFit(
            f"{source.name} has no mask token id (dspark.dspark.mask_token_id), nor does {target.name}",
            "the drafter file is incomplete",
        )
    if not 0 <= int(mask) < n_vocab:
        raise DrafterDoesNotFit(
            f"{source.name} has mask token id {mask}, outside the {n_vocab}-token vocabulary of {target.name}", fix
        )
    if "conf_proj.weight" in by_name and "markov_w1.weight" in by_name:
        rank = by_name["markov_w1.weight"][0]
        width = by_name["conf_proj.weight"][0]
        if embedding is not None and width != int(embedding) + rank:
            raise DrafterDoesNotFit(
                f"{source.name} has a confidence head {width} wide, but upstream llama.cpp needs "
                f"{int(embedding) + rank} (embedding + Markov rank: confidence_head_with_markov)",
                "this drafter's confidence head is not supported upstream; it cannot be converted",
            )

    # --- the output's keys: source order renamed, then the target's tokenizer, then the mask ------
    out: list[KeyValue] = []
    for item in legacy:
        new = _renamed_key(item.key)
        if new is None or item.key == "dspark.dspark.mask_token_id":
            continue
        if new == "dflash.target_layers":
            item = KeyValue(new, item.vtype, [int(x) + 1 for x in item.value], item.sub_type)
        else:
            item = KeyValue(new, item.vtype, item.value, item.sub_type)
        out.append(item)
    out += [
        k for k in donor_tok if k.key != "tokenizer.ggml.mask_token_id" and not (k.vtype == ARRAY and len(k.value) == 0)
    ]  # gguf's writer cannot write empty arrays
    mask_item = kv.get("dspark.dspark.mask_token_id")
    out.append(KeyValue("tokenizer.ggml.mask_token_id", mask_item.vtype if mask_item else 4, int(mask)))
    notes = []
    if donor_mask is not None and legacy_mask is not None and donor_mask != legacy_mask:
        notes.append(f"the target's mask token id {donor_mask} was replaced by the drafter's own, {legacy_mask}")
    alignment = int(value("general.alignment") or 32)
    return ConversionPlan(
        source,
        target,
        out,
        tensors,
        dropped,
        alignment,
        int(block_size),
        int(mask),
        shifted,
        log_snr,
        str(tgt_info.vocab_fingerprint),
        keep_shared_tensors,
        quantization,
        notes,
    )


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
        CONVERTER_VERSION,
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


# --- quantizing ---------------------------------------------------------------------------------


def find_quantize() -> Path:
    """llama-quantize: next to the llama-server bonsai runs, else from any installed build
    (newest first; quantizing does not depend on our patches or the backend)."""
    from bonsai_launch.core.paths import builds_dir, exe_name
    from bonsai_launch.llamacpp.builds.install import installed_builds
    from bonsai_launch.llamacpp.choice import find_server

    server = find_server(os.environ.get("BONSAI_LLAMA_SERVER") or None)
    candidates = [server.parent / exe_name("llama-quantize")] if server is not None else []
    candidates += [
        Path(m["binaries"]["llama-quantize"])
        for _d, m in installed_builds(builds_dir())
        if m.get("binaries", {}).get("llama-quantize")
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise BonsaiError(
        "llama-quantize is not built" + (f" (not next to {server})" if server else ""),
        "run `bonsai build` (it builds llama-quantize with llama-server), or pass --quantize none",
    )


_QUANT_STEP = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def quantize(
    source: Path, dest: Path, qtype: str, *, on_tensor: Callable[[str], None] | None = None, binary: Path | None = None
) -> None:
    """llama-quantize source dest qtype; `on_tensor` hears each tensor's name as it is done
    (`[ i/ n] name - ...` lines; not in file order). The log is shown on failure, then removed."""
    from bonsai_launch.llamacpp.builds.cmake import run_logged, tail

    binary = binary or find_quantize()
    log_path = dest.with_name(dest.name + ".log")

    def on_line(line: str) -> None:
        m = _QUANT_STEP.match(line)
        if m and on_tensor is not None:
            on_tensor(m.group(3))

    try:
        with log_path.open("w") as log:
            rc = run_logged(
                [str(binary), str(source), str(dest), qtype], cwd=None, env=dict(os.environ), log=log, on_line=on_line
            )
        if rc != 0:
            last = " | ".join(line for line in tail(log_path, 6) if line.strip() and not line.startswith("$ "))
            raise ActionFailed(
                f"llama-quantize failed (exit {rc}): {last}",
                "convert with --quantize none to keep BF16, then run "
                f"`{binary} THAT.gguf OUT.gguf {qtype}` to see its whole log",
            )
    finally:
        log_path.unlink(missing_ok=True)


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


# --- provenance and currency ----------------------------------------------------------------------


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
