"""Several speculative types at once: how llama-server (b11434) runs a `--spec-type` list.

Facts (common/arg.cpp and common/speculative.cpp of the pin; checked on our build with the
suite's tiny qwen35 targets, tests/test_bonsai2_speculation.py):
- `--spec-type` takes a comma-separated list (builds with llama.cpp #22838, which
  Capabilities.shared_drafting reads from --help); `none` in it means no speculation at all.
- Each type in the list gets its own drafter. At every step, for every slot, they are tried in a
  fixed order, whatever the list's order: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod,
  ngram-cache, then draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark; the first
  one that proposes a draft drafts that step. So with ngram-mod,draft-mtp the lookup drafts long
  runs of repeated text and the model's MTP layer drafts whenever the lookup finds nothing.
- There is one draft context: the draft-model types all read `-md`'s model (or the target's own
  MTP layers), so a list holds at most one of them.
- Each type keeps its own draft length (--spec-draft-n-max for the draft model, each n-gram
  type its own option); one step's batch holds up to the longest of them per slot
  (common_speculative_n_max), so the batch sizes follow the longest.
"""

from __future__ import annotations

# The types that draft with a model (`-md`, or the target's MTP layers): one per list.
DRAFT_MODEL_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})


def parts(spec_type: str) -> tuple[str, ...]:
    """`ngram-mod,draft-mtp` -> ("ngram-mod", "draft-mtp"); one type -> a tuple of one."""
    return tuple(p.strip() for p in spec_type.split(",") if p.strip())


def is_combined(spec_type: str | None) -> bool:
    return spec_type is not None and len(parts(spec_type)) > 1


def draft_model_part(spec_type: str) -> str | None:
    """The list's draft-model type (the first, when a bad list has several), or None."""
    return next((p for p in parts(spec_type) if p in DRAFT_MODEL_TYPES), None)


def ngram_parts(spec_type: str) -> tuple[str, ...]:
    return tuple(p for p in parts(spec_type) if p.startswith("ngram"))


def combination_problem(spec_type: str) -> str | None:
    """Why llama-server cannot run this list as meant (None when it can)."""
    models = [p for p in parts(spec_type) if p in DRAFT_MODEL_TYPES]
    if len(models) > 1:
        return f"combines {len(models)} draft models ({', '.join(models)}), and llama-server has one draft context"
    return None


def candidate_name(spec_type: str) -> str:
    """A name for the list where names are themselves comma-separated (`tune --configs`): joined by +."""
    return "+".join(parts(spec_type))
