"""The prompt suite: bundled JSONL files, user files, and the subsets a run picks.

A prompt line is `{"id": "...", "category": "...", "messages": [{"role": "user", "content": "..."}]}`
(optionally with `"max_tokens": N`, that prompt's answer length)
or, for plain completion models, `{"id": ..., "category": ..., "prompt": "..."}`. Either form
works with both APIs (a third, `{"id", "category", "raw": "..."}`, is a prompt the model's chat
template already made, as BONSAI_TUNE_SAMPLE records them: sent to /v1/completions as it is): messages are flattened into text for /v1/completions, and a bare prompt
becomes one user message for /v1/chat/completions. Conversations (for the multi-turn
trade-off) are `{"id": "...", "turns": ["user message 1", "user message 2", ...]}`.

Categories are free text; the bundled suite has code, math, reasoning, chat and code-edit
(copy or modify a given text, where draft-free n-gram speculation has the most to gain),
six different prompts each: never one prompt repeated, which would inflate llama.cpp's
speculative numbers through its prompt and n-gram caches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError

BUNDLED_CATEGORIES = ("code", "math", "reasoning", "chat", "code-edit")
# The warm-up request: not in any suite, so it seeds no cache the measured prompts could hit.
WARMUP = {
    "id": "warm-up",
    "category": "warm-up",
    "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    raw: bool = False  # one message, a prompt already in the model's template: sent as it is
    # tokens to generate for this prompt (None: the run's --max-tokens); a sample of a server's
    # work records each answer's length, so tuning on it measures answers as long as the user's
    max_tokens: int | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def completion_text(self) -> str:
        """A plain-text rendering for completion-only models: the content of one user
        message as is, else a simple role-prefixed transcript ending with the answer's cue."""
        if len(self.messages) == 1 and self.messages[0][0] == "user":
            return self.messages[0][1] + "\n\n"
        lines = [f"{role.capitalize()}: {content}" for role, content in self.messages]
        return "\n\n".join(lines) + "\n\nAssistant:"


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[str, ...]


def _parse_prompt(data: Any, where: str) -> Prompt:
    if not isinstance(data, dict):
        raise BonsaiError(
            f"{where}: a prompt must be a JSON object", 'write {"id": ..., "category": ..., "prompt": ...}'
        )
    category = data.get("category")
    if not isinstance(category, str) or not category.strip():
        raise BonsaiError(f'{where}: missing "category"', "give every prompt a category such as code, math or chat")
    messages: list[tuple[str, str]] = []
    raw = False
    if "messages" in data:
        chat = data["messages"]  # not `raw`: a chat is sent through the model's chat template
        if not isinstance(chat, list) or not chat:
            raise BonsaiError(
                f'{where}: "messages" must be a non-empty list', 'use [{"role": "user", "content": "..."}]'
            )
        for m in chat:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
                raise BonsaiError(f'{where}: every message needs a string "role" and "content"')
            messages.append((m["role"], m["content"]))
    elif isinstance(data.get("prompt"), str) and data["prompt"].strip():
        messages.append(("user", data["prompt"]))
    elif isinstance(data.get("raw"), str) and data["raw"].strip():
        messages.append(("user", data["raw"]))
        raw = True
    else:
        raise BonsaiError(f'{where}: a prompt needs "prompt" (text), "messages" (a chat) or "raw" (templated text)')
    pid = data.get("id")
    length = data.get("max_tokens")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
        raise BonsaiError(f'{where}: "max_tokens" must be a whole number of 1 or more', 'for example "max_tokens": 256')
    return Prompt(str(pid) if pid else where.rsplit(" ", 1)[-1], category.strip(), tuple(messages), raw, length)


def _read_jsonl(text: str, source: str) -> list[tuple[str, Any]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            rows.append((f"{source} line {number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise BonsaiError(
                f"{source} line {number} is not valid JSON ({exc.msg})", "one JSON object per line"
            ) from None
    return rows


def _bundled_text(name: str) -> str:
    return resources.files("bonsai_launch.bench").joinpath("suites", name).read_text(encoding="utf-8")


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """The bundled suite, or a user's JSONL file. Ids must be unique (results pair by id)."""
    if path is None:
        source, text = "bundled suite", _bundled_text("suite.jsonl")
    else:
        p = Path(path).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise BonsaiError(
                f"cannot read prompts file {p}: {exc.strerror}", "pass a JSONL file with --prompts"
            ) from None
        source = str(p)
    prompts = [_parse_prompt(data, where) for where, data in _read_jsonl(text, source)]
    if not prompts:
        raise BonsaiError(f"{source} has no prompts", "one JSON object per line")
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise BonsaiError(f"{source}: prompt id {prompt.id!r} is used twice", "give every prompt its own id")
        seen.add(prompt.id)
    return prompts


def load_conversations() -> list[Conversation]:
    out = []
    for _where, data in _read_jsonl(_bundled_text("conversations.jsonl"), "bundled conversations"):
        out.append(Conversation(str(data["id"]), tuple(str(t) for t in data["turns"])))
    return out


def categories_of(prompts: list[Prompt]) -> list[str]:
    """Categories in first-seen order."""
    return list(dict.fromkeys(p.category for p in prompts))


def select(prompts: list[Prompt], categories: list[str] | None = None, per_category: int | None = None) -> list[Prompt]:
    """Keep the wanted categories (all when None) and at most `per_category` prompts of each,
    taken in file order so every run of the same settings measures the same prompts."""
    known = categories_of(prompts)
    if categories:
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise BonsaiError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}",
                f"choose from {', '.join(known)}",
            )
    wanted = categories or known
    out: list[Prompt] = []
    for category in wanted:
        chosen = [p for p in prompts if p.category == category]
        out.extend(chosen[:per_category] if per_category else chosen)
    return out


def warmup_prompt() -> Prompt:
    return _parse_prompt(WARMUP, "warm-up")
