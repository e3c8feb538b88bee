"""Issue 18 against the real llama-server, with the standard `openai` client: a key the user
sets is enforced on loopback too, every bonsai client sends it, and clients see the profile's
name as the model, never a file path."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

import bench_options
import tiny_gguf
from bonsai_launch.bench.pipeline import Target, run_bench
from bonsai_launch.server import client
from bonsai_launch.server.process import free_port
from start_helpers import ROOT, bonsai, bonsai_env, json_out, stop_all

pytestmark = pytest.mark.server

KEY = "sk-local-test"


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write_target(tmp_path_factory.mktemp("tiny") / "target.gguf")


def test_key_is_enforced_on_loopback_and_every_client_sends_it(llama_server, demo_gguf):
    env = bonsai_env(llama_server, BONSAI_API_KEY=KEY)
    done = bonsai(["start", "--profile", "demo", "--model", demo_gguf, "--port", free_port(), "--detach"], env=env)
    assert done.returncode == 0, done.stderr
    assert "model name       demo" in done.stdout
    assert "Authorization: Bearer $BONSAI_API_KEY" in done.stdout and '"model":"demo"' in done.stdout
    assert KEY not in done.stdout + done.stderr
    (inst,) = json_out(bonsai(["ps", "--json"], env=env))
    url = inst["base_url"]
    assert inst["host"] == "127.0.0.1" and inst["api_key_required"]

    # Without the key, or with a wrong one: 401, on loopback.
    assert httpx.get(url + "/v1/models", trust_env=False).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0).models.list()

    # With it: the profile's name, an answer, and a stream.
    ai = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in ai.models.list()] == ["demo"]
    answer = ai.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    assert answer.model == "demo" and answer.choices[0].message.content
    pieces = [
        c.choices[0].delta.content
        for c in ai.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        if c.choices and c.choices[0].delta.content
    ]
    assert pieces

    # bonsai's own clients send the key from BONSAI_API_KEY (and fail clearly without it).
    verify = bonsai(["verify", "--url", url, "--json"], env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    no_key = bonsai(["verify", "--url", url], env=bonsai_env(llama_server))
    # the refusal as the clients word it: a bare "401" is also in some ports (40123 once failed this)
    refused = "401 unauthorized"
    assert no_key.returncode == 1 and refused in no_key.stdout
    run = bonsai(["run", "--url", url, "-n", "4", "Hello"], env=env)
    assert run.returncode == 0, run.stderr
    chat = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "chat", "--url", url, "-n", "4"],
        input="Hello\n/exit\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert chat.returncode == 0 and refused not in chat.stderr and "tokens" in chat.stderr, chat.stderr


def test_no_key_needed_when_none_is_set(llama_server, tiny):
    data = json_out(
        bonsai(["start", "--model", tiny, "--port", free_port(), "--detach", "--json"], server=llama_server)
    )
    assert data["plan"]["api_key_required"] is False and data["plan"]["env"] == {}
    ai = openai.OpenAI(base_url=data["openai_base_url"], api_key="anything", max_retries=0)
    assert [m.id for m in ai.models.list()] == ["target"]  # the file's stem, not its path
    assert httpx.get(data["url"] + "/v1/models", trust_env=False).status_code == 200


def test_bench_sends_the_key_to_the_servers_it_launches(llama_server, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("BONSAI_API_KEY", KEY)
    options = bench_options.one_pass(("plain",), categories=("code",), per_category=1, max_tokens=4)
    doc, _ = run_bench(
        options, Target(model=str(tiny), binary=llama_server, passthrough=("-t", "1")), tmp_path / "out", chart=False
    )
    requests = [r for r in doc["requests"] if r["phase"] == "suite"]
    assert requests and not any(r["error"] for r in requests)
    assert client.first_key("k1,k2") == "k1"
