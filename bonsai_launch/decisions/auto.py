"""BONSAI_SPECULATIVE=auto: the stored decision becomes ordinary settings for the launch plan.

gather_plan (server/inputs.py) calls `apply_auto` before planning: it looks the decision up
for this machine, build, model and drafter, and replaces `speculative` (and the type and
draft length) with what was measured to pay, or with plain when nothing did, when no
decision exists, or when the decision's inputs changed. The decision is then an input of the
planner (PlanInputs.tuning), which explains it in the plan, so `start --dry-run --json`, the
start summary and `ps` can show why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bonsai_launch.config.settings import Resolved, Settings
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.decisions.store import Decision, Lookup, lookup

AUTO = "auto"


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.lower() == AUTO


def launch_key(files, binary: Path | None, conditions: str = ""):
    """The key part a launch must match, or (None, why) when it cannot be computed yet.
    `conditions` is identity.server_conditions of the launch's settings and arguments."""
    from bonsai_launch.decisions.identity import TuneKey, build_id, file_sha256, machine_id

    if binary is None:
        return None, "no llama-server is built yet"
    if files.drafter is not None and not files.drafter.is_file():
        return None, f"the drafter {files.drafter.name} is not downloaded"
    drafter = file_sha256(files.drafter) if files.drafter is not None else None
    return TuneKey(machine_id(), build_id(binary), file_sha256(files.model), drafter, "", conditions), None


def tune_hint(profile: str | None, model: Path, conditions: str = "") -> str:
    """The tune command that measures for this launch: its slots and server arguments too,
    since a decision holds only for the settings it was measured with."""
    hint = f"bonsai tune --profile {profile}" if profile else f"bonsai tune --model {model}"
    words = conditions.split()
    if words[:1] == ["--parallel"]:  # server_conditions puts the slots first
        hint, words = f"{hint} --parallel {words[1]}", words[2:]
    return f"{hint} -- {' '.join(words)}" if words else hint


def decision_info(
    found: Lookup | None, why_unavailable: str | None, profile: str | None, model: Path, conditions: str = ""
) -> dict[str, Any]:
    """What the plan, `config` and `ps` show about the decision, in one dict. `conditions`:
    the launch's server settings (identity.server_conditions), for the re-tune hint."""
    hint = tune_hint(profile, model, conditions)
    # `why`: the reason no decision is used, on its own (bench and start's tune-first say it
    # in their own words); `message`: the whole line a launch prints
    if found is None:
        why = f"no decision can be looked up ({why_unavailable})"
        return {
            "setting": AUTO,
            "status": "unavailable",
            "why": why,
            "message": f"BONSAI_SPECULATIVE=auto: {why}; plain for now",
            "hint": hint,
        }
    if found.status == "missing":
        why = f"no tuning decision for {model.name} with this build on this machine"
        return {
            "setting": AUTO,
            "status": "missing",
            "hint": hint,
            "why": why,
            "message": f"BONSAI_SPECULATIVE=auto: {why}; plain (run `{hint}`)",
        }
    d = found.decision
    assert d is not None
    info = {
        "setting": AUTO,
        "status": found.status,
        "id": d.key.id[:8],
        "key_id": d.key.id,  # the running server's watch marks this one for re-tuning (server/watch.py)
        "created": d.created,
        "source": d.source,
        "prompts": d.prompts,
        "choice": d.choice.to_json(),
        "table": list(d.table),
        "report": d.evidence.get("report"),
        # what the figures are for: how many prompts, clients at once, tokens each
        "evidence": {k: d.evidence.get(k) for k in ("prompts", "clients", "max_tokens", "answer_lengths")},
        "conditions": d.evidence.get("conditions"),
        "server_settings": d.key.conditions,  # what a launch must give to use it ("": the defaults)
        "notes": list(d.evidence.get("notes") or ()),  # e.g. the machine was busy while tuning
        "changed": list(found.changed),
        # what the keeper replays the server's own traffic through (server/traffic.py)
        "replay": _replay_part(d.evidence.get("replay")),
        "hint": hint,
    }
    if found.status == "stale":
        info["why"] = f"the decision {d.key.id[:8]} was measured with another {', '.join(found.changed)}: not used"
        info["message"] = f"BONSAI_SPECULATIVE=auto: {info['why']}; plain (run `{hint}`)"
    elif d.choice.speculative:
        info["message"] = f"BONSAI_SPECULATIVE=auto: {d.choice.describe()}, tuned {d.created} (decision {d.key.id[:8]})"
    else:
        info["message"] = (
            f"BONSAI_SPECULATIVE=auto: plain: no speculative configuration was faster beyond noise "
            f"when tuned {d.created} (decision {d.key.id[:8]})"
        )
    return info


def _replay_part(replay: Any) -> dict[str, Any] | None:
    """The cost model and each candidate's replay flags, without the tune's estimates."""
    if not isinstance(replay, dict) or not replay.get("cost"):
        return None
    keep = ("args", "spec_type", "n_max", "label")
    candidates = {n: {k: c.get(k) for k in keep} for n, c in (replay.get("candidates") or {}).items()}
    return {"cost": replay["cost"], "candidates": candidates}


def find(files, binary: Path | None, profile: str | None, conditions: str = "") -> tuple[Lookup | None, dict[str, Any]]:
    key, why = launch_key(files, binary, conditions)
    found = lookup(key, files.model) if key is not None else None
    return found, decision_info(found, why, profile, files.model, conditions)


def apply_auto(selection, files, binary: Path | None, profile: str | None, conditions: str = ""):
    """(selection with concrete speculative settings, tuning info for the plan). `profile` is
    None when the user's own model file is the subject (hints then name the file);
    `conditions` are the launch's speed-relevant server settings (identity.server_conditions)."""
    s = selection.settings
    chosen = (
        ("spec_type", "BONSAI_SPEC_TYPE"),
        ("spec_nmax", "BONSAI_SPEC_NMAX"),
        ("draft_head_rows", "BONSAI_DRAFT_HEAD_ROWS"),
    )
    for key, env in chosen:
        if s.is_explicit(key):
            raise BonsaiError(
                f"{env}={s[key]} cannot be combined with BONSAI_SPECULATIVE=auto, which chooses the "
                "speculative type, draft length and draft head from measurements",
                f"unset {env}, or limit what tuning tries: `bonsai tune --configs plain,<type>`",
            )
    found, info = find(files, binary, profile, conditions)
    decision: Decision | None = found.decision if found is not None and found.status == "found" else None
    values = dict(s.values)
    if decision is not None and decision.choice.speculative:
        choice = decision.choice
        values["speculative"] = Resolved(True, "detected")
        values["spec_type"] = Resolved(choice.spec_type, "detected")
        # a block drafter's n-max is its block size; draft-mtp keeps the measured one
        n_max = None if choice.spec_type in ("draft-dspark", "draft-dflash") else choice.n_max
        values["spec_nmax"] = Resolved(n_max, "detected")
        values["draft_head_rows"] = Resolved(choice.head_rows, "detected")
    else:
        values["speculative"] = Resolved(False, "detected")
    return dataclasses.replace(selection, settings=Settings(values)), info


def needs_tuning(plan) -> bool:
    tuning: dict[str, Any] | None = getattr(plan, "tuning", None)
    return tuning is not None and tuning.get("status") in ("missing", "stale")
