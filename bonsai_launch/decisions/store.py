"""Tuning decisions on disk: one JSON file per key under BONSAI_HOME/tune/decisions/.

`bonsai tune` and `bonsai bench --save` write them; `BONSAI_SPECULATIVE=auto` reads them. A
decision applies only while every input it was measured with is unchanged: the machine, the
llama-server build, the model file and the drafter file (compared by sha256), and the server
settings that change speed (slots, threads, batch sizes, other arguments after `--`). Several prompt
sets may each have a decision for the same inputs; a launch uses the newest. A decision for
the same model file whose other inputs changed is reported as stale (with what changed) and
never used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.decisions.identity import TuneKey, tune_dir

SCHEMA = "bonsai-tune/1"
KEY_LABELS = {
    "machine": "machine",
    "build": "llama-server build",
    "model_sha256": "model file",
    "drafter_sha256": "drafter file",
}


@dataclass(frozen=True)
class Choice:
    """The configuration a decision runs: plain (spec_type None) or one speculative setting."""

    config: str  # the measured configuration's name: plain, draft-dspark, ngram-mod, ngram-mod/n16, ...
    label: str
    spec_type: str | None = None
    n_max: int | None = None
    ratio: float | None = None  # median paired decode ratio against plain
    ratio_min: float | None = None
    ratio_max: float | None = None
    band: float | None = None  # the noise band the gain had to clear
    reason: str = ""
    head_rows: int | None = None  # the draft model's head rows (None: llama's default; 0: the whole head)

    @property
    def speculative(self) -> bool:
        return self.spec_type is not None

    def describe(self) -> str:
        if not self.speculative:
            return "plain (no speculation)"
        text = self.spec_type or ""
        if self.n_max is not None:
            text += f", n-max {self.n_max}"
        if self.head_rows is not None:
            text += ", whole draft head" if self.head_rows == 0 else f", draft head {self.head_rows} rows"
        if self.ratio is not None:
            text += f": {self.ratio:.2f}x plain"
            if self.ratio_min is not None and self.ratio_max is not None:
                text += f" ({self.ratio_min:.2f}-{self.ratio_max:.2f})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "label": self.label,
            "speculative": self.speculative,
            "spec_type": self.spec_type,
            "n_max": self.n_max,
            "ratio": self.ratio,
            "ratio_min": self.ratio_min,
            "ratio_max": self.ratio_max,
            "band": self.band,
            "reason": self.reason,
            "head_rows": self.head_rows,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Choice:
        return cls(
            data["config"],
            data.get("label") or data["config"],
            data.get("spec_type"),
            data.get("n_max"),
            data.get("ratio"),
            data.get("ratio_min"),
            data.get("ratio_max"),
            data.get("band"),
            data.get("reason", ""),
            data.get("head_rows"),
        )


@dataclass(frozen=True)
class Decision:
    key: TuneKey
    choice: Choice
    table: tuple[dict[str, Any], ...]  # one row per configuration considered (decide.table_rows)
    created: str  # ISO time, UTC
    source: str  # "tune" or "bench"
    model: str  # path of the model file when measured
    profile: str | None = None
    drafter: str | None = None
    prompts: str = "bundled tuning prompts"  # which prompt set, in words
    evidence: dict[str, Any] = field(default_factory=dict)  # report path, options, duration, noise rule

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "id": self.key.id,
            "key": self.key.to_json(),
            "choice": self.choice.to_json(),
            "table": list(self.table),
            "created": self.created,
            "source": self.source,
            "model": self.model,
            "profile": self.profile,
            "drafter": self.drafter,
            "prompts": self.prompts,
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        return cls(
            TuneKey.from_json(data["key"]),
            Choice.from_json(data["choice"]),
            tuple(data.get("table") or ()),
            data["created"],
            data.get("source", "tune"),
            data["model"],
            data.get("profile"),
            data.get("drafter"),
            data.get("prompts", ""),
            dict(data.get("evidence") or {}),
        )

    def summary(self) -> str:
        return f"{self.choice.describe()} (decision {self.key.id[:8]}, {self.source} {self.created}, {self.prompts})"


def decisions_dir() -> Path:
    return tune_dir() / "decisions"


def save(decision: Decision) -> Path:
    """Write (or replace) the decision for its key; written to a temporary name, then renamed."""
    folder = decisions_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{decision.key.id}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(decision.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    clear_retune(decision.key.id)  # measured again: what the running server saw is answered
    return path


def retune_path(decision_id: str) -> Path:
    return tune_dir() / "retune" / f"{decision_id}.json"


def mark_retune(decision_id: str, why: dict[str, Any]) -> Path:
    """The running server's watch (server/watch.py) found speculation below plain for a
    sustained window: the decision is stale until it is measured again."""
    path = retune_path(decision_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(why, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def retune_reason(decision_id: str) -> str | None:
    try:
        data = json.loads(retune_path(decision_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(data.get("why") or "the running server measured speculation below plain")


def clear_retune(decision_id: str) -> None:
    try:
        retune_path(decision_id).unlink()
    except OSError:
        pass


def load(decision_id: str) -> Decision | None:
    """The decision stored under this id, if it is there and readable."""
    try:
        data = json.loads((decisions_dir() / f"{decision_id}.json").read_text(encoding="utf-8"))
        return Decision.from_json(data) if data.get("schema") == SCHEMA else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_all() -> list[Decision]:
    """Every readable decision, newest first. Unreadable files are skipped, not trusted."""
    folder = decisions_dir()
    found = []
    if folder.is_dir():
        for path in folder.glob("*.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if data.get("schema") == SCHEMA:
                    found.append(Decision.from_json(data))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return sorted(found, key=lambda d: d.created, reverse=True)


@dataclass(frozen=True)
class Lookup:
    """What the store says for the inputs of a launch."""

    status: str  # "found" | "missing" | "stale"
    decision: Decision | None = None  # found: the one to use; stale: the newest outdated one
    changed: tuple[str, ...] = ()  # stale: which inputs differ, in words

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "changed": list(self.changed),
            "decision": self.decision.to_json() if self.decision else None,
        }


def changed_inputs(old: TuneKey, new: TuneKey) -> tuple[str, ...]:
    """Which inputs differ, in words; server settings with both values, since the user chose them."""
    changed = [label for name, label in KEY_LABELS.items() if getattr(old, name) != getattr(new, name)]
    if old.conditions != new.conditions:
        changed.append(
            f"set of server settings (tuned with {old.conditions or 'the defaults'}, "
            f"this launch {new.conditions or 'the defaults'})"
        )
    return tuple(changed)


def lookup(key: TuneKey, model_path: str | Path | None = None) -> Lookup:
    """The newest decision whose machine, build, model, drafter and server settings all equal
    `key`'s (any prompt set). Otherwise the newest decision for the same model (by path or sha256) is stale."""
    decisions = load_all()
    for d in decisions:
        if d.key.launch_part() == key.launch_part():
            why = retune_reason(d.key.id)
            if why is not None:
                return Lookup("stale", d, (f"workload (the running server measured: {why})",))
            return Lookup("found", d)
    model = str(Path(model_path).resolve()) if model_path is not None else None
    for d in decisions:
        same_model = d.key.model_sha256 == key.model_sha256 or (model is not None and d.model == model)
        if same_model:
            return Lookup("stale", d, changed_inputs(d.key, key))
    return Lookup("missing")
