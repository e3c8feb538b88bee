"""A guard in front of a model's own chat template, for reasoning efforts the template refuses.

Bonsai 2's chat template takes `reasoning_effort` low, medium or xhigh and fails on anything
else: a request carrying `"reasoning_effort": "high"` (what Open WebUI, Cline and Kilo send) gets
HTTP 500 from llama-server. llama-server (b11434, tools/server/server-common.cpp) copies a
request's `reasoning_effort` (and its `chat_template_kwargs`) into the template's variables, and
`{% set %}` at the top of a template replaces a variable for the rest of it (common/jinja). So a
template that starts with a guard mapping every other value to the profile's fallback, followed
by the model's template unchanged, answers those requests instead of failing; llama-server loads
it with its own option `--chat-template-file`. No llama.cpp change is involved.

The wrapper is made from the model file (its `tokenizer.chat_template`) by `bonsai pull` and
`bonsai start`, next to the model: `<models>/<profile>/<model stem>.chat-template.jinja`, and
rewritten whenever the model's template or the guard changes.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

from bonsai_launch.config.profiles import Profile
from bonsai_launch.models import store as model_store
from bonsai_launch.models.gguf_format import HeaderReader, Truncated

SUFFIX = ".chat-template.jinja"
TEMPLATE_KEY = "tokenizer.chat_template"


def wrapper_path(profile: Profile, model: Path) -> Path:
    return model_store.folder(profile.name) / (model.name.removesuffix(".gguf") + SUFFIX)


def wrap(template: str, takes: tuple[str, ...], fallback: str, source: str) -> str:
    """The model's template behind a guard: a reasoning_effort outside `takes` becomes `fallback`.

    Pure. The guard emits nothing (whitespace-trimmed tags) and leaves an unset effort unset,
    so the template's own default still applies; llama-server binds reasoning_strength to the
    same value, so it is guarded alike."""
    allowed = json.dumps(list(takes))
    guard = [
        f"{{#- bonsai: the chat template of {source}, unchanged after this guard. A reasoning_effort",
        f'    other than {", ".join(takes)} (Bonsai 2\'s template fails on "high" with HTTP 500) is',
        f"    answered at {fallback}. Written by bonsai from the model file; edits are overwritten. -#}}",
    ]
    for name in ("reasoning_effort", "reasoning_strength"):
        guard.append(
            f"{{%- if {name} is defined and {name} is not none and {name} not in {allowed} -%}}"
            f"{{%- set {name} = {json.dumps(fallback)} -%}}{{%- endif %}}"
        )
    return "\n".join(guard) + template


def read_template(model: Path) -> str | None:
    """The model's `tokenizer.chat_template`, read from the GGUF header (no tensor is touched)."""
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


def ensure_wrapper(profile: Profile, model: Path) -> Path | None:
    """The wrapper for the profile's model, written when missing or stale; None when the profile
    needs none, or the model has no template of its own to wrap."""
    if profile.reasoning_effort_fallback is None or not model.is_file():
        return None
    template = read_template(model)
    if template is None:
        return None
    text = wrap(template, profile.reasoning_efforts, profile.reasoning_effort_fallback, model.name)
    path = wrapper_path(profile, model)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
