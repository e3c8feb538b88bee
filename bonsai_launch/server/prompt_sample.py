"""A bounded, local sample of the prompts a server was sent, for `bonsai tune --prompts recent`.

Off unless BONSAI_TUNE_SAMPLE is above 0. No proxy sits in the request path: llama-server
itself shows each slot's last prompt in /slots when it runs with LLAMA_SERVER_SLOTS_DEBUG=1
(the plan then sets it), as the text the model saw, its chat template applied. The process
that restarts the server (the keeper of `start --detach`, a foreground `start`) reads /slots
every BONSAI_WATCH_SECONDS while the server is awake (/props first: /slots would wake a
sleeping one) and appends the prompts it has not seen to a file per model under
BONSAI_HOME/tune/samples. A slot that served several requests between two reads shows only
the last: a sample, not a log.

The file is JSONL in the prompt suite's form (`{"id", "category": "recent", "raw": text,
"max_tokens": N, "generated": text}`: bench/prompts.py sends a raw prompt to /v1/completions as
it is, for as many tokens as the server generated for it; the answer itself is kept for the
keeper's replay, server/traffic.py). It keeps the newest `limit`
lines, each prompt at most MAX_PROMPT_CHARS (a longer one is left out whole: a cut templated
prompt is not a prompt), and is written whole to a temporary file and renamed, readable by its
owner alone. `entries_from_slots` and `merged` are pure; `PromptSampler` is the edge.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MAX_PROMPT_CHARS = 65_536
MIN_FOR_AUTO = 4  # fewer recent prompts than this: a start that tunes uses the bundled ones
SLOTS_DEBUG_ENV = "LLAMA_SERVER_SLOTS_DEBUG"
CATEGORY = "recent"


def samples_dir() -> Path:
    from bonsai_launch.decisions.identity import tune_dir

    return tune_dir() / "samples"


def sample_path(model: str | Path) -> Path:
    """One file per model file: a templated prompt fits the model whose template made it."""
    resolved = Path(model).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return samples_dir() / f"{resolved.stem}-{digest}.jsonl"


def tuning_prompts(model: str | Path) -> str | None:
    """ "recent" (tune's --prompts value) when the model's sample holds MIN_FOR_AUTO prompts or more."""
    return "recent" if len(read(sample_path(model))) >= MIN_FOR_AUTO else None


def entries_from_slots(slots: Any, seen: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """The prompts of /slots' answer that `seen` does not hold yet (keyed by slot and task id);
    `seen` is updated. Slots without a prompt (never used, or a server without the debug view)
    give nothing."""
    out: list[dict[str, Any]] = []
    for slot in slots if isinstance(slots, list) else ():
        if not isinstance(slot, dict):
            continue
        prompt, task = slot.get("prompt"), slot.get("id_task")
        if not isinstance(prompt, str) or not prompt.strip() or not isinstance(task, int):
            continue
        key = (int(slot.get("id", -1)), task)
        if key in seen or slot.get("is_processing") or slot.get("generated") == "":
            # a running one is read at the next look, once it is done; so is one the server has
            # just given a slot (its prompt is there, nothing generated yet, not yet processing)
            continue
        seen.add(key)
        if len(prompt) > MAX_PROMPT_CHARS:
            continue
        entry: dict[str, Any] = {
            "id": f"recent-{int(time.time())}-{key[0]}-{task}",
            "category": CATEGORY,
            "raw": prompt,
        }
        # what the server answered (its length in tokens is added by PromptSampler, which can ask
        # the server): tuning on the sample measures answers as long as these, and the keeper
        # replays them through the n-gram candidates (server/traffic.py)
        generated = slot.get("generated")
        if isinstance(generated, str) and generated and len(generated) <= MAX_PROMPT_CHARS:
            entry["generated"] = generated
        n_predict = (slot.get("params") or {}).get("n_predict")
        if isinstance(n_predict, int) and not isinstance(n_predict, bool) and n_predict > 0:
            entry["n_predict"] = n_predict  # the request's limit: the server drafts at most up to it
        out.append(entry)
    return out


def merged(existing: list[dict[str, Any]], new: Iterable[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The newest `limit` entries; a prompt already in the sample moves to the end, not twice."""
    rows = {e["raw"]: e for e in existing if isinstance(e, dict) and isinstance(e.get("raw"), str)}
    for entry in new:
        rows.pop(entry["raw"], None)
        rows[entry["raw"]] = entry
    kept = list(rows.values())
    return kept[-limit:] if limit > 0 else []


def read(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line from another bonsai version: dropped at the next write
    return out


def write(path: Path, entries: list[dict[str, Any]]) -> None:
    """Whole file to a temporary one (mode 0600), then renamed: never half-written, never world-readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(os, "chmod"):
        os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for entry in entries:
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class PromptSampler:
    """A daemon thread that adds the server's new prompts to the sample file."""

    def __init__(
        self, base_url: str, api_key: str | None, path: Path, limit: int, every_s: float, judge: Any = None
    ) -> None:
        self.base_url, self.api_key, self.path = base_url, api_key, path
        self.limit, self.every_s = limit, every_s
        self.judge = judge  # server/traffic.py: re-decides auto from the new requests (None: off)
        self.seen: set[tuple[int, int]] = set()
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bonsai-prompt-sample", daemon=True)

    def start(self) -> PromptSampler:
        if self.every_s > 0 and self.limit > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def step(self) -> int:
        """One read of /slots; how many prompts were added (0 while the server sleeps)."""
        from bonsai_launch.server import client

        if client.sleeping(self.base_url, self.api_key) is not False:
            return 0  # asleep, or unknown: /slots would wake it
        new = entries_from_slots(client.slots(self.base_url, self.api_key), self.seen)
        answers: dict[int, list[int]] = {}  # entry index -> its answer's tokens, for the judge too
        for i, entry in enumerate(
            new
        ):  # /slots counts nothing once a request is done: the answer's tokens say how long
            if entry.get("generated"):
                answers[i] = client.tokenize(self.base_url, entry["generated"], self.api_key)
                entry["max_tokens"] = len(answers[i])
        if new:
            write(self.path, merged(read(self.path), new, self.limit))
            if self.judge is not None:  # the server is awake now: its tokenizer answers at once
                self.judge.add(new, answers)
                self.judge.step()
        return len(new)

    def _run(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                self.step()
            except Exception:  # a failed read must never end the process that restarts the server
                continue


def for_job(job, judge: Any = None) -> PromptSampler | None:
    """Start sampling a restart job's server (None: BONSAI_TUNE_SAMPLE is off); `judge`
    (server/traffic.py) re-decides auto from each new batch of requests."""
    sample = job.sample or {}
    if not sample.get("limit") or not sample.get("every_s"):
        return None
    return PromptSampler(
        job.instance["base_url"],
        job.api_key,
        Path(sample["path"]),
        int(sample["limit"]),
        float(sample["every_s"]),
        judge,
    ).start()
