"""What a Bonsai 2 / 2.5 file needs, read from its header: the Hadamard fold, its codec, and the
layouts that load on a build but answer gibberish.

Facts: shared/reference/bonsai2-format.md. Three hazards are refused before anything spawns:
- a folded file (`prism.hadamard.*`) on a build that does not apply the fold (a stock
  llama.cpp, a bonsai build older than patch 0010): it loads, and the rotation is never undone;
- PrismML's fork types (142 PQ2_0, 143 PTQ1_0) on a build without them: bonsai repacks them
  into mainline Q2_0 (models/codec_repack.py), so only a binary bonsai did not build meets them;
- PrismML's older group-128 "Q2_0" files, which reuse mainline's type id 42 with 34-byte blocks of
  128 weights: mainline reads 18-byte blocks of 64, overruns or prints garbage. No current
  build reads them; the file's current release (PQ2_0) does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bonsai_launch.models import codec_types as codecs

FOLD_KEY = "prism.hadamard.version"
# Small arrays worth keeping from the header (the sign values are 28k numbers: skipped).
SMALL_ARRAY_KEYS = ("prism.hadamard.sign_widths",)


def fold_facts(kv: dict[str, Any]) -> tuple[int, int | None, bool]:
    """(fold version (0: not folded), block size, grouped value heads) from the header's keys."""
    version = kv.get(FOLD_KEY)
    if not isinstance(version, int) or isinstance(version, bool):
        return 0, None, False
    block = kv.get("prism.hadamard.block_size")
    return version, block if isinstance(block, int) else None, kv.get("prism.hadamard.gdn_v_grouped") is True


def group128_under_q2_0(rows: Sequence[tuple[int, int, int]], data_end: int) -> bool:
    """Whether the type-42 tensors are laid out as 34-byte blocks of 128 (PrismML's old "Q2_0").

    rows: (type id, offset, elements) per tensor. A real Q2_0 tensor needs elements/64*18 bytes
    before the next tensor (or the end of the data); a group-128 one has only elements/128*34,
    which is less: any type-42 tensor with too little room, and exactly enough for 128/34, says so.
    """
    ordered = sorted(rows, key=lambda r: r[1])
    found = False
    for i, (type_id, offset, elements) in enumerate(ordered):
        if type_id != codecs.Q2_0:
            continue
        room = (ordered[i + 1][1] if i + 1 < len(ordered) else data_end) - offset
        q2_0 = elements // 64 * 18
        g128 = elements // 128 * 34
        if room < q2_0:
            if room < g128:
                return False  # neither layout fits: a truncated file, reported as such
            found = True
    return found


def main_codec(tensor_types: dict[str, int]) -> str | None:
    """The weight codec of most matrices: the quantized type with the most tensors."""
    quantized = {k: v for k, v in tensor_types.items() if k not in ("F32", "F16", "BF16")}
    return max(quantized, key=lambda k: quantized[k]) if quantized else None


def codec_block(codec: str | None) -> int | None:
    """Weights per block of the ternary codecs (Q2_0 64, PQ2_0/PTQ1_0 128); None for others."""
    blocks = {name: codecs.BLOCKS[type_id][0] for type_id, name in codecs.NAMES.items()}
    return blocks.get(codec or "")


def hazard(info: Any, *, can_fold: bool, repacks: bool) -> tuple[str, str] | None:
    """(why this build would answer gibberish from the file, what to do) or None when it would not.

    can_fold: the build applies prism.hadamard.* (our series from patch 0010 on, or the fork);
    repacks: bonsai turns PQ2_0/PTQ1_0 into Q2_0 before the build sees them (the builds it made)."""
    name = info.path.name
    if info.q2_0_group128:
        return (
            (
                f"{name} stores PrismML's old group-128 'Q2_0' blocks under mainline's type id 42, which every "
                "current build misreads (gibberish or an overrun)"
            ),
            "download the model's current PQ2_0 file instead (the repository's *-PQ2_0.gguf, or `bonsai pull --profile NAME`)",
        )
    found = fork_types(info)
    if found and not repacks:
        return (
            f"{name} uses PrismML's {'/'.join(found)} (types 142/143), which this llama-server was not built by bonsai to take",
            (
                "run it on a build bonsai made (`bonsai build`; unset BONSAI_LLAMA_SERVER), which serves it repacked "
                "as Q2_0, or on a PrismML fork build (`bonsai build --source prismml`, BONSAI_LAYOUT=fork)"
            ),
        )
    if info.fold_version and not can_fold:
        return (
            (
                f"{name} is Hadamard-folded (prism.hadamard.version {info.fold_version}) and this llama-server does not "
                "undo the fold, so it would answer gibberish"
            ),
            (
                "run `bonsai build` (our series folds it from patch 0010 on) and unset BONSAI_LLAMA_SERVER, "
                "or use a PrismML fork build (`bonsai build --source prismml`)"
            ),
        )
    return None


def fork_types(info: Any) -> list[str]:
    return [t for t in ("PQ2_0", "PTQ1_0") if t in info.tensor_types]
