"""Planning a conversion without writing anything: which keys are renamed (and the target layer ids
shifted by one), which tensors are copied, which are dropped, and why a source or target is refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models.drafters.legacy import (
    SIDECAR_FIX,
    KeyValue,
    _legacy_key_values,
    _open_legacy,
    read_key_values,
)
from bonsai_launch.models.drafters.provenance import (
    DEFAULT_QUANT,
    PROVENANCE_PREFIX,
    QUANT_TYPES,
)
from bonsai_launch.models.gguf import GGUFInfo, inspect_gguf
from bonsai_launch.models.gguf_format import ARRAY

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


class DrafterDoesNotFit(BonsaiError):
    """The legacy drafter was not made for this target (vocabulary, embedding size, layers, mask)."""


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
