"""`bonsai run` / `bonsai chat` with speculation asked for never answer from a server that
does not speculate, and the README's first command answers sensibly on the demo model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_gguf
from bonsai_launch.server import instances
from bonsai_launch.server.process import free_port
from start_helpers import ROOT, bonsai, bonsai_env, gone, json_out, no_server_left, stop_all

README_PROMPT = "Copy this line twice: The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_gguf.write_target(tmp_path_factory.mktemp("tiny") / "target.gguf")


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def test_chat_to_a_dead_url_fails_before_the_prompt():
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "chat", "--url", f"http://127.0.0.1:{port}"],
        input="hello\n",
        env=bonsai_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1
    assert f"cannot reach http://127.0.0.1:{port}/health" in done.stderr
    assert "chatting with" not in done.stderr and "> " not in done.stdout


@pytest.mark.server
@pytest.mark.slow
def test_run_and_chat_refuse_a_plain_url_when_speculation_is_asked_for(llama_server, target):
    plain = json_out(
        bonsai(
            ["start", "--model", target, "--port", free_port(), "--ctx", "2048", "--detach", "--json"],
            server=llama_server,
        )
    )
    env = bonsai_env(llama_server, BONSAI_SPECULATIVE="1")
    refused = bonsai(["run", "--url", plain["url"], "-n", "4", "hello"], env=env)
    assert refused.returncode == 1, refused.stderr
    assert f"the server at {plain['url']} does not speculate: the server has no draft context" in refused.stderr
    assert "bonsai start --speculative" in refused.stderr and refused.stdout == ""
    chat = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "chat", "--url", plain["url"]],
        input="hello\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert chat.returncode == 1 and "does not speculate" in chat.stderr
    # without speculation asked for, the same server answers
    assert bonsai(["run", "--url", plain["url"], "-n", "4", "hello"], server=llama_server).returncode == 0


@pytest.fixture
def demo_home(demo_gguf, isolated_home) -> Path:
    """The demo model in this test's BONSAI_HOME; its path names only this test's servers."""
    folder = isolated_home / "models" / "demo"
    folder.mkdir(parents=True)
    os.symlink(demo_gguf, folder / demo_gguf.name)
    return folder


def assert_live_answer(done: subprocess.CompletedProcess) -> None:
    """What the README promises on every CPU: a non-empty answer with no error, and tokens both
    drafted and accepted (the copying prompt gives n-gram speculation something to draft)."""
    assert done.stdout.strip(), done.stderr
    assert "error" not in done.stderr.lower(), done.stderr
    stats = re.search(r"; speculative: drafted (\d+), accepted (\d+)", done.stderr)
    assert stats, done.stderr
    assert int(stats[1]) > 0 and int(stats[2]) > 0, stats[0]


@pytest.mark.server
@pytest.mark.slow
def test_readme_first_command_answers_sensibly_with_live_speculation(llama_server, demo_home):
    env = bonsai_env(llama_server, BONSAI_SPECULATIVE="1")
    # A plain demo server is running: it must be passed over, not silently used.
    plain_env = bonsai_env(llama_server)
    started = bonsai(
        ["start", "--profile", "demo", "--port", str(free_port()), "--ctx", "4096", "--detach"],
        env=plain_env,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr
    (plain,) = instances.running()
    assert not plain.speculative
    plain_log_size = Path(plain.log_path).stat().st_size

    done = bonsai(["run", "--profile", "demo", "-n", "128", README_PROMPT], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (
        f"the running server {plain.name} ({plain.base_url}) does not speculate: starting a temporary "
        "speculative server" in done.stderr
    )
    assert "temporary llama-server: checking speculative decoding" in done.stderr
    assert "speculative decoding: live (ngram-mod, n-max 64 (llama.cpp default)" in done.stderr
    assert_live_answer(done)
    assert "stop processing" not in Path(plain.log_path).read_text()[plain_log_size:]  # the plain server was not asked
    assert [i.name for i in instances.running()] == [plain.name]  # the temporary server is gone

    # Lossless: the demo samples greedily, so the speculative answer is the plain one, token for
    # token, on this machine and binary. The words themselves depend on the CPU's floating-point
    # path (which kernels the native build chose), so no fixed text is asserted.
    plain_answer = bonsai(["run", "--profile", "demo", "-n", "128", README_PROMPT], env=plain_env, timeout=300)
    assert plain_answer.returncode == 0, plain_answer.stderr
    assert "stop processing" in Path(plain.log_path).read_text()[plain_log_size:]  # this time the plain server answered
    assert done.stdout == plain_answer.stdout

    # The README's first command exactly as written: no server running at all.
    assert bonsai(["stop", "--all"], env=plain_env).returncode == 0
    assert gone(plain.pid)
    fresh = bonsai(["run", "--profile", "demo", "-n", "128", README_PROMPT], env=env, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    assert "speculative decoding: live (ngram-mod" in fresh.stderr
    assert_live_answer(fresh)
    assert fresh.stdout == plain_answer.stdout
    assert instances.running() == []
    assert no_server_left(demo_home)


@pytest.mark.server
def test_an_answer_that_drafted_nothing_says_so_on_a_speculating_server(llama_server, target):
    spec = json_out(
        bonsai(
            [
                "start",
                "--model",
                target,
                "--port",
                free_port(),
                "--ctx",
                "2048",
                "--speculative",
                "--spec-type",
                "ngram-simple",
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    assert spec["speculative"]["live"]
    env = bonsai_env(llama_server, BONSAI_SPECULATIVE="1")
    done = bonsai(["run", "--url", spec["url"], "-n", "4", "hello"], env=env)  # too short to repeat anything
    assert done.returncode == 0, done.stderr
    assert "speculative: nothing drafted for this answer" in done.stderr
