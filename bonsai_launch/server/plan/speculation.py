"""Speculation in the plan: a drafter's flags (block size = n-max, always), the model's own MTP
layer (draft-mtp, in the model or in a separate MTP file), a draft-free n-gram type with its
own length flags, or several of them at once (BONSAI_SPEC_TYPE=ngram-mod,draft-mtp: n-gram
lookups and at most one draft model); what the binary must support for each."""

from __future__ import annotations

import dataclasses

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp import spec_types
from bonsai_launch.llamacpp.capabilities import Capabilities, require_flag
from bonsai_launch.models import draft_head
from bonsai_launch.models.gguf import GGUFInfo, check_pair
from bonsai_launch.models.mtp import DEFAULT_N_MAX as MTP_DEFAULT_N_MAX
from bonsai_launch.models.mtp import has_usable_mtp, mtp_pair_problems, mtp_problems
from bonsai_launch.server import slots as slot_rules
from bonsai_launch.server.plan.types import ArgvBuilder, PlanInputs, SpecPlan


def require_spec_type(caps: Capabilities | None, spec_type: str) -> None:
    if caps is not None and caps.spec_types and spec_type not in caps.spec_types:
        raise BonsaiError(
            f"speculative type {spec_type} is not supported by {caps.binary} (it knows {', '.join(sorted(caps.spec_types))})",
            "run `bonsai build` to build the pinned llama.cpp, or point BONSAI_LLAMA_SERVER at a newer binary",
        )


def require_log_snr(caps: Capabilities | None, drafter: GGUFInfo) -> None:
    if caps is not None and drafter.drafter is not None and drafter.drafter.log_snr and not caps.dspark_log_snr:
        raise BonsaiError(
            f"{drafter.path.name} uses log-SNR conditioning, which {caps.binary} does not implement "
            "(it would refuse the file: wrong number of tensors)",
            "run `bonsai build` to build the pinned llama.cpp with bonsai's log-SNR patch, or unset BONSAI_LLAMA_SERVER",
        )


def plan_speculation(inputs: PlanInputs, ngl: int, b: ArgvBuilder) -> SpecPlan | None:
    """The speculative part of the plan (None: plain), with the draft model's head rows."""
    return _draft_head(inputs, _speculation(inputs, ngl, b), b)


def _draft_head(inputs: PlanInputs, spec: SpecPlan | None, b: ArgvBuilder) -> SpecPlan | None:
    """BONSAI_DRAFT_HEAD_ROWS: how many of the LM head's first rows the draft model drafts from
    (patches 0015-0016; the option is 0017's): a qwen35 MTP layer, or a DSpark/DFlash drafter that
    borrows the target's head. Unset, llama's own default holds: 65536 rows where the CPU computes
    the head."""
    s = inputs.settings
    rows = s.get("draft_head_rows")
    if rows is None:
        return _whole_head_unless_ordered(inputs, spec, b)
    setting = f"BONSAI_DRAFT_HEAD_ROWS={rows} ({s.source('draft_head_rows')})"
    model = spec_types.draft_model_part(spec.spec_type) if spec is not None else None
    if spec is None or model not in ("draft-mtp", "draft-dspark", "draft-dflash"):
        b.warnings.append(
            f"{setting} has no effect: only draft-mtp and a DSpark/DFlash drafter draft from the head's first rows"
        )
        return spec
    if model == "draft-mtp" and inputs.model.architecture not in draft_head.MTP_ARCHS:
        b.warnings.append(
            f"{setting} has no effect on {inputs.model.architecture}: only the MTP layers of "
            f"{' and '.join(sorted(draft_head.MTP_ARCHS))} models draft from the head's first rows"
        )
        return spec
    drafter = inputs.drafter.drafter if inputs.drafter is not None else None
    if model != "draft-mtp" and (drafter is None or not drafter.borrows_head):
        b.warnings.append(f"{setting} has no effect: the drafter has a head of its own; only a borrowed one is cut")
        return spec
    who = "the MTP layer" if model == "draft-mtp" else "the drafter"
    what = "the whole LM head" if rows == 0 else f"the LM head's first {rows} rows (rounded down to 64)"
    require_flag(inputs.capabilities, draft_head.FLAG, "BONSAI_DRAFT_HEAD_ROWS")
    b.add(draft_head.FLAG, rows, f"{setting}: {who} drafts from {what}")
    return dataclasses.replace(spec, head_rows=rows)


def _whole_head_unless_ordered(inputs: PlanInputs, spec: SpecPlan | None, b: ArgvBuilder) -> SpecPlan | None:
    """The detected default: patch 0016 cuts any target's borrowed head, but only a vocabulary
    ordered by frequency keeps most drafts inside the cut, so a drafter borrowing another kind
    (Gemma 3's SentencePiece) gets the whole head. qwen35's MTP layers (0015) are always BPE."""
    model = spec_types.draft_model_part(spec.spec_type) if spec is not None else None
    if spec is None or model not in ("draft-dspark", "draft-dflash"):
        return spec
    target = inputs.model
    if not draft_head.borrowed_head_past_cut(target, inputs.drafter) or draft_head.ordered_by_frequency(target):
        return spec  # nothing to cut, or the cut keeps most drafts
    caps = inputs.capabilities
    if caps is not None and not caps.accepts(draft_head.FLAG):
        return spec  # not bonsai's build: it has no cut either (patch 0016)
    tokenizer = inputs.model.tokenizer_model
    why = f"{tokenizer} vocabulary, not ordered by frequency: the drafter drafts from the whole LM head"
    b.add(draft_head.FLAG, draft_head.WHOLE_HEAD, why)
    return dataclasses.replace(spec, head_rows=draft_head.WHOLE_HEAD)


def _speculation(inputs: PlanInputs, ngl: int, b: ArgvBuilder) -> SpecPlan | None:
    s = inputs.settings
    if not s["speculative"]:
        for key, env in (("spec_type", "BONSAI_SPEC_TYPE"), ("spec_nmax", "BONSAI_SPEC_NMAX")):
            if s.is_explicit(key):
                b.warnings.append(f"{env} is set but speculation is off; it has no effect (set BONSAI_SPECULATIVE=1)")
        if inputs.drafter is not None and inputs.tuning is None:  # auto decided it off: not the user's doing
            b.warnings.append(
                f"drafter {inputs.drafter.path.name} is given but speculation is off; "
                "it is not loaded (set BONSAI_SPECULATIVE=1 or --speculative)"
            )
        return None

    wanted_type = s.get("spec_type")
    if wanted_type == "none":
        raise BonsaiError("BONSAI_SPEC_TYPE='none' contradicts BONSAI_SPECULATIVE=1", "unset one of them")
    if spec_types.is_combined(wanted_type):
        return plan_combined(inputs, ngl, b)
    drafter = inputs.drafter
    if wanted_type and wanted_type.startswith("ngram"):
        drafter = None  # an explicit draft-free type needs no drafter
    mtp_file = drafter is not None and drafter.drafter is None and drafter.nextn_layers > 0
    # The model's own MTP layer comes before a profile's draft-free type: it is trained to
    # predict the model's next token, an n-gram lookup only finds repeated text.
    own_mtp = wanted_type is None and drafter is None and has_usable_mtp(inputs.model)
    if wanted_type == "draft-mtp" or mtp_file or own_mtp:
        return plan_mtp(inputs, ngl, b, drafter)
    if drafter is not None:
        return plan_drafter(inputs, ngl, b, drafter)

    # Without a profile, the draft-free mode the profiles use: it is lossless, costs little when
    # it finds nothing to draft, and the proof says whether it drafted. A profile without one
    # (its drafter is the point) is refused instead: n-gram there would hide the missing drafter.
    draft_free = wanted_type or (inputs.profile.draft_free_type if inputs.profile else NO_PROFILE_DRAFT_FREE)
    if not draft_free:
        name = inputs.profile.name if inputs.profile else "this model"
        why = f" ({inputs.drafter_unavailable})" if inputs.drafter_unavailable else ""
        raise BonsaiError(
            f"BONSAI_SPECULATIVE=1 but {name} has no usable drafter and no draft-free mode{why}",
            "pass --drafter PATH, or set BONSAI_SPEC_TYPE=ngram-mod for draft-free n-gram speculation",
        )
    if not draft_free.startswith("ngram"):
        raise BonsaiError(f"BONSAI_SPEC_TYPE={draft_free!r} needs a drafter model", "pass --drafter PATH")
    require_spec_type(inputs.capabilities, draft_free)
    origin = (
        "" if wanted_type else " (profile default)" if inputs.profile else " (no drafter, no MTP layer, no profile)"
    )
    b.add("--spec-type", draft_free, "draft-free n-gram speculation" + origin)
    return SpecPlan(draft_free, ngram_lengths(inputs, b, (draft_free,), s.get("spec_nmax")))


def plan_drafter(inputs: PlanInputs, ngl: int, b: ArgvBuilder, drafter: GGUFInfo, combined: str = "") -> SpecPlan:
    """A DSpark/DFlash drafter: its type, and n-max = its block size, always. `combined`: the
    BONSAI_SPEC_TYPE list it drafts in (the n-gram types' flags are plan_combined's)."""
    s = inputs.settings
    wanted_type = s.get("spec_type")
    _require_fit(
        check_pair(inputs.model, drafter),
        "drafter does not fit the target",
        f"replace {drafter.path.name} with the drafter made for {inputs.model.path.name}",
    )
    assert drafter.drafter is not None and drafter.drafter.block_size is not None
    needed = "draft-dspark" if drafter.drafter.kind == "dspark" else "draft-dflash"
    if wanted_type and (spec_types.draft_model_part(wanted_type) if combined else wanted_type) != needed:
        raise BonsaiError(
            f"BONSAI_SPEC_TYPE={wanted_type!r} does not match the drafter {drafter.path.name}, which needs {needed}",
            f"unset BONSAI_SPEC_TYPE or set it to {needed}" + (" in the list" if combined else ""),
        )
    require_spec_type(inputs.capabilities, needed)
    require_log_snr(inputs.capabilities, drafter)
    block = drafter.drafter.block_size
    if s.get("spec_nmax") is not None and s["spec_nmax"] != block:
        raise BonsaiError(
            f"BONSAI_SPEC_NMAX={s['spec_nmax']} differs from the drafter's block size {block} ({drafter.path.name})",
            "unset BONSAI_SPEC_NMAX: n-max always equals the block size",
        )
    if inputs.profile and inputs.profile.drafter_warning:
        b.warnings.append(inputs.profile.drafter_warning)
    b.add("-md", drafter.path, "speculation: the drafter")
    why = f"the drafter is a {drafter.drafter.kind} model"
    b.add("--spec-type", combined or needed, COMBINED_WHY.format(model=why) if combined else why)
    b.add("--spec-draft-n-max", block, f"the drafter's block size, read from {drafter.path.name}")
    b.add("-ngld", ngl, "drafter GPU layers follow the target's" + (" (CPU)" if ngl == 0 else ""))
    return SpecPlan(combined or needed, block, str(drafter.path), ngl)


COMBINED_WHY = (
    "BONSAI_SPEC_TYPE: n-gram lookup drafts repeated text first, and where it finds none {model} drafts "
    "(llama-server tries the types in this order every step)"
)


def plan_combined(inputs: PlanInputs, ngl: int, b: ArgvBuilder) -> SpecPlan:
    """BONSAI_SPEC_TYPE with several types (llamacpp/spec_types.py has the facts): n-gram
    lookups with at most one draft model. BONSAI_SPEC_NMAX is the draft model's n-max; without
    one, it caps every n-gram type's length."""
    s, caps = inputs.settings, inputs.capabilities
    wanted = s["spec_type"]
    problem = spec_types.combination_problem(wanted)
    if problem:
        raise BonsaiError(f"BONSAI_SPEC_TYPE={wanted!r} {problem}", "keep one draft-* type in the list")
    if caps is not None and caps.shared_drafting is False:
        raise BonsaiError(
            f"BONSAI_SPEC_TYPE={wanted!r} lists several types, but the --spec-type of {caps.binary} takes one",
            "run `bonsai build` (the pinned llama.cpp takes a list), or set one type",
        )
    for part in spec_types.parts(wanted):
        require_spec_type(caps, part)
    model, grams = spec_types.draft_model_part(wanted), spec_types.ngram_parts(wanted)
    if model is None:
        b.add(
            "--spec-type", wanted, "BONSAI_SPEC_TYPE: n-gram lookups together (llama-server tries them in this order)"
        )
        return SpecPlan(wanted, ngram_lengths(inputs, b, grams, s.get("spec_nmax")))
    drafter = inputs.drafter
    if model == "draft-mtp":
        spec = plan_mtp(inputs, ngl, b, drafter, combined=wanted)
    elif model in ("draft-dspark", "draft-dflash") and drafter is not None and drafter.drafter is not None:
        spec = plan_drafter(inputs, ngl, b, drafter, combined=wanted)
    else:
        raise BonsaiError(
            f"BONSAI_SPEC_TYPE={wanted!r} needs a {model} model, and bonsai has none for it here",
            "pass --drafter with a DSpark/DFlash drafter, or use draft-mtp on a model with an MTP layer",
        )
    ngram_lengths(inputs, b, grams, None)
    return spec


# The n-gram types ignore --spec-draft-n-max (b11434 reads it for draft models only): each has
# its own length flag. ngram-mod also drops drafts shorter than its n-min (default 48).
NGRAM_LENGTH_FLAGS = {t: option for t, (option, _default) in slot_rules.NGRAM_DRAFT_LENGTH.items() if option}


NGRAM_MOD_DEFAULT_N_MIN = 48
NO_PROFILE_DRAFT_FREE = "ngram-mod"  # what every profile with a draft-free mode names


PER_SLOT_MIN_DRAFT = 8  # below this an n-gram draft saves too little to pay for its verification


def per_slot_draft(spec_type: str, slots: int) -> int | None:
    """The draft length planned per slot for an n-gram type on `slots` slots (None: its
    default stands). A speculative step verifies every busy slot's draft in one batch; with
    the one-slot default (ngram-mod 64) on 4 slots that is up to 260 tokens, on a CPU as costly
    as that many prompt tokens, mostly for drafts that are rejected. Sharing the one-slot budget
    keeps a step's batch near one slot's."""
    option, default = slot_rules.NGRAM_DRAFT_LENGTH.get(spec_type, (None, 0))
    if option is None or slots < 2:
        return None
    return max(PER_SLOT_MIN_DRAFT, default // slots)


def ngram_lengths(inputs: PlanInputs, b: ArgvBuilder, grams: tuple[str, ...], n_max: int | None) -> int | None:
    """Each n-gram type's draft-length flags: `n_max` (BONSAI_SPEC_NMAX) when given, else on
    several slots one slot's budget shared. Returns the length planned (None: the types' own)."""
    s, caps = inputs.settings, inputs.capabilities
    if n_max is not None:
        for spec_type in grams:
            for flag, value in ngram_length_flags(spec_type, n_max):
                require_flag(caps, flag, "BONSAI_SPEC_NMAX")
                why = f"BONSAI_SPEC_NMAX ({s.source('spec_nmax')}): {spec_type} drafts at most {n_max} tokens"
                b.add(flag, value, why)
            if spec_type not in NGRAM_LENGTH_FLAGS:
                b.warnings.append(f"BONSAI_SPEC_NMAX has no effect on {spec_type}, whose draft length is fixed")
        return n_max
    slots = slot_rules.choose_slots(s.get("parallel"), s.source("parallel"), True).count or 1
    planned = None
    for spec_type in grams:
        per_slot = per_slot_draft(spec_type, slots)
        option = NGRAM_LENGTH_FLAGS.get(spec_type)
        flags = ngram_length_flags(spec_type, per_slot) if per_slot is not None else []
        # the length after -- is the user's; a binary without the flags keeps the type's default
        if (
            not flags
            or not option
            or inputs.passthrough.last_int(option) is not None
            or not all(caps is None or caps.accepts(f) for f, _ in flags)
        ):
            continue
        for flag, value in flags:
            b.add(
                flag,
                value,
                f"{slots} slots share one step's draft budget ({slot_rules.NGRAM_DRAFT_LENGTH[spec_type][1]} "
                f"tokens, {spec_type}'s default for one slot): {per_slot} each, so a step of every slot does not "
                "verify a huge batch of mostly rejected drafts (BONSAI_SPEC_NMAX sets it)",
            )
        planned = max(planned or 0, per_slot or 0)
    return planned


def ngram_length_flags(spec_type: str, n_max: int) -> list[tuple[str, int]]:
    """The flags that cap an n-gram type's draft length at n_max."""
    flag = NGRAM_LENGTH_FLAGS.get(spec_type)
    if flag is None:
        return []
    flags = [(flag, n_max)]
    if spec_type == "ngram-mod":
        flags.append(("--spec-ngram-mod-n-min", min(n_max, NGRAM_MOD_DEFAULT_N_MIN)))
    return flags


def plan_mtp(inputs: PlanInputs, ngl: int, b: ArgvBuilder, mtp_file: GGUFInfo | None, combined: str = "") -> SpecPlan:
    """draft-mtp: the model's own multi-token-prediction layer (or a separate MTP-only file) drafts.
    Every refusal comes here, before llama-server starts: it exits (no MTP layers) or aborts
    (two MTP blocks on qwen35) otherwise. models/mtp.py has the facts. `combined`: the
    BONSAI_SPEC_TYPE list it drafts in (the n-gram types' flags are plan_combined's)."""
    s, wanted = inputs.settings, inputs.settings.get("spec_type")
    if mtp_file is not None and mtp_file.drafter is not None and has_usable_mtp(inputs.model):
        b.warnings.append(
            f"drafter {mtp_file.path.name} is not loaded: draft-mtp drafts with {inputs.model.path.name}'s own MTP layer"
        )
        mtp_file = None
    if mtp_file is not None and mtp_file.drafter is not None:
        needed = "draft-dspark" if mtp_file.drafter.kind == "dspark" else "draft-dflash"
        raise BonsaiError(
            f"BONSAI_SPEC_TYPE='draft-mtp' runs MTP layers, but the drafter {mtp_file.path.name} is a "
            f"{mtp_file.drafter.kind} drafter (it needs {needed})",
            "drop --drafter to use the model's own MTP layer, or unset BONSAI_SPEC_TYPE",
        )
    if wanted not in (None, "draft-mtp") and not combined:
        assert mtp_file is not None
        raise BonsaiError(
            f"BONSAI_SPEC_TYPE={wanted!r} does not match {mtp_file.path.name}, an MTP file, which needs draft-mtp",
            "unset BONSAI_SPEC_TYPE or set it to draft-mtp",
        )
    if mtp_file is not None:
        _require_fit(
            mtp_pair_problems(inputs.model, mtp_file),
            "the MTP file does not fit the target",
            f"use the MTP file made for {inputs.model.path.name}",
        )
    else:
        _require_fit(
            mtp_problems(inputs.model)[:1],
            "BONSAI_SPEC_TYPE=draft-mtp cannot run on this model",
            "pass --drafter with an MTP file made for this model, or set BONSAI_SPEC_TYPE=ngram-mod (no drafter)",
        )
    require_spec_type(inputs.capabilities, "draft-mtp")
    n_max = s.get("spec_nmax")
    why = f"BONSAI_SPEC_NMAX ({s.source('spec_nmax')})"
    if n_max is None:
        n_max = MTP_DEFAULT_N_MAX
        why = "draft-mtp default: n-max 2 was slower than 1 on some cards (`bonsai tune` measures 1-3)"
    where = mtp_file.path.name if mtp_file is not None else inputs.model.path.name
    if mtp_file is not None:
        b.add("-md", mtp_file.path, "speculation: the MTP layer's own file")
    model = f"the multi-token-prediction layer of {where}"
    b.add("--spec-type", combined or "draft-mtp", COMBINED_WHY.format(model=model) if combined else model + " drafts")
    b.add("--spec-draft-n-max", n_max, why)
    if mtp_file is not None:
        b.add("-ngld", ngl, "MTP file GPU layers follow the target's" + (" (CPU)" if ngl == 0 else ""))
        return SpecPlan(combined or "draft-mtp", n_max, str(mtp_file.path), ngl)
    return SpecPlan(combined or "draft-mtp", n_max)


def _require_fit(problems: list[str], what: str, fix: str) -> None:
    """A drafter or MTP file that does not fit its target stops the plan: what, why, the fix."""
    if problems:
        raise BonsaiError(f"{what}: " + "; ".join(problems), fix)
