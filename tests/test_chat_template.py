"""The reasoning-effort guard in front of a model's chat template (models/chat_template.py).

Bonsai 2's template fails on a reasoning_effort it does not take ("high", which Open WebUI, Cline
and Kilo send). The fixture template below fails the same way; the server tests run the real
llama-server with it, once as the model's own template and once behind bonsai's wrapper, and
compare what each renders (`/apply-template`) and answers.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

import tiny_gguf
from bonsai_launch.config.profiles import get_profile
from bonsai_launch.models import chat_template
from bonsai_launch.models import store as model_store

# Like Bonsai 2's: low, medium and xhigh are taken, anything else raises; the prompt shows the
# effort the template saw, so a render says what reached it.
TEMPLATE = (
    "{%- if reasoning_effort is defined and reasoning_effort not in ['low', 'medium', 'xhigh'] -%}"
    "{{ raise_exception('unsupported reasoning_effort: ' ~ reasoning_effort) }}{%- endif -%}"
    "{%- for m in messages -%}<|{{ m.role }}|>{{ m.content }}\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>effort="
    "{{ reasoning_effort if reasoning_effort is defined else 'default' }}\n{%- endif -%}"
)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_wrap_puts_a_silent_guard_before_the_unchanged_template():
    text = chat_template.wrap(TEMPLATE, ("medium", "xhigh"), "medium", "m.gguf")
    assert text.endswith(TEMPLATE) and text.startswith("{#- bonsai: the chat template of m.gguf")
    guard = text.removesuffix(TEMPLATE)
    assert 'reasoning_effort not in ["medium", "xhigh"] -%}{%- set reasoning_effort = "medium" -%}' in guard
    assert "reasoning_strength" in guard  # llama-server binds both names to the request's effort


def test_wrapper_is_written_beside_the_model_and_follows_its_template(tmp_path):
    profile = get_profile("bonsai2-27b")
    folder = model_store.folder(profile.name)
    folder.mkdir(parents=True)
    model = tiny_gguf.write_target(folder / "Ternary-Bonsai-2-27B-PQ2_0.gguf", chat_template=TEMPLATE)
    assert chat_template.read_template(model) == TEMPLATE
    path = chat_template.ensure_wrapper(profile, model)
    assert path == folder / "Ternary-Bonsai-2-27B-PQ2_0.chat-template.jinja" and path.read_text().endswith(TEMPLATE)
    mtime = path.stat().st_mtime_ns
    assert chat_template.ensure_wrapper(profile, model) == path and path.stat().st_mtime_ns == mtime  # unchanged
    tiny_gguf.write_target(model, chat_template=TEMPLATE + "{# v2 #}")  # the model file was replaced
    assert chat_template.ensure_wrapper(profile, model).read_text().endswith("{# v2 #}")
    # nothing to wrap: a profile whose template takes every effort, a model without a template
    assert chat_template.ensure_wrapper(get_profile("ternary-27b"), model) is None
    bare = tiny_gguf.write_target(tmp_path / "bare.gguf")
    assert chat_template.ensure_wrapper(profile, bare) is None


def test_plan_uses_the_wrapper_and_steps_aside_for_the_users_template(tmp_path):
    from bonsai_launch.server.inputs import gather_plan

    profile = get_profile("bonsai2-27b")
    folder = model_store.folder(profile.name)
    folder.mkdir(parents=True)
    model = tiny_gguf.write_target(folder / "Ternary-Bonsai-2-27B-PQ2_0.gguf", chat_template=TEMPLATE)
    plan = gather_plan({"profile": "bonsai2-27b"}, env={})
    assert "--chat-template-file" not in plan.argv
    assert any("wrapper is not written yet" in w and "reasoning_effort high will fail" in w for w in plan.warnings)

    wrapper = chat_template.ensure_wrapper(profile, model)
    plan = gather_plan({"profile": "bonsai2-27b"}, env={})
    assert plan.argv[plan.argv.index("--chat-template-file") + 1] == str(wrapper)
    [reason] = [r for r in plan.reasons if r.flag == "--chat-template-file"]
    assert "answered at medium" in reason.why

    own = tmp_path / "own.jinja"
    own.write_text(TEMPLATE)
    plan = gather_plan({"profile": "bonsai2-27b"}, passthrough=("--chat-template-file", str(own)), env={})
    assert plan.argv.count("--chat-template-file") == 1 and str(own) in plan.argv
    assert any("replaces profile bonsai2-27b's wrapper" in w for w in plan.warnings)


def _post(url: str, path: str, body: dict) -> tuple[int, dict | str]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _renders(server, body_extra: list[dict]) -> list[tuple[int, str]]:
    out = []
    for extra in body_extra:
        code, body = _post(server.url, "/apply-template", {"messages": MESSAGES, **extra})
        out.append((code, body["prompt"] if code == 200 and isinstance(body, dict) else ""))
    return out


@pytest.mark.server
def test_real_server_answers_high_at_medium_behind_the_wrapper(llama_server, tmp_path):
    model = tiny_gguf.write_target(tmp_path / "b2.gguf", chat_template=TEMPLATE)
    profile = get_profile("bonsai2-9b")
    wrapper = tmp_path / "wrapper.jinja"
    wrapper.write_text(
        chat_template.wrap(TEMPLATE, profile.reasoning_efforts, profile.reasoning_effort_fallback or "", model.name)
    )
    efforts = [{}, {"reasoning_effort": "medium"}, {"reasoning_effort": "xhigh"}, {"reasoning_effort": "none"}]
    refused = [
        {"reasoning_effort": "high"},
        {"chat_template_kwargs": {"reasoning_effort": "high"}},
        {"reasoning_effort": "max"},
        {"reasoning_effort": "low"},
    ]
    args = ["-m", str(model), "--jinja", "-c", "256", "-np", "1"]

    with tiny_gguf.serve(llama_server, args, tmp_path / "plain.log") as plain:
        plain_ok = _renders(plain, efforts)
        # the failure the wrapper exists for: the model's own template refuses "high"
        high = _post(
            plain.url, "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "high", "max_tokens": 1}
        )
        assert high[0] >= 400 and "unsupported reasoning_effort" in str(high[1])
        assert _renders(plain, refused[:3]) == [(high[0], "")] * 3

    with tiny_gguf.serve(
        llama_server, [*args, "--chat-template-file", str(wrapper)], tmp_path / "wrapped.log"
    ) as wrapped:
        # what the template takes renders exactly as without the wrapper (no effort: its own default)
        assert _renders(wrapped, efforts) == plain_ok
        assert [p.rsplit("effort=", 1)[1] for _c, p in plain_ok] == ["default", "medium", "xhigh", "default"]
        # what it refuses (and low, which thinks as long as xhigh) is answered at medium
        assert _renders(wrapped, refused) == [(200, plain_ok[1][1])] * 4
        code, answer = _post(
            wrapped.url, "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "high", "max_tokens": 1}
        )
        assert code == 200 and isinstance(answer, dict) and answer["choices"]
