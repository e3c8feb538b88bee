"""The draft head: which LM head rows a drafter drafts from (bonsai's patches 0015 and 0016).

Where the CPU computes the head, a qwen35/qwen35moe MTP layer (0015) and a DSpark/DFlash drafter
that borrows the target's head (0016, as the published drafters do) multiply by the head's first
rows only: 65536 by default, the whole head on a GPU; `--spec-draft-head-rows N` (0017) sets how
many, 0 is the whole head.
A BPE vocabulary's first ids are its most frequent pieces, so the cut keeps most drafts of
English and code and fewer of other scripts; a token past it is never drafted, and the verify
still decides every token, so answers are unchanged (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the plan's option table reads FLAG on every start: no GGUF reader for it
    from bonsai_launch.models.gguf import GGUFInfo

FLAG = "--spec-draft-head-rows"  # patch 0017: each server (each model of a router) its own rows
MTP_ARCHS = frozenset({"qwen35", "qwen35moe"})  # whose MTP graph takes the cut (patch 0015)
DEFAULT_ROWS = 65536
WHOLE_HEAD = 0


def ordered_by_frequency(target: GGUFInfo) -> bool:
    """Whether the vocabulary's first ids are its most frequent pieces: a BPE vocabulary
    (`gpt2` in GGUF: Qwen's, Bonsai's) is ordered by merge rank. Gemma 3's SentencePiece one is
    not: 17% of English licence text lies past id 65536 there (docs/benchmarks.md), so the cut
    would cost drafts on every text."""
    return target.tokenizer_model == "gpt2"


def mtp_head_is_cut(target: GGUFInfo, head_on_cpu: bool) -> bool:
    """Whether draft-mtp on this model drafts from fewer rows than its vocabulary by default."""
    return head_on_cpu and target.architecture in MTP_ARCHS and (target.vocab_size or 0) > DEFAULT_ROWS


def borrowed_head_past_cut(target: GGUFInfo, drafter: GGUFInfo | None) -> bool:
    """Whether patch 0016 would cut this drafter's head where the CPU computes it: the drafter
    borrows the target's head (one with a head of its own is not cut) and the vocabulary runs past
    the default rows."""
    borrows = drafter is not None and drafter.drafter is not None and drafter.drafter.borrows_head
    return borrows and (target.vocab_size or 0) > DEFAULT_ROWS


def drafter_head_is_cut(target: GGUFInfo, drafter: GGUFInfo | None, head_on_cpu: bool) -> bool:
    """Whether a DSpark/DFlash drafter drafts from fewer rows than the vocabulary under bonsai's
    default: patch 0016's cut, except where the vocabulary is not ordered by frequency, where the
    plan passes the whole head (server/plan/speculation.py)."""
    return head_on_cpu and borrowed_head_past_cut(target, drafter) and ordered_by_frequency(target)
