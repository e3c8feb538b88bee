"""A llama-server that dies on its own comes back (server/restart.py, server/keeper.py), against
the real binary on the suite's tiny models.

kill -9 of the server under `bonsai start` (foreground) and under `--detach` is followed by
/health 200 on the same port, `bonsai ps` counts the restart and names the cause, and the
speculation proof runs again. A server that cannot start again (its model file replaced by
garbage after the first start) is a crash loop: bonsai gives up with one message naming the log.
`bonsai stop` and Ctrl+C are never taken for a crash; BONSAI_RESTART=0 keeps the old behaviour
(tests/test_start_server.py::test_server_killed_exits_nonzero_with_log_tail).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from bonsai_launch.server import instances
from bonsai_launch.server.process import free_port
from start_helpers import Foreground, bonsai, gone, health_ok, json_out, no_server_left, stop_all, with_pair

pytestmark = pytest.mark.server

COME_BACK_S = 30  # the promise: /health 200 again within 30 s


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def start_args(model: Path, *extra: object, port: int | None = None) -> list[str]:
    return ["--model", str(model), "--port", str(port or free_port()), "--ctx", "1024", *map(str, extra)]


def wait_restarted(name: str, old_pid: int, timeout: float = COME_BACK_S) -> instances.Instance:
    """Until the instance runs a new, healthy llama-server; returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inst = next((i for i in instances.running() if i.name == name), None)
        if inst is not None and inst.state == "running" and inst.pid != old_pid and health_ok(inst.base_url):
            return inst
        time.sleep(0.2)
    raise AssertionError(f"{name} did not come back within {timeout} s: {instances.running()}")


def ps_entry(server: Path, name: str) -> dict:
    return next(p for p in json_out(bonsai(["ps", "--json"], server=server)) if p["name"] == name)


@pytest.mark.slow
def test_foreground_server_killed_comes_back_on_the_same_port(llama_server, tiny_pair, tmp_path):
    port = free_port()
    fg = Foreground(start_args(tiny_pair["target"], port=port), llama_server, tmp_path)
    try:
        first = fg.wait_serving()
        os.kill(first.pid, signal.SIGKILL)
        again = wait_restarted(first.name, first.pid)
        assert again.port == port and again.base_url == first.base_url
        assert fg.proc.poll() is None, fg.err
        assert "llama-server was killed by signal 9 (SIGKILL" in fg.err and f"restarting it on port {port}" in fg.err
        assert "last log lines:" in fg.err
        entry = ps_entry(llama_server, first.name)
        assert entry["restarts"] == 1 and entry["last_exit"].startswith("was killed by signal 9")
        assert entry["supervised"] and not entry["detached"]
        # Ctrl+C now is a stop, not a crash: exit 0, and nothing comes back
        fg.proc.send_signal(signal.SIGINT)
        assert fg.wait() == 0, fg.err
        assert gone(again.pid)
        time.sleep(2)
        assert no_server_left(tiny_pair["target"]) and instances.running() == []
    finally:
        fg.kill()


@pytest.mark.slow
def test_detached_server_killed_comes_back_proven_and_ps_says_so(llama_server, tiny_pair):
    port = free_port()
    data = json_out(
        bonsai(
            ["start", *start_args(tiny_pair["target"], port=port), *with_pair(tiny_pair)[2:], "--detach", "--json"],
            server=llama_server,
        )
    )
    assert data["speculative"]["live"], data
    name, pid, log = data["name"], data["pid"], Path(data["log"])
    keeper = ps_entry(llama_server, name)["supervisor_pid"]
    assert keeper and psutil.Process(keeper).is_running()

    os.kill(pid, signal.SIGKILL)
    again = wait_restarted(name, pid)
    assert again.port == port
    entry = ps_entry(llama_server, name)
    assert entry["restarts"] == 1 and "signal 9" in entry["last_exit"] and entry["detached"]
    assert entry["speculative"] is True  # the proof ran again
    text = bonsai(["ps"], server=llama_server).stdout
    assert "RESTARTS" in text and "1 (last: was killed by signal 9)" in text
    notes = log.read_text(errors="replace")
    assert "restarting it on port" in notes and "restarted: llama-server pid" in notes
    assert "speculative decoding live" in notes

    # `bonsai stop` is never a crash: the keeper stops the server and ends; nothing comes back
    assert bonsai(["stop", name], server=llama_server).returncode == 0
    assert gone(again.pid) and gone(keeper)
    time.sleep(2)
    assert no_server_left(tiny_pair["target"])
    assert json_out(bonsai(["ps", "--json"], server=llama_server)) == []


def _break_model(model: Path) -> None:
    """Replace the file (a new inode: the running server's mapping stays valid) with garbage, so
    that every restart fails to load it and exits 1."""
    broken = model.with_suffix(".tmp")
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    os.replace(broken, model)


@pytest.mark.slow
def test_detached_crash_loop_gives_up_with_one_message_naming_the_log(llama_server, tiny_pair, tmp_path):
    model = tmp_path / "doomed.gguf"
    shutil.copy(tiny_pair["target"], model)
    data = json_out(bonsai(["start", *start_args(model), "--detach", "--json"], server=llama_server))
    name, log = data["name"], Path(data["log"])
    keeper = ps_entry(llama_server, name)["supervisor_pid"]
    _break_model(model)
    os.kill(data["pid"], signal.SIGKILL)
    # 5 exits: the kill and 4 failed loads after backoffs of 1 + 2 + 4 + 8 s
    assert gone(keeper, timeout=60), log.read_text(errors="replace")[-3000:]
    notes = log.read_text(errors="replace")
    assert notes.count("restarting it on port") == 4
    assert "5 unexpected exits within 60 s, a crash loop; not restarting it again" in notes
    assert f"Log: {log}" in notes
    assert instances.running() == [] and no_server_left(model)


@pytest.mark.slow
def test_foreground_crash_loop_exits_1_naming_the_log(llama_server, tiny_pair, tmp_path):
    model = tmp_path / "doomed.gguf"
    shutil.copy(tiny_pair["target"], model)
    fg = Foreground(start_args(model), llama_server, tmp_path)
    try:
        first = fg.wait_serving()
        _break_model(model)
        os.kill(first.pid, signal.SIGKILL)
        assert fg.wait(60) == 1, fg.err
        errors = [line for line in fg.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "a crash loop; not restarting it again" in errors[0], fg.err
        assert f"Log: {first.log_path}" in errors[0]
        assert instances.running() == [] and no_server_left(model)
    finally:
        fg.kill()


def test_a_server_stopped_politely_from_outside_is_not_restarted(llama_server, tiny_pair, tmp_path):
    # SIGTERM straight to llama-server (not through bonsai): it exits 0, which is a stop
    fg = Foreground(start_args(tiny_pair["target"]), llama_server, tmp_path)
    try:
        first = fg.wait_serving()
        os.kill(first.pid, signal.SIGTERM)
        assert fg.wait() == 1
        assert "exited with code 0 while serving" in fg.err and "restarting" not in fg.err
        assert no_server_left(tiny_pair["target"])
    finally:
        fg.kill()


@pytest.mark.slow
def test_restarts_off_shows_in_ps(llama_server, tiny_pair):
    from start_helpers import bonsai_env

    env = bonsai_env(llama_server, BONSAI_RESTART="0")
    data = json_out(bonsai(["start", *start_args(tiny_pair["target"]), "--detach", "--json"], env=env))
    entry = ps_entry(llama_server, data["name"])
    assert entry["supervised"] is False and entry["supervisor_pid"] is None
    assert "off" in bonsai(["ps"], server=llama_server).stdout
    os.kill(data["pid"], signal.SIGKILL)
    assert gone(data["pid"])
    time.sleep(2)
    assert instances.running() == []
