"""The demo profile's chat template: llama.cpp's built-in gemma template written out in Jinja.

Why (profiles/demo.yaml): without --jinja llama-server refuses any request carrying `tools`, and
the chat page sends its browser tools with every message, so the page's first message to the demo
failed with "tools param requires --jinja flag". The Jinja twin must render exactly what the
built-in renders (`/apply-template`), and answer a request with tools as one without them. The
tiny model's random weights are enough: rendering is text, and greedy answers are compared.
"""

from __future__ import annotations

import httpx
import pytest

import tiny_gguf
from bonsai_launch.config.profiles import get_profile

pytestmark = pytest.mark.server

BUILT_IN = ("--no-jinja", "--chat-template", "gemma")
TOOLS = [  # what the page sends with every message (its browser tools)
    {
        "type": "function",
        "function": {
            "name": "get_datetime",
            "description": "the current date and time",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": " Hi there \n"}],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b "},
        {"role": "user", "content": "c"},
    ],
    [  # a system message after the first turn goes before the next user message, as built in
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "late"},
        {"role": "user", "content": "c"},
    ],
    [{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}],
]


def demo_template_args() -> list[str]:
    """The demo profile's template arguments, as bonsai passes them (without its sampling)."""
    args = list(get_profile("demo").server_args)
    start = args.index("--jinja")
    return args[start : args.index("--skip-chat-parsing") + 1]


def answer(url: str, messages: list[dict], **extra) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60, trust_env=False)


def test_the_jinja_twin_renders_and_answers_as_the_built_in(llama_server, tiny_pair, tmp_path):
    args = ["-m", str(tiny_pair["target"]), "-c", "1024"]
    with (
        tiny_gguf.serve(llama_server, [*args, *demo_template_args()], tmp_path / "jinja.log") as twin,
        tiny_gguf.serve(llama_server, [*args, *BUILT_IN], tmp_path / "built-in.log") as built_in,
    ):
        for messages in CONVERSATIONS:
            rendered = [
                httpx.post(s.url + "/apply-template", json={"messages": messages}, trust_env=False).json()["prompt"]
                for s in (twin, built_in)
            ]
            assert rendered[0] == rendered[1], messages
        plain = answer(built_in.url, CONVERSATIONS[1]).json()
        with_tools = answer(twin.url, CONVERSATIONS[1], tools=TOOLS)
        assert with_tools.status_code == 200, with_tools.text
        reply = with_tools.json()
        assert reply["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        assert reply["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]  # BOS once, as built in
        # what the page met before: the built-in template refuses the tools
        refused = answer(built_in.url, CONVERSATIONS[1], tools=TOOLS)
        assert refused.status_code >= 400 and "--jinja" in refused.text
