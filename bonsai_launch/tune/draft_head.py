"""Whether `bonsai tune` measures a draft model with the whole LM head as well as its first rows.

Where the CPU computes the head, patches 0015-0016 have a qwen35 MTP layer, and a DSpark/DFlash
drafter that borrows the target's head, draft from its first 65536 rows only
(models/draft_head.py): a drafted token then costs less, but a token past the cut is never
drafted. Which pays depends on the user's text: 2% of English or code tokens lie
past the cut, 30% of Chinese, Japanese, Korean or Russian ones (docs/benchmarks.md). The plain
run's answers say it for the tuned prompts, at no model time: below MIN_SHARE_PAST the cut can
lose at most that share of the drafts, less than the whole head's extra rows cost. Those rows
cost 0.14 of a step per drafted token on the Bonsai 2 2B (measured), about 0.035 on the 27B
(248320 x 5120 of 27B weights: estimated by their share) and 0.31 of a step a cycle of four
drafts on the dense DSpark pair (measured). So the whole-head runs are left out and the budget
goes to the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

from bonsai_launch.llamacpp.replay import Stream
from bonsai_launch.models.draft_head import DEFAULT_ROWS as DRAFT_HEAD_DEFAULT_ROWS
from bonsai_launch.models.draft_head import WHOLE_HEAD

MIN_SHARE_PAST = 0.02
SUFFIX = "whole-head"  # the candidates' names: draft-mtp/n2/whole-head


def cut_sibling(name: str) -> str:
    """The configuration a whole-head twin doubles: draft-mtp/n2/whole-head -> draft-mtp/n2."""
    return name.removesuffix(f"/{SUFFIX}")


def share_past(streams: Mapping[str, Stream], rows: int = DRAFT_HEAD_DEFAULT_ROWS) -> float | None:
    """The share of the answers' tokens whose id is `rows` or more (None: no answer tokens)."""
    tokens = [t for s in streams.values() for t in s.generated]
    return sum(t >= rows for t in tokens) / len(tokens) if tokens else None


def is_whole_head(flags: Mapping[str, object]) -> bool:
    return flags.get("draft_head_rows") == WHOLE_HEAD


def skip_why(streams: Mapping[str, Stream]) -> str | None:
    """Why the whole-head candidates are not measured (None: they are): the plain run's answers
    have too few tokens past the cut to lose by it. Without answers they are measured."""
    share = share_past(streams)
    if share is None or share >= MIN_SHARE_PAST:
        return None
    return (
        f"{share:.1%} of plain's answer tokens lie past the draft head's first {DRAFT_HEAD_DEFAULT_ROWS} rows "
        f"(under {MIN_SHARE_PAST:.0%}): the cut loses at most that share of drafts, less than the whole head "
        "costs; name it in --configs to measure it anyway"
    )


def evidence(streams: Mapping[str, Stream]) -> dict[str, object]:
    """What a decision records of the check: the cut, and the share of plain's answer tokens past it."""
    share = share_past(streams)
    return {"rows": DRAFT_HEAD_DEFAULT_ROWS, "share_past": None if share is None else round(share, 4)}
