"""Slots: how many requests llama-server serves at once, and what every slot needs.

Pure functions over plain values; the plan (plan.py) calls them. They decide
- how many slots (-np) to ask for, and why;
- the context (-c), so that every slot keeps its minimum, with or without one shared KV pool (-kvu);
- the batch sizes (-ub/-b) that speculation on several slots needs;
- whether the probed build can speculate on several slots at all.

Facts (llama.cpp b11434: read in its source, checked on the real server with the suite's tiny
DSpark pair and the demo model):
- `-np` unset (-1) means 4 slots sharing one KV pool (`kv_unified`). An explicit `-np N` without
  `-kvu` splits `-c` evenly: each slot gets c/N tokens (tools/server/server.cpp).
- One speculative context serves every slot (llama.cpp #22838): each step drafts for all busy
  slots at once. The target's batch holds every slot's sampled token plus its draft, so
  N x (draft + 1) must fit in `-b`, or the server aborts ("batch must be large enough to hold the
  sampled and draft tokens", server-context.cpp).
- A DSpark/DFlash drafter decodes its blocks non-causally, all slots in one ubatch: N x (n_max + 1)
  must fit in `-ub` too, or the server aborts ("non-causal attention requires n_ubatch >=
  n_tokens"). Measured: -np 4, n-max 4 aborts with -ub 8 and runs with -ub 512. n-gram drafts are
  verified causally and split over ubatches (-np 4 ngram-mod drafts on every slot with -ub 32).
- The draft length of a slot is its type's own limit (common_speculative_n_max): --spec-draft-n-max
  (default 3) for drafter models, --spec-ngram-mod-n-max (64) for ngram-mod, the m-gram size (48)
  for ngram-simple/map-k/map-k4v, 8 for ngram-cache.

The batch rule takes the values of -ub/-b wherever they come from (the arguments after `--`,
which the plan places itself; bonsai_launch.server.passthrough), so it runs once, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp import spec_types

LLAMA_UBATCH_DEFAULT = 512
LLAMA_BATCH_DEFAULT = 2048
LLAMA_AUTO_SLOTS = 4  # what `-np -1` (llama-server's default) becomes
DRAFT_N_MAX_DEFAULT = 3
BLOCK_DRAFTERS = frozenset({"draft-dspark", "draft-dflash"})
# n-gram types: (llama-server option that sets the draft length, its default)
NGRAM_DRAFT_LENGTH: dict[str, tuple[str | None, int]] = {
    "ngram-mod": ("--spec-ngram-mod-n-max", 64),
    "ngram-simple": ("--spec-ngram-simple-size-m", 48),
    "ngram-map-k": ("--spec-ngram-map-k-size-m", 48),
    "ngram-map-k4v": ("--spec-ngram-map-k4v-size-m", 48),
    "ngram-cache": (None, 8),
}
SHARED_DRAFTING_PR = "llama.cpp #22838"


@dataclass(frozen=True)
class SlotChoice:
    count: int | None  # None: llama-server's own default (auto)
    why: str


def choose_slots(parallel: int | None, source: str | None, speculative: bool) -> SlotChoice:
    """The slot count: the user's (--parallel, BONSAI_PARALLEL, the profile, or `-np` after `--`,
    which bonsai_launch.server.passthrough folds into the same setting), else 1 with speculation, else
    llama-server's own default."""
    if parallel is not None and source in ("flag", "passthrough", "env", "profile"):
        where = {
            "flag": "--parallel",
            "passthrough": "-np after --",
            "env": "BONSAI_PARALLEL",
            "profile": "the profile",
        }[source]
        return SlotChoice(parallel, f"{where}: {parallel} request{'s' if parallel != 1 else ''} at once")
    if speculative:
        return SlotChoice(1, "speculation: one slot unless BONSAI_PARALLEL/--parallel asks for more")
    return SlotChoice(
        None,
        f"llama-server's default: auto = {LLAMA_AUTO_SLOTS} slots sharing one KV pool (set BONSAI_PARALLEL to choose)",
    )


def draft_length(spec_type: str, n_max: int | None, option_values: Mapping[str, int] | None = None) -> tuple[int, str]:
    """The longest draft one slot can propose, and where that number comes from. A list of
    types (ngram-mod,draft-mtp) drafts up to its longest: n_max is its draft model's, or, in a
    list of n-gram types only, each one's (llamacpp/spec_types.py)."""
    values = option_values or {}
    if spec_types.is_combined(spec_type):
        model = spec_types.draft_model_part(spec_type)
        longest = max(
            draft_length(part, n_max if model in (None, part) else None, values) for part in spec_types.parts(spec_type)
        )
        return longest[0], f"{longest[1]}, the longest of {spec_type}"
    if spec_type in NGRAM_DRAFT_LENGTH:
        option, default = NGRAM_DRAFT_LENGTH[spec_type]
        if option and values.get(option) is not None:
            return int(values[option]), option
        if option and n_max is not None:  # BONSAI_SPEC_NMAX, passed with the type's own option
            return n_max, "n-max"
        return default, f"{spec_type}'s default draft length"
    if n_max is not None:
        return n_max, "n-max"
    return DRAFT_N_MAX_DEFAULT, "llama-server's default n-max"


@dataclass(frozen=True)
class BatchSizing:
    need: int  # slots x (draft + 1): tokens one speculative step can put in a batch
    ubatch: int  # effective -ub
    batch: int  # effective -b
    ubatch_flag: int | None  # what the plan passes with -ub (None: given elsewhere, or the default suffices)
    batch_flag: int | None
    ubatch_why: str
    batch_why: str


def size_batches(
    slots: int, spec_type: str, draft: int, given_ubatch: int | None = None, given_batch: int | None = None
) -> BatchSizing:
    """-ub and -b for `slots` slots drafting up to `draft` tokens each.

    An explicit value smaller than needed is refused before anything runs (llama-server would
    abort on the first draft). With several slots the plan states both values, so the command
    line shows them; with one slot it adds them only when the defaults are too small.
    """
    need = slots * (draft + 1)
    formula = f"{slots} slot{'s' if slots != 1 else ''} x ({draft} draft + 1) = {need}"
    ubatch_needed = any(part in BLOCK_DRAFTERS for part in spec_types.parts(spec_type))

    def one(label: str, given: int | None, default: int, required: bool) -> tuple[int, int | None, str]:
        if not required:
            if given is not None:
                return given, None, f"{label} {given} as given"
            return (
                default,
                None,
                f"llama-server's default {default}: n-gram drafts are verified causally and split over ubatches",
            )
        if given is not None:
            if given < need:
                raise BonsaiError(
                    f"{label} {given} is smaller than speculation needs: {formula}",
                    f"raise {label} to at least {need}, or use fewer slots (BONSAI_PARALLEL); "
                    "llama-server aborts on the first draft otherwise",
                )
            return given, None, f"{label} {given} as given (at least {formula})"
        value = max(default, need)
        if slots == 1 and value == default:
            return value, None, f"llama-server's default {default} holds {formula}"
        return (
            value,
            value,
            f"at least {formula}" + (f" (llama-server's default is {default})" if value > default else ""),
        )

    ub, ub_flag, ub_why = one("-ub", given_ubatch, LLAMA_UBATCH_DEFAULT, ubatch_needed)
    b, b_flag, b_why = one("-b", given_batch, LLAMA_BATCH_DEFAULT, True)
    if ub > b and b_flag is not None:
        b, b_flag = ub, ub  # llama.cpp clamps -ub to -b; keep the batch at least the ubatch
    return BatchSizing(need, ub, b, ub_flag, b_flag, ub_why, b_why)


@dataclass(frozen=True)
class SlotContext:
    ctx: int
    per_slot: int  # tokens one slot may hold
    why: str
    warning: str | None = None


def context_for_slots(
    slots: int, kv_unified: bool, per_slot_min: int, ctx: int, explicit: bool, min_label: str
) -> SlotContext:
    """The context for `slots` slots, starting from the single-server choice `ctx`.

    Without -kvu llama-server splits the context evenly, so it is raised (when not explicit) to
    slots x the per-slot minimum. With -kvu the slots share one pool: a slot may use all of it,
    so the minimum applies to the pool, and concurrent long conversations compete for it.
    An explicit context is kept; a per-slot share below the minimum gets a warning.
    """
    if kv_unified:
        total = ctx if explicit else max(ctx, per_slot_min)
        why = (
            f"-kvu: {slots} slots share one pool of {total} tokens; a slot may use all of it, together they "
            f"cannot exceed it"
        )
        warning = None
        if total < per_slot_min:
            warning = f"the shared context {total} is below {min_label} ({per_slot_min})"
        return SlotContext(total, total, why, warning)
    want = slots * per_slot_min
    if explicit:
        per = ctx // slots
        warning = None
        if per < per_slot_min:
            warning = (
                f"-c {ctx} split over {slots} slots leaves {per} tokens per slot, below {min_label} "
                f"({per_slot_min}); raise the context to {want}, use fewer slots, or set BONSAI_KV_UNIFIED=1"
            )
        return SlotContext(ctx, per, f"set explicitly; {slots} slots x {per} tokens each", warning)
    total = max(ctx, want)
    per = total // slots
    if total > ctx:
        why = f"{slots} slots x {per_slot_min} tokens ({min_label}); without -kvu llama-server splits -c evenly"
    else:
        why = f"{slots} slots x {per} tokens each (-c is split evenly without -kvu)"
    return SlotContext(total, per, why)


def refuse_unless_build_can(shared_drafting: bool | None, binary: str, slots: int, spec_type: str) -> str:
    """Speculation on several slots needs one draft context for every slot; builds from before
    that design (and the PrismML fork before its rebase) ran DSpark on one slot only. Returns how
    the build was judged, for the reasons."""
    if shared_drafting is None:
        return "build not probed: shared drafting not checked"
    if not shared_drafting:
        raise BonsaiError(
            f"{binary} cannot speculate ({spec_type}) on {slots} slots: its --spec-type takes one type, so it predates "
            f"the shared draft context that serves every slot ({SHARED_DRAFTING_PR})",
            "run `bonsai build` for the pinned llama.cpp, or use one slot (BONSAI_PARALLEL=1)",
        )
    return f"the build drafts for every slot in one context ({SHARED_DRAFTING_PR})"


@dataclass(frozen=True)
class SlotsPlan:
    """What the plan decided about slots, for `--dry-run --json` and the start summary."""

    count: int | None  # None: llama-server's auto
    kv_unified: bool
    per_slot_ctx: int | None
    draft_length: int | None = None
    batch_need: int | None = None
    ubatch: int | None = None
    batch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "parallel": self.count,
            "effective": self.count or LLAMA_AUTO_SLOTS,
            "kv_unified": self.kv_unified,
            "per_slot_ctx": self.per_slot_ctx,
            "draft_length": self.draft_length,
            "batch_need": self.batch_need,
            "ubatch": self.ubatch,
            "batch": self.batch,
        }
