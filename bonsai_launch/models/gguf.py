"""Read what the launcher needs from a GGUF header, and check a drafter against its target.

We read only the header (key/values and tensor index) through a memory map, using the `gguf`
package's type tables. `gguf.GGUFReader` itself parses every array value into numpy objects,
which takes ~24 s for a 262k-token vocabulary; walking the header ourselves takes
milliseconds, so inspecting a 10 GB file is instant and never touches the weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import mmap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models import bonsai2_file, gguf_cache
from bonsai_launch.models import codec_types as codecs
from bonsai_launch.models.gguf_format import ArrayRef, HeaderReader, Truncated, type_tables

GGUF_MAGIC = b"GGUF"
# Target architectures whose graphs expose per-layer inputs to a DFlash/DSpark drafter.
LAYER_INPUT_ARCHS = frozenset({"llama", "qwen3", "qwen35", "qwen3moe", "gemma4", "lfm2"})
LEGACY_BLOCK_SIZE_KEYS = ("dspark.dspark.block_size", "dspark.block_size")
# DSpark log-SNR conditioning (PrismML's GIDD-trained Bonsai drafters): the flag, its bounds and
# four tensors, all required together by our patched llama.cpp (vendor/llama.cpp/patches/0002-*).
LOG_SNR_TENSORS = ("log_snr_fc1.weight", "log_snr_fc1.bias", "log_snr_fc2.weight", "log_snr_fc2.bias")


@dataclass(frozen=True)
class DrafterInfo:
    """What a DSpark/DFlash drafter declares about itself."""

    kind: str  # "dspark", "dflash" or "legacy-dspark" (the PrismML fork's format)
    block_size: int | None
    target_layers: tuple[int, ...]
    mask_token_id: int | None
    draft_layers: int | None
    has_confidence_head: bool
    log_snr: bool = False  # dflash.log_snr_conditioning
    log_snr_min: float | None = None  # dflash.min_log_snr
    log_snr_max: float | None = None  # dflash.max_log_snr
    log_snr_tensors: tuple[str, ...] = ()  # which of LOG_SNR_TENSORS the file holds
    borrows_head: bool = False  # no head of its own (no output/token_embd, no reduced vocabulary): the target's

    def log_snr_problems(self, name: str) -> list[str]:
        """Why our patched llama-server would refuse this drafter's log-SNR part (empty if none)."""
        if self.kind == "legacy-dspark":
            return []  # refused as a whole already
        fix = "convert it again from the *-dspark-bf16.gguf with `bonsai convert-drafter`"
        present = set(self.log_snr_tensors)
        if not self.log_snr:
            if present:
                return [
                    (
                        f"{name} holds the log-SNR tensors ({', '.join(sorted(present))}) but does not set "
                        f"dflash.log_snr_conditioning = true, so llama-server refuses it (wrong number of tensors); {fix}"
                    )
                ]
            return []
        problems = []
        missing = [t for t in LOG_SNR_TENSORS if t not in present]
        if missing:
            problems.append(
                f"{name} declares log-SNR conditioning (dflash.log_snr_conditioning = true) but lacks "
                f"the tensor{'s' if len(missing) > 1 else ''} {', '.join(missing)}: the file is incomplete; {fix}"
            )
        lo, hi = self.log_snr_min, self.log_snr_max
        if lo is None or hi is None:
            absent = [k for k, v in (("dflash.min_log_snr", lo), ("dflash.max_log_snr", hi)) if v is None]
            problems.append(f"{name} declares log-SNR conditioning but lacks {' and '.join(absent)}; {fix}")
        elif not (math.isfinite(lo) and math.isfinite(hi)):
            problems.append(f"{name} has log-SNR bounds that are not finite (min {lo}, max {hi}); {fix}")
        elif not hi > lo:
            problems.append(f"{name} has dflash.max_log_snr {hi} not greater than dflash.min_log_snr {lo}; {fix}")
        return problems


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    layers: int | None
    embedding: int | None
    context_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    vocab_size: int | None
    vocab_fingerprint: str | None  # sha256 (first 16 hex digits) of the token list
    tokenizer_model: str | None
    has_chat_template: bool
    block_size: int | None
    tensor_count: int
    tensor_types: dict[str, int]
    data_bytes: int  # bytes the tensors need after the header
    drafter: DrafterInfo | None = None
    keys: tuple[str, ...] = field(default=(), repr=False)
    # MTP ({arch}.nextn_predict_layers, the nextn.* tensors, is the trunk there): models/mtp.py
    nextn_layers: int = 0
    mtp_tensors: tuple[str, ...] = field(default=(), repr=False)
    trunk_tensors: bool = True
    # Bonsai 2 (models/bonsai2_file.py): prism.hadamard.version (0: not folded), its block size
    # and grouped value heads; PrismML's old group-128 blocks under type id 42
    fold_version: int = 0
    fold_block: int | None = None
    fold_grouped: bool = False
    q2_0_group128: bool = False
    type_bytes: dict[str, int] = field(default_factory=dict)  # tensor bytes per type (what a path holds)
    full_attention_interval: int | None = None  # hybrid (qwen35): one layer in N has a KV cache

    @property
    def trunk_layers(self) -> int | None:
        """The layers the model runs (block_count minus the MTP blocks): what a drafter may tap."""
        return None if self.layers is None else self.layers - self.nextn_layers

    @property
    def is_drafter(self) -> bool:
        return self.drafter is not None

    def kv_bytes_per_token(self, bytes_per_value: float = 2.0) -> int | None:
        """KV cache cost of one token of context (f16 by default), for context sizing; a hybrid's
        delta-net layers keep a fixed-size state instead, so only its attention layers count."""
        layers = self.trunk_layers
        if layers and self.full_attention_interval:
            layers //= self.full_attention_interval
        if not (layers and self.head_count_kv and (self.key_length or self.head_count)):
            return None
        head_dim = self.key_length or (self.embedding or 0) // (self.head_count or 1)
        value_dim = self.value_length or head_dim
        return int(layers * self.head_count_kv * (head_dim + value_dim) * bytes_per_value)

    def to_json(self) -> dict[str, Any]:
        out = {
            k: getattr(self, k)
            for k in (
                "file_size",
                "version",
                "architecture",
                "name",
                "layers",
                "embedding",
                "context_length",
                "head_count",
                "head_count_kv",
                "vocab_size",
                "vocab_fingerprint",
                "tokenizer_model",
                "has_chat_template",
                "tensor_count",
                "tensor_types",
            )
        }
        out["path"] = str(self.path)
        out["trunk_layers"] = self.trunk_layers
        out["codec"] = bonsai2_file.main_codec(self.tensor_types)
        out["codec_block"] = 128 if self.q2_0_group128 else bonsai2_file.codec_block(out["codec"])
        out["folded"] = (
            {"version": self.fold_version, "block": self.fold_block, "grouped_v_heads": self.fold_grouped}
            if self.fold_version
            else None
        )
        out["q2_0_group128"] = self.q2_0_group128
        out["mtp_layers"] = self.nextn_layers
        out["drafter"] = (
            None
            if self.drafter is None
            else {
                "kind": self.drafter.kind,
                "block_size": self.drafter.block_size,
                "target_layers": list(self.drafter.target_layers),
                "mask_token_id": self.drafter.mask_token_id,
                "draft_layers": self.drafter.draft_layers,
                "has_confidence_head": self.drafter.has_confidence_head,
                "log_snr": self.drafter.log_snr,
                "log_snr_min": self.drafter.log_snr_min,
                "log_snr_max": self.drafter.log_snr_max,
                "log_snr_tensors": list(self.drafter.log_snr_tensors),
                "borrows_head": self.drafter.borrows_head,
            }
        )
        return out


def _small_array_keys(key: str) -> bool:
    return key.endswith("target_layers") or key == "general.tags" or key in bonsai2_file.SMALL_ARRAY_KEYS


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read a GGUF file's header. Raises BonsaiError for a missing, non-GGUF or truncated file."""
    path = Path(path)
    if not path.is_file():
        raise BonsaiError(f"{path}: file not found", "check the path, or run `bonsai pull`")
    stat = path.stat()
    size = stat.st_size
    if size < 24:
        raise BonsaiError(f"{path.name} is not a GGUF file ({size} bytes)", "point at a .gguf model file")
    cached = _from_cache(path, gguf_cache.get(path, stat))
    if cached is not None:
        return cached
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != GGUF_MAGIC:
            raise BonsaiError(
                f"{path.name} is not a GGUF file (it does not start with 'GGUF')", "point at a .gguf model file"
            )
        try:
            info = _parse(path, size, buf)
            gguf_cache.put(path, stat, {**dataclasses.asdict(info), "path": str(info.path)})
            return info
        except Truncated:
            raise BonsaiError(
                f"{path.name} is truncated: the file ends inside its header ({size} bytes)",
                "download it again (`bonsai pull` resumes and verifies)",
            ) from None


def _from_cache(path: Path, data: dict[str, Any] | None) -> GGUFInfo | None:
    if data is None:
        return None
    try:
        drafter = data.pop("drafter")
        if drafter is not None:
            drafter = DrafterInfo(
                **{
                    **drafter,
                    "target_layers": tuple(drafter["target_layers"]),
                    "log_snr_tensors": tuple(drafter["log_snr_tensors"]),
                }
            )
        for key in ("keys", "mtp_tensors"):
            data[key] = tuple(data[key])
        return GGUFInfo(**{**data, "path": path, "drafter": drafter})
    except (ValueError, TypeError, KeyError):
        return None


def _parse(path: Path, size: int, buf: mmap.mmap) -> GGUFInfo:
    GGML_QUANT_SIZES, GGMLQuantizationType = type_tables()

    r = HeaderReader(buf)
    r.take(4)
    version = r.scalar("<I")
    if version not in (2, 3):
        raise BonsaiError(
            f"{path.name}: GGUF version {version} is not supported", "convert it with a current llama.cpp"
        )
    n_tensors = r.scalar("<Q")
    n_kv = r.scalar("<Q")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.scalar("<I")
        kv[key] = r.value(vtype, keep_arrays=_small_array_keys(key))

    alignment = int(kv.get("general.alignment", 32))
    types: Counter[str] = Counter()
    type_bytes: Counter[str] = Counter()
    tensor_names: set[str] = set()
    data_bytes = 0
    rows: list[tuple[int, int, int]] = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.scalar("<I")
        dims = [r.scalar("<Q") for _ in range(n_dims)]
        ttype = r.scalar("<I")
        offset = r.scalar("<Q")
        tensor_names.add(name)
        try:
            qtype = GGMLQuantizationType(ttype)
            type_name = qtype.name
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            type_name, (block, type_size) = (
                codecs.NAMES.get(ttype, f"type{ttype}"),
                codecs.BLOCKS.get(ttype, (1, 0)),
            )
        types[type_name] += 1
        elements = math.prod(dims)
        type_bytes[type_name] += elements * type_size // block
        rows.append((ttype, offset, elements))
        data_bytes = max(data_bytes, offset + elements * type_size // block)
    data_start = (r.pos + alignment - 1) // alignment * alignment
    g128 = bonsai2_file.group128_under_q2_0(rows, size - data_start)
    if g128:  # the detection found the tensors fit the file: refused as a layout, not as truncated
        data_bytes = size - data_start
    if data_start + data_bytes > size:
        raise BonsaiError(
            f"{path.name} is truncated: its tensors need {data_start + data_bytes:,} bytes but the file has {size:,}",
            "download it again (`bonsai pull` resumes and verifies)",
        )

    arch = str(kv.get("general.architecture", "?"))

    def arch_key(suffix: str) -> Any:
        value = kv.get(f"{arch}.{suffix}")
        return None if isinstance(value, ArrayRef) else value

    tokens = kv.get("tokenizer.ggml.tokens")
    vocab_size = fingerprint = None
    if isinstance(tokens, ArrayRef):
        vocab_size = tokens.count
        fingerprint = hashlib.sha256(buf[tokens.start : tokens.end]).hexdigest()[:16]

    block_size = arch_key("block_size")
    if block_size is None:
        for legacy in LEGACY_BLOCK_SIZE_KEYS:
            if legacy in kv:
                block_size = kv[legacy]
                break

    drafter = None
    if arch in ("dflash", "dspark"):
        kind = "legacy-dspark" if arch == "dspark" else ("dspark" if "markov_w1.weight" in tensor_names else "dflash")
        target_layers = arch_key("target_layers")
        if target_layers is None and arch == "dspark":
            target_layers = kv.get("dspark.dspark.target_layers")
        mask = kv.get("tokenizer.ggml.mask_token_id")
        # the legacy layout keeps these keys under "dspark.dspark." and the tensors under "dspark."
        snr_prefix = "dspark.dspark" if arch == "dspark" else "dflash"
        snr_min, snr_max = kv.get(f"{snr_prefix}.min_log_snr"), kv.get(f"{snr_prefix}.max_log_snr")
        drafter = DrafterInfo(
            kind=kind,
            block_size=int(block_size) if block_size is not None else None,
            target_layers=tuple(int(x) for x in (target_layers or ())),
            mask_token_id=int(mask) if mask is not None else None,
            draft_layers=arch_key("block_count"),
            has_confidence_head="conf_proj.weight" in tensor_names,
            log_snr=kv.get(f"{snr_prefix}.log_snr_conditioning") is True,
            log_snr_min=float(snr_min) if isinstance(snr_min, (int, float)) else None,
            log_snr_max=float(snr_max) if isinstance(snr_max, (int, float)) else None,
            log_snr_tensors=tuple(t for t in LOG_SNR_TENSORS if t in tensor_names or f"dspark.{t}" in tensor_names),
            borrows_head=not {"output.weight", "token_embd.weight", "d2t"} & tensor_names,
        )

    tokenizer_model = kv.get("tokenizer.ggml.model")
    nextn = arch_key("nextn_predict_layers")
    fold_version, fold_block, fold_grouped = bonsai2_file.fold_facts(kv)
    interval = arch_key("full_attention_interval")
    return GGUFInfo(
        path=path,
        file_size=size,
        version=version,
        architecture=arch,
        name=kv.get("general.name") if isinstance(kv.get("general.name"), str) else None,
        layers=arch_key("block_count"),
        embedding=arch_key("embedding_length"),
        context_length=arch_key("context_length"),
        head_count=arch_key("attention.head_count"),
        head_count_kv=arch_key("attention.head_count_kv"),
        key_length=arch_key("attention.key_length"),
        value_length=arch_key("attention.value_length"),
        vocab_size=vocab_size,
        vocab_fingerprint=fingerprint,
        tokenizer_model=tokenizer_model if isinstance(tokenizer_model, str) else None,
        has_chat_template="tokenizer.chat_template" in kv,
        block_size=int(block_size) if block_size is not None else None,
        tensor_count=n_tensors,
        tensor_types=dict(sorted(types.items())),
        data_bytes=data_bytes,
        drafter=drafter,
        keys=tuple(kv),
        nextn_layers=int(nextn) if isinstance(nextn, int) else 0,
        mtp_tensors=tuple(sorted(n for n in tensor_names if ".nextn." in n)),
        trunk_tensors="blk.0.attn_norm.weight" in tensor_names,
        fold_version=fold_version,
        fold_block=fold_block,
        fold_grouped=fold_grouped,
        q2_0_group128=g128,
        type_bytes=dict(sorted(type_bytes.items())),
        full_attention_interval=interval if isinstance(interval, int) and interval > 1 else None,
    )


def check_pair(target: GGUFInfo, drafter: GGUFInfo) -> list[str]:
    """Every reason this drafter cannot serve this target (empty when the pair fits).

    These are the checks llama-server itself does not make for dflash/dspark drafters: it
    would load the pair and then fail, or quietly serve without speculation.
    """
    d, t = drafter.drafter, target
    name, tname = drafter.path.name, target.path.name
    if d is None:
        return [f"{name} is not a DSpark/DFlash drafter (architecture {drafter.architecture!r})"]
    problems: list[str] = []
    if d.kind == "legacy-dspark":
        problems.append(
            f"{name} is a legacy 'dspark' drafter that upstream llama.cpp cannot load; "
            "use the PrismML fork (bonsai build --source git:...) or a dflash conversion"
        )
    problems += d.log_snr_problems(name)
    if d.block_size is None:
        problems.append(f"{name} has no block size (dflash.block_size); it cannot be used, and guessing one is unsafe")
    if drafter.embedding != t.embedding:
        problems.append(f"{name} has embedding size {drafter.embedding} but {tname} has {t.embedding}")
    # the MTP blocks are not run by the target: a tap on one aborts llama-server at the first request
    trunk = t.trunk_layers
    bad_layers = [i for i in d.target_layers if trunk is None or not 0 <= i < trunk]
    if bad_layers:
        mtp = (
            f" (and {t.nextn_layers} MTP layer{'s' if t.nextn_layers > 1 else ''} it does not run)"
            if t.nextn_layers
            else ""
        )
        problems.append(f"{name} reads target layers {bad_layers} but {tname} has {trunk} layers{mtp}")
    if d.mask_token_id is None:
        problems.append(f"{name} has no mask token id (tokenizer.ggml.mask_token_id)")
    elif t.vocab_size is not None and d.mask_token_id >= t.vocab_size:
        problems.append(f"{name} has mask token id {d.mask_token_id}, outside the vocabulary of {t.vocab_size}")
    if drafter.vocab_size != t.vocab_size:
        problems.append(
            f"{name} has {drafter.vocab_size} tokens but {tname} has {t.vocab_size}: not the same vocabulary"
        )
    elif drafter.vocab_fingerprint != t.vocab_fingerprint:
        problems.append(
            f"{name} and {tname} have different token lists (fingerprints "
            f"{drafter.vocab_fingerprint} vs {t.vocab_fingerprint})"
        )
    if t.architecture not in LAYER_INPUT_ARCHS:
        problems.append(
            f"{tname} has architecture {t.architecture!r}, which does not expose layer inputs to a drafter "
            f"(supported: {', '.join(sorted(LAYER_INPUT_ARCHS))})"
        )
    return problems
