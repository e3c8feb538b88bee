"""A guard in front of a model's own chat template, for reasoning efforts the template refuses.

Bonsai 2's chat template takes `reasoning_effort` low, medium or xhigh and fails on anything
else: a request carrying `"reasoning_effort": "high"` (what Open WebUI, Cline and Kilo send) gets
HTTP 500 from llama-server. llama-server (b11434, tools/server/server-common.cpp) copies a
request's `reasoning_effort` (and its `chat_template_kwargs`) into the template's variables, and
`{% set %}` at the top of a template replaces a variable for the rest of it (common/jinja). So a
template that starts with a guard mapping every other value to the profile's fallback, followed
by the model's template unchanged, answers those requests instead of failing; llama-server loads
it with its own option `--chat-template-file`. No llama.cpp change is involved.

Qwen3.5/3.6's template (every Bonsai 27B and Bonsai 2) raises "System message must be at the
beginning." on a system message after the first, and llama-server turns a `developer` message into
a system one (common/chat.cpp), so coding agents that add context mid-conversation (OpenCode,
Claude Code's hooks, Kilo Code, Copilot-style clients) get HTTP 400/500. The guard rewrites
`messages` before the template reads them: such a message becomes a user message in its own
place, so everything before it, the prompt's start the prompt cache serves, renders unchanged.

The wrapper is made from the model file (its `tokenizer.chat_template`) by `bonsai pull` and
`bonsai start`, next to the model: `<models>/<profile>/<model stem>.chat-template.jinja` (a model
of the user's own: `<home>/templates/<stem>-<hash>.chat-template.jinja`), and rewritten whenever
the model's template or the guard changes.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
from pathlib import Path

from bonsai_launch.config.profiles import Profile
from bonsai_launch.models import store as model_store
from bonsai_launch.models.gguf_format import HeaderReader, Truncated

SUFFIX = ".chat-template.jinja"
TEMPLATE_KEY = "tokenizer.chat_template"


def wrapper_path(profile: Profile, model: Path) -> Path:
    return model_store.folder(profile.name) / (model.name.removesuffix(".gguf") + SUFFIX)


# How Qwen3.5/3.6's template (and others like it) refuses a system message after the first.
_LATE_SYSTEM = re.compile(r"raise_exception\([^)]*[Ss]ystem message[^)]*(beginning|first)")
REASONING, LATE_SYSTEM = "reasoning_effort", "late_system"  # what a wrapper guards (guards())


def forbids_late_system(template: str) -> bool:
    return bool(_LATE_SYSTEM.search(template))


def guards(template: str | None, profile: Profile | None) -> tuple[str, ...]:
    """What a wrapper must guard for this template: the profile's reasoning efforts (when the profile
    names a fallback), late system messages (when the template refuses them)."""
    out = []
    if profile is not None and profile.reasoning_effort_fallback:
        out.append(REASONING)
    if template and forbids_late_system(template):
        out.append(LATE_SYSTEM)
    return tuple(out)


def wrap(template: str, takes: tuple[str, ...], fallback: str, source: str, *, late_system: bool = False) -> str:
    """The model's template behind a guard: a reasoning_effort outside `takes` becomes `fallback`
    (none guarded when `fallback` is empty), and with `late_system` a system or developer message
    after the first becomes a user message in its place.

    Pure. The guard emits nothing (whitespace-trimmed tags) and leaves an unset effort unset,
    so the template's own default still applies; llama-server binds reasoning_strength to the
    same value, so it is guarded alike."""
    guard = [f"{{#- bonsai: the chat template of {source}, unchanged after this guard."]
    if fallback:
        guard += [
            f'    A reasoning_effort other than {", ".join(takes)} (Bonsai 2\'s template fails on "high" with',
            f"    HTTP 500) is answered at {fallback}.",
        ]
    if late_system:
        guard.append("    A system or developer message after the first turn is passed as a user message, in place.")
    guard[-1] += " Written by bonsai from the model file; edits are overwritten. -#}"
    if fallback:
        allowed = json.dumps(list(takes))
        for name in ("reasoning_effort", "reasoning_strength"):
            guard.append(
                f"{{%- if {name} is defined and {name} is not none and {name} not in {allowed} -%}}"
                f"{{%- set {name} = {json.dumps(fallback)} -%}}{{%- endif %}}"
            )
    if late_system:
        guard.append(
            "{%- if messages is defined and messages -%}{%- set bonsai_ns = namespace(messages=[]) -%}"
            '{%- for m in messages -%}{%- if m.role == "developer" or (m.role == "system" and not loop.first) -%}'
            '{%- set bonsai_ns.messages = bonsai_ns.messages + [{"role": "system" if loop.first else "user", '
            '"content": m.content}] -%}{%- else -%}{%- set bonsai_ns.messages = bonsai_ns.messages + [m] -%}'
            "{%- endif -%}{%- endfor -%}{%- set messages = bonsai_ns.messages -%}{%- endif %}"
        )
    return "\n".join(guard) + template


def read_template(model: Path) -> str | None:
    """The model's `tokenizer.chat_template`, read from the GGUF header (no tensor is touched)."""
    try:
        return _read_template(model)
    except (OSError, ValueError):  # empty or unreadable: the planner's own checks say what is wrong
        return None


def _read_template(model: Path) -> str | None:
    with model.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = HeaderReader(buf)
        try:
            if r.take(4) != b"GGUF":
                return None
            r.scalar("<I")  # version
            r.scalar("<Q")  # tensor count
            for _ in range(r.scalar("<Q")):
                key = r.string()
                vtype = r.scalar("<I")
                value = r.value(vtype, keep_arrays=False)
                if key == TEMPLATE_KEY:
                    return value if isinstance(value, str) else None
        except Truncated:
            return None
    return None


def own_wrapper_path(model: Path, template: str) -> Path:
    """Where the wrapper of a model of the user's own lives (one per template it has had)."""
    from bonsai_launch.core.paths import bonsai_home

    digest = hashlib.sha256(template.encode()).hexdigest()[:12]
    return bonsai_home() / "templates" / f"{model.name.removesuffix('.gguf')}-{digest}{SUFFIX}"


def wrapper_text(template: str, profile: Profile | None, source: str) -> str | None:
    """The wrapper's text for a template, or None when nothing about it needs a guard."""
    wanted = guards(template, profile)
    if not wanted:
        return None
    takes = profile.reasoning_efforts if profile is not None and REASONING in wanted else ()
    fallback = (profile.reasoning_effort_fallback or "") if profile is not None and REASONING in wanted else ""
    return wrap(template, takes, fallback, source, late_system=LATE_SYSTEM in wanted)


def ensure_wrapper(profile: Profile | None, model: Path) -> Path | None:
    """The wrapper for the profile's model (profile None: a model of the user's own), written when
    missing or stale; None when nothing needs guarding, or the model has no template of its own."""
    if not model.is_file():
        return None
    template = read_template(model)
    if template is None:
        return None
    text = wrapper_text(template, profile, model.name)
    if text is None:
        return None
    path = wrapper_path(profile, model) if profile is not None else own_wrapper_path(model, template)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
