"""`bonsai serve` runs llama-server's router with real models behind one port, as a user runs it.

One router for the module, started detached through the CLI: the demo profile (Gemma 3 270M,
pinned: loaded at start), a tiny DSpark pair (speculative, unloaded after 3 s idle), a tiny target
whose chat template refuses late system messages (as Qwen3.5/3.6's does), and a tiny target whose
file goes bad while the router serves. Clients are the real `openai` and `anthropic` libraries.
No test asserts a real model's words (they depend on the CPU): only that requests are answered,
what is loaded, drafted, refused and ended. The clients keep their libraries' default of retrying a
dropped connection (max_retries=2): llama-server closes an idle keep-alive connection after 5 s,
and a request sent on it in that instant fails to connect, with `bonsai start` as with a router;
a 400 or 401 answer is never retried (the refusals below are seen as they come).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

import real_parts
import tiny_gguf
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, gone, no_server_left

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEY = "serve-test-key"
IDLE_S = 3
# Like Qwen3.5/3.6's template: a system message after the first raises (coding agents send them).
QWEN_LIKE = (
    "{%- for m in messages -%}{%- if m.role == 'system' and not loop.first -%}"
    "{{ raise_exception('System message must be at the beginning.') }}{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
AGENT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "fix the bug"},
    {"role": "assistant", "content": "which file?"},
    {"role": "system", "content": "hook context: the tests failed"},
    {"role": "developer", "content": "answer briefly"},
    {"role": "user", "content": "main.py"},
]


class Router:
    def __init__(self, env: dict[str, str], url: str, started: dict, files: dict[str, Path], home: Path) -> None:
        self.env, self.url, self.started, self.files, self.home = env, url, started, files, home

    def ps(self) -> dict:
        done = bonsai(["ps", "--json"], env=self.env)
        assert done.returncode == 0, done.stderr
        (inst,) = [i for i in json.loads(done.stdout) if i["name"] == "serve"]
        return inst

    def model(self, name: str) -> dict:
        return next(m for m in self.ps()["models"] if m["name"] == name)

    def wait(self, name: str, states: tuple[str, ...], timeout: float = 120) -> dict:
        """Until `ps` shows the model in one of `states`, with the watcher's look at it (a loaded
        model's child pid) caught up."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.model(name)
            if m["state"] in states and (m["state"] != "loaded" or m.get("pid")):
                return m
            assert time.monotonic() < deadline, m
            time.sleep(0.3)

    def post(self, path: str, body: dict, key: str | None = KEY, url: str | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        request = urllib.request.Request((url or self.url) + path, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def router(tmp_path_factory, demo_gguf):
    server, problem = real_parts.find_real_server()
    if problem is not None or server is None:
        real_parts.missing(problem or "no llama-server", "run `bonsai build` (the pinned source and our patches)")
    home = tmp_path_factory.mktemp("serve_home")
    d = tmp_path_factory.mktemp("serve_models")
    (home / "models" / "demo").mkdir(parents=True)
    os.symlink(demo_gguf, home / "models" / "demo" / demo_gguf.name)
    files = {
        "target": tiny_gguf.write_target(d / "target.gguf"),
        "drafter": tiny_gguf.write_dspark_drafter(d / "drafter.gguf", block_size=4),
        "qwen": tiny_gguf.write_target(d / "qwen.gguf", chat_template=QWEN_LIKE),
        "flaky": tiny_gguf.write_target(d / "flaky.gguf"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")}
    env |= {"BONSAI_HOME": str(home), "BONSAI_LLAMA_SERVER": str(server), "BONSAI_API_KEY": KEY}
    port = free_port()
    args = [
        "serve", "demo", f"tiny={files['target']}+{files['drafter']}", f"qwen={files['qwen']}",
        f"flaky={files['flaky']}", "--port", str(port), "--ctx", "2048", "--pin", "demo",
        "--idle-unload", f"0,tiny={IDLE_S}", "--detach", "--json",
    ]  # fmt: skip
    done = bonsai(args, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    r = Router(env, f"http://127.0.0.1:{port}", json.loads(done.stdout), files, home)
    yield r
    stopped = bonsai(["stop", "serve"], env=env)
    assert stopped.returncode == 0, stopped.stderr
    for path in files.values():
        assert no_server_left(path)


def test_a_pinned_model_loads_at_start_the_others_on_their_first_request(router):
    started = {m["name"]: m for m in router.started["models"]}
    assert started["demo"]["state"] == "loaded" and started["tiny"]["state"] == "unloaded"
    assert router.started["plan"]["host"] == "127.0.0.1" and router.started["plan"]["api_key_required"]
    assert router.model("qwen")["state"] == "unloaded"
    code, answer = router.post("/v1/chat/completions", {"model": "qwen", "messages": AGENT[1:2], "max_tokens": 4})
    assert code == 200 and answer["choices"], answer
    assert router.wait("qwen", ("loaded",))["pid"]
    assert router.model("demo")["state"] == "loaded" and router.model("demo")["unload_in_s"] is None  # pinned


def test_a_speculative_model_is_proven_live_when_it_loads(router):
    code, _ = router.post("/completion", {"model": "tiny", "prompt": "a b c", "n_predict": 8})
    assert code == 200
    deadline = time.monotonic() + 60
    while not (router.model("tiny").get("proof") or {}).get("live"):
        assert time.monotonic() < deadline, router.model("tiny")
        time.sleep(0.3)
    tiny = router.model("tiny")
    assert tiny["spec_type"] == "draft-dspark" and tiny["proof"]["drafted"] > 0
    done = bonsai(["logs", "serve", "--model", "tiny", "-n", "0"], env=router.env)
    assert "model tiny: speculative decoding: live (draft-dspark, n-max 4" in done.stdout
    assert "model demo:" not in done.stdout  # one model's lines only


def test_an_idle_model_is_unloaded_and_its_process_ends(router):
    code, _ = router.post("/completion", {"model": "tiny", "prompt": "a b", "n_predict": 4})
    assert code == 200
    pid = router.wait("tiny", ("loaded",))["pid"]
    assert pid and psutil.pid_exists(pid)
    gone_model = router.wait("tiny", ("unloaded",), timeout=IDLE_S + 60)
    # `ps` takes the state from the router, which answers "unloaded" as soon as the watcher's
    # unload request returns; the watcher saves its count just after (CI read 0 in between once)
    deadline = time.monotonic() + 10
    while gone_model["unloads"] < 1 and time.monotonic() < deadline:
        time.sleep(0.3)
        gone_model = router.model("tiny")
    assert gone(pid)  # the child process ended: its memory is back
    assert gone_model["unloads"] >= 1 and gone_model["rss_bytes"] is None
    text = bonsai(["ps"], env=router.env).stdout
    assert "tiny" in text and "unloaded" in text
    assert router.model("demo")["state"] == "loaded"  # pinned: never unloaded


def test_the_openai_client_chats_streams_calls_tools_and_uses_responses(router):
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=2)
    answer = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    assert answer.choices and answer.model == "demo"
    pieces = list(
        client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    )
    assert pieces and pieces[-1].choices[0].finish_reason in ("length", "stop")
    tool = {
        "type": "function",
        "function": {"name": "get_time", "description": "the time", "parameters": {"type": "object", "properties": {}}},
    }
    with_tools = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "What time is it?"}], tools=[tool], max_tokens=8
    )
    assert with_tools.choices[0].finish_reason in ("length", "stop", "tool_calls")
    response = client.responses.create(model="demo", input="Hi", max_output_tokens=8)
    assert response.output and response.status in ("completed", "incomplete")
    assert [m.id for m in client.models.list()] >= ["demo"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=router.url + "/v1", api_key="wrong", max_retries=2).models.list()


def test_the_anthropic_client_sends_messages_streams_and_calls_tools(router):
    import anthropic

    client = anthropic.Anthropic(base_url=router.url, api_key=KEY, max_retries=2)
    message = client.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert message.content and message.stop_reason in ("max_tokens", "end_turn")
    with client.messages.stream(model="demo", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as stream:
        events = [e.type for e in stream]
    assert "message_start" in events and "message_stop" in events
    tool = {"name": "get_time", "description": "the time", "input_schema": {"type": "object", "properties": {}}}
    used = client.messages.create(
        model="demo", max_tokens=8, tools=[tool], messages=[{"role": "user", "content": "What time is it?"}]
    )
    assert used.stop_reason in ("max_tokens", "end_turn", "tool_use")


def test_a_coding_agents_late_system_messages_are_answered_and_the_prompt_start_kept(router):
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=2)
    answer = client.chat.completions.create(model="qwen", messages=AGENT, max_tokens=4)  # type: ignore[arg-type]
    assert answer.choices
    code, full = router.post("/apply-template", {"model": "qwen", "messages": AGENT})
    assert code == 200, full
    without = [*AGENT[:3], AGENT[-1]]  # the same conversation without the late messages
    code, plain = router.post("/apply-template", {"model": "qwen", "messages": without})
    assert code == 200, plain
    # every turn before the late messages renders as it did: the prompt cache still serves them
    kept = plain["prompt"].split("<|im_start|>user\nmain.py")[0]
    assert kept.endswith("which file?<|im_end|>") and full["prompt"].startswith(kept)
    assert "<|im_start|>user\nhook context: the tests failed<|im_end|>" in full["prompt"]
    assert "<|im_start|>user\nanswer briefly<|im_end|>" in full["prompt"]


def test_an_unknown_model_is_refused_with_the_served_names(router):
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=2)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert "model 'gpt-4o' not found; this server serves: demo, flaky, qwen, tiny" in str(err.value)


def test_the_key_guards_loading_and_unloading_models(router):
    assert router.post("/models/load", {"model": "qwen"}, key=None)[0] == 401
    assert router.post("/models/unload", {"model": "demo"}, key=None)[0] == 401
    assert router.post("/models/unload", {"model": "demo"}, key="wrong")[0] == 401
    assert router.model("demo")["state"] == "loaded"


def test_no_way_around_the_key_through_a_childs_own_port(router):
    demo = router.wait("demo", ("loaded",))
    child = f"http://127.0.0.1:{demo['port']}"
    assert router.post("/completion", {"prompt": "Hi", "n_predict": 2}, key=None, url=child)[0] == 401
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(child + "/v1/models", timeout=30)
    assert err.value.code == 401
    assert router.post("/completion", {"prompt": "Hi", "n_predict": 2}, url=child)[0] == 200  # with the key: fine


def test_a_broken_model_file_fails_that_model_alone(router):
    tiny_gguf.truncate(router.files["flaky"], router.files["flaky"].stat().st_size // 2)
    code, _ = router.post("/v1/chat/completions", {"model": "flaky", "messages": AGENT[1:2], "max_tokens": 4})
    assert code >= 400
    failed = router.wait("flaky", ("failed",), timeout=60)
    assert failed["exit_code"] not in (None, 0)
    assert "failed (exit" in bonsai(["ps"], env=router.env).stdout
    code, answer = router.post("/v1/chat/completions", {"model": "demo", "messages": AGENT[1:2], "max_tokens": 4})
    assert code == 200 and answer["choices"]  # the others keep serving
