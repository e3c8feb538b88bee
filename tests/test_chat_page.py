"""The chat page (llama.cpp's tools/ui, built with npm by `bonsai build`, webui.py) in a real
browser: headless Chromium (Debian's `chromium`) driven by Playwright's Python package.

A `bonsai start --profile demo` server's page loads, takes a typed message and shows the demo's
answer, which is the API's answer to the very request the page sent (replayed; the model's words
depend on the CPU, so no test names them). With speculation on, the server's counters show tokens
drafted for that conversation. With a key on the server, a page not given the key gets no answer
(every API call it makes is refused), the same page given the key in its own dialog does, and
the key is in neither the page nor the server's log.

A named lane (tests/conftest.py NAMED_LANES): `python -m pytest -q -m browser`; .ci/run runs it.
A missing chromium, Playwright or page is a failure, never a skip (tests/support/real_parts.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import real_parts
from bonsai_launch.server import client
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, json_out, stop_all

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

PROMPT = "Copy this line twice: The quick brown fox jumps over the lazy dog."  # the README's; ngram drafts on it
KEY = "sk-page-test-0123456789"
MAX_TOKENS = 48
# The drafted conversation's limit. ngram-mod drafts from text repeated in the prompt or the
# answer; whether the demo's first 48 tokens repeat depends on the CPU's arithmetic (on an AMX
# Xeon the answer left the prompt's line and repeated its own sentence only after 48 tokens,
# and nothing was drafted). At temperature 0 the 270M base model falls into a loop well before
# 192 tokens (there: one sentence repeated from its 20th token on, 111 tokens drafted), and a
# loop is what ngram-mod drafts.
DRAFT_MAX_TOKENS = 192
ANSWER = '[aria-label="Assistant message with actions"]'
STOP = '[aria-label="Stop generation"]'
LOADED_S = 60_000  # bounds that only stop a hang (ms): the page shows in about 2.5 s, an answer in 3
ANSWERED_S = 120_000
SCREENSHOT = os.environ.get("BONSAI_TEST_SCREENSHOT")  # a path: save the conversation there (docs/images)


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        real_parts.missing("no chromium on PATH", "apt-get install -y chromium (Debian's package)")
    return str(found)


@pytest.fixture
def browser() -> Iterator:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        real_parts.missing("Playwright's Python package is not installed", "pip install -e '.[browser]'")
    path = chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox"], headless=True)
        try:
            yield b
        finally:
            b.close()


def start_demo(server: Path, demo_gguf: Path, **env: str) -> dict:
    args = ["start", "--profile", "demo", "--model", str(demo_gguf), "--port", str(free_port()), "--detach", "--json"]
    done = bonsai(args, env=bonsai_env(server, **env), timeout=300)
    assert done.returncode == 0, done.stderr
    data = json_out(done)
    if not data.get("chat_page"):
        real_parts.missing(
            f"{server} serves no chat page at /",
            "build it with node and npm on PATH: `bonsai build` (the manifest's `ui` says why not)",
        )
    return data


def new_page(browser, key: str | None = None, max_tokens: int = MAX_TOKENS, **options):
    """A fresh browser profile with the page's default settings, its browser tools (get_datetime,
    get_info) on as a new user has them: the page sends them with every message, which the demo
    profile's template must take (profiles/demo.yaml). `key`: the API key as the page's own key
    dialog stores it. The page sets no length limit, and the 270M base model at temperature 0 may
    not stop by itself: the page's max_tokens setting bounds each answer."""
    context = browser.new_context(**options)
    config = json.dumps({"max_tokens": max_tokens, **({"apiKey": key} if key else {})})
    context.add_init_script(f"localStorage.setItem('LlamaUi.config', {json.dumps(config)});")
    return context.new_page()


def chat(page, url: str, text: str, requests: list[dict]) -> None:
    """Open the page, type `text`, send it; record the JSON bodies it posts to the chat API."""

    def seen(request) -> None:
        if request.method == "POST" and request.url.endswith("/v1/chat/completions"):
            requests.append(json.loads(request.post_data or "{}"))

    page.on("request", seen)
    page.goto(url)
    box = page.locator("textarea").first
    box.wait_for(state="visible", timeout=LOADED_S)
    box.fill(text)
    with page.expect_response(
        lambda r: r.request.method == "POST" and r.url.endswith("/v1/chat/completions"), timeout=ANSWERED_S
    ) as reply:
        box.press("Enter")
    assert reply.value.status == 200, reply.value.status
    reply.value.finished()  # the whole stream: the answer is complete before the page is read


def answer_of(page) -> str:
    """The assistant's message once generation has stopped."""
    message = page.locator(ANSWER).last
    message.wait_for(state="visible", timeout=ANSWERED_S)
    page.locator(STOP).wait_for(state="detached", timeout=ANSWERED_S)
    return message.inner_text().strip()


def replayed(url: str, body: dict, key: str | None = None) -> str:
    """What the API answers to the page's own request, streamed as the page streams it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    text = []
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=120, trust_env=False
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text).strip()


def words(text: str) -> list[str]:
    """The page renders Markdown (and styles some words' case); compare the words, not the markup."""
    return [w.strip("*_`#>").lower() for w in text.split() if w.strip("*_`#>")]


def test_the_page_takes_a_message_and_shows_the_demos_answer(browser, llama_server, demo_gguf):
    data = start_demo(llama_server, demo_gguf)
    url = data["url"]
    page = new_page(browser, viewport={"width": 1100, "height": 760})
    sent: list[dict] = []
    chat(page, url + "/", "Say hello in one short sentence.", sent)
    shown = answer_of(page)
    assert shown, "the page showed an empty answer"
    assert sent and sent[-1]["messages"][-1]["content"] == "Say hello in one short sentence."
    assert sent[-1].get("tools"), "the page sent no tools: its defaults changed, and this test no longer covers them"
    # The same request through the API, on the same greedy server: the same words.
    api = " ".join(words(replayed(url, sent[-1])))
    assert api and api in " ".join(words(shown)), (shown, api)  # the message also shows the model's badge
    if SCREENSHOT:
        Path(SCREENSHOT).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOT)


def test_a_conversation_on_the_page_is_drafted_with_speculation_on(browser, llama_server, demo_gguf):
    data = start_demo(llama_server, demo_gguf, BONSAI_SPECULATIVE="1")
    url = data["url"]
    assert data["speculative"]["live"], data["speculative"]
    before = client.metrics(url).get("llamacpp:spec_decode_num_draft_tokens_total", 0)
    page = new_page(browser, max_tokens=DRAFT_MAX_TOKENS)
    sent: list[dict] = []
    chat(page, url + "/", PROMPT, sent)
    assert answer_of(page)
    after = client.metrics(url).get("llamacpp:spec_decode_num_draft_tokens_total", 0)
    assert len(sent) == 1 and after > before, (before, after)  # the only request since: the page's


def test_with_a_key_a_page_without_it_gets_no_answer(browser, llama_server, demo_gguf, tmp_path):
    data = start_demo(llama_server, demo_gguf, BONSAI_API_KEY=KEY)
    url = data["url"]
    page = new_page(browser)
    statuses: list[tuple[str, int]] = []
    api = ("/v1/", "/props", "/tools", "/slots", "/metrics")
    page.on("response", lambda r: statuses.append((r.url, r.status)) if any(p in r.url for p in api) else None)
    with page.expect_response(lambda r: "/props" in r.url, timeout=LOADED_S) as first:
        page.goto(url + "/")
    assert first.value.status == 401, first.value.status
    page.get_by_text("Access denied").wait_for(state="visible", timeout=LOADED_S)  # the page's key dialog
    box = page.locator("textarea").first
    if box.is_visible():
        box.fill("Say hello.")
        box.press("Enter")
        page.wait_for_timeout(5_000)
    assert page.locator(ANSWER).count() == 0 or not page.locator(ANSWER).last.inner_text().strip()
    assert statuses and all(code == 401 for _u, code in statuses), statuses  # every API call it made: refused
    # The same page given the key (its settings, as its key dialog stores it) is answered.
    keyed = new_page(browser, KEY)
    sent: list[dict] = []
    chat(keyed, url + "/", "Say hello.", sent)
    assert answer_of(keyed) and sent
    # The key is never in what the server sends a browser, nor in its log.
    assert KEY not in httpx.get(url + "/", trust_env=False).text
    assert KEY not in Path(data["log"]).read_text(errors="replace")
