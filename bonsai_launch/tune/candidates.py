"""Which configurations `bonsai tune` measures against plain decoding.

Pure: from what the binary supports (its --spec-type list), the drafter (if any) and the
profile's draft-free mode, a list in the order worth measuring when time is short: the
drafter first (n-max always equals its block size), then the model's own MTP layer at n-max 1,
2 and 3 (the community measured each of them fastest on some card), then ngram-mod in front of
the MTP layer or the drafter (a `--spec-type` list, llamacpp/spec_types.py: what Bonsai 2 users
without a drafter run), then the profile's own n-gram type, the other n-gram types at their
default draft length, shorter draft lengths of the profile's type (of every type, and two n-gram
types combined, when the replay screens them: tune/screen.py), and ngram-cache last (it rarely
pays: its drafts are seldom accepted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp import spec_types
from bonsai_launch.models.draft_head import WHOLE_HEAD
from bonsai_launch.models.mtp import TUNE_N_MAX as MTP_N_MAX
from bonsai_launch.tune.draft_head import SUFFIX as WHOLE_HEAD_SUFFIX

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-map-k4v", "ngram-cache")
# Draft lengths tried besides each type's default (ngram-mod 64, the map/simple types 48):
# shorter drafts are proposed more often and cost less when they are rejected.
NMAX_VARIANTS = (16, 8)
LENGTH_TYPES = ("ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v")  # n-max has a flag
# The MTP layer's n-max under ngram-mod: the community's 1 and 2 (3 was slower in two reports).
COMBINED_MTP_N_MAX = (1, 2)
# ngram-simple drafts nothing shorter than its 12-token lookup (common_ngram_simple_draft)
MIN_DRAFT = {"ngram-simple": 12}
# Several n-gram types at once (llama-server tries them in its own order, the first that drafts
# wins; llamacpp/spec_types.py): an exact match of the last 12 tokens first, ngram-mod's hashed
# lookup where that finds nothing. Screened by the replay, so they cost no model time.
COMBINED = (("ngram-simple", "ngram-mod"), ("ngram-map-k", "ngram-mod"))


@dataclass(frozen=True)
class Candidate:
    name: str  # plain, draft-dspark, ngram-mod, ngram-mod/n16, ngram-mod+draft-mtp/n1 (a list: + in names)
    spec_type: str | None = None  # None: plain; several types joined by commas
    n_max: int | None = None  # None: the type's default (the drafter's block size for a drafter)
    with_drafter: bool = True  # launched with the drafter file (False: the model's own MTP layer)
    head_rows: int | None = None  # the draft model's head rows (None: llama's default; 0: the whole head)

    @property
    def label(self) -> str:
        if self.spec_type is None:
            return "plain"
        label = self.spec_type + (f" n-max {self.n_max}" if self.n_max is not None and "/" in self.name else "")
        return label + (", whole draft head" if self.head_rows == WHOLE_HEAD else "")

    @property
    def replayable(self) -> bool:
        """Draft-free only: its drafts on a token stream need no model (llamacpp/replay.py)."""
        return self.spec_type is not None and all(t.startswith("ngram-") for t in spec_types.parts(self.spec_type))

    def flags(self) -> dict[str, Any]:
        """Settings flags that make the launch plan run this configuration."""
        if self.spec_type is None:
            return {"speculative": False, "spec_type": None, "spec_nmax": None}
        block = spec_types.draft_model_part(self.spec_type) in BLOCK_DRAFTER_TYPES
        flags = {"speculative": True, "spec_type": self.spec_type, "spec_nmax": None if block else self.n_max}
        return flags if self.head_rows is None else {**flags, "draft_head_rows": self.head_rows}

    @property
    def drafter_file(self) -> bool:
        """Launched with the drafter file (-md): a draft model that is not the model's own MTP layer."""
        return (
            self.with_drafter and self.spec_type is not None and spec_types.draft_model_part(self.spec_type) is not None
        )


PLAIN = Candidate("plain")
BLOCK_DRAFTER_TYPES = ("draft-dspark", "draft-dflash")  # n-max is the drafter's block size


def combined(types: Iterable[str], n_max: int | None = None, with_drafter: bool = True) -> Candidate:
    """Several types in one launch: named with '+' (a --configs list is split at commas),
    run as the comma list llama-server takes."""
    spec_type = ",".join(types)
    suffix = f"/n{n_max}" if n_max is not None else ""
    return Candidate(spec_types.candidate_name(spec_type) + suffix, spec_type, n_max, with_drafter)


def all_candidates(
    spec_types: Iterable[str] | None,
    drafter_type: str | None = None,
    drafter_block: int | None = None,
    profile_type: str | None = None,
    mtp: str | None = None,
    shared_drafting: bool | None = None,
    replayable: bool = False,
    mtp_head_cut: bool = False,
    drafter_head_cut: bool = False,
) -> list[Candidate]:
    """Every configuration worth measuring, most promising first. `spec_types` is what the
    binary lists (None: not probed, assume all); `drafter_type` is draft-dspark/draft-dflash
    when a drafter that fits the target is present; `mtp` is "model" when the model carries a
    usable MTP layer, "file" when the drafter is an MTP file that fits it; `shared_drafting` False:
    the binary's --spec-type takes one type (None: not probed, taken to take a list).
    `replayable`: the draft-free candidates are screened by replaying a plain run's tokens
    (tune/screen.py), which costs no model time, so every type gets the shorter draft lengths
    too, and the n-gram types combined are added. `mtp_head_cut`, `drafter_head_cut`: the MTP
    layer, or the drafter, drafts from the LM head's first rows by default here
    (models/draft_head.py), so it is also tried with the whole head: a `/whole-head` twin
    (tune/draft_head.py decides after the plain run whether one is worth a run)."""
    known = set(spec_types) if spec_types is not None else None

    def supported(*types: str) -> bool:
        return known is None or all(t in known for t in types)

    out = [PLAIN]
    if drafter_type and supported(drafter_type):
        out.append(Candidate(drafter_type, drafter_type, drafter_block))
        if drafter_head_cut:
            out.append(
                Candidate(f"{drafter_type}/{WHOLE_HEAD_SUFFIX}", drafter_type, drafter_block, head_rows=WHOLE_HEAD)
            )
    if mtp and supported("draft-mtp"):
        out += [Candidate(f"draft-mtp/n{n}", "draft-mtp", n, with_drafter=mtp == "file") for n in MTP_N_MAX]
        if mtp_head_cut:
            out += [
                Candidate(f"draft-mtp/n{n}/{WHOLE_HEAD_SUFFIX}", "draft-mtp", n, mtp == "file", WHOLE_HEAD)
                for n in MTP_N_MAX
            ]
    lists = shared_drafting is not False
    if lists and mtp and supported("ngram-mod", "draft-mtp"):
        out += [combined(("ngram-mod", "draft-mtp"), n, with_drafter=mtp == "file") for n in COMBINED_MTP_N_MAX]
    if lists and drafter_type and supported("ngram-mod", drafter_type):
        out.append(Candidate(f"ngram-mod+{drafter_type}", f"ngram-mod,{drafter_type}", drafter_block))
    own = profile_type if profile_type in NGRAM_TYPES else "ngram-mod"
    ordered = [own] + [t for t in NGRAM_TYPES if t not in (own, "ngram-cache")]
    out += [Candidate(t, t) for t in ordered if supported(t)]
    varied = [t for t in ordered if t in LENGTH_TYPES] if replayable else [own] if own in LENGTH_TYPES else []
    out += [
        Candidate(f"{t}/n{n}", t, n) for t in varied if supported(t) for n in NMAX_VARIANTS if n >= MIN_DRAFT.get(t, 1)
    ]
    if replayable and lists:  # each pair at its default lengths and with every part at the first shorter one
        out += [combined(pair, n) for pair in COMBINED if supported(*pair) for n in (None, NMAX_VARIANTS[0])]
    if own != "ngram-cache" and supported("ngram-cache"):
        out.append(Candidate("ngram-cache", "ngram-cache"))
    return out


def restrict(candidates: list[Candidate], names: Iterable[str]) -> list[Candidate]:
    """Only the named configurations (plain is always kept: it is the baseline). A name may be
    a type with any draft length, `TYPE/nN` for one length not in the default list, or
    `drafter` for the drafter."""
    by_name = {c.name: c for c in candidates}
    drafter = next((c for c in candidates if c.spec_type and c.spec_type.startswith("draft-")), None)
    mtp = [c.name for c in candidates if c.spec_type == "draft-mtp"]
    chosen = [PLAIN]
    # `draft-mtp` alone: every MTP draft length
    names = [n for raw in names for n in (mtp if raw.strip() == "draft-mtp" and mtp else [raw])]
    for raw in names:
        name = raw.strip()
        if not name or name == "plain":
            continue
        if name in ("drafter", "speculative") and drafter is not None:
            found = drafter
        elif name in by_name:
            found = by_name[name]
        elif (
            "/n" in name
            and name.split("/n", 1)[0] in LENGTH_TYPES
            and name.split("/n", 1)[1].isdigit()
            and any(c.spec_type == name.split("/n", 1)[0] for c in candidates)
        ):
            t, n = name.split("/n", 1)
            if not 1 <= int(n) <= 1024:
                raise BonsaiError(f"--configs: draft length in {name!r} must be 1-1024", "for example ngram-mod/n16")
            found = Candidate(name, t, int(n))
        else:
            raise BonsaiError(
                f"--configs: {name!r} cannot be measured with this build and model",
                "choose from " + ", ".join(c.name for c in candidates),
            )
        if found not in chosen:
            chosen.append(found)
    if len(chosen) < 2:
        raise BonsaiError("--configs names no speculative configuration", "for example --configs plain,ngram-mod")
    return chosen
