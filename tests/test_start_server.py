"""`bonsai start` against the real llama-server, with the suite's tiny GGUF pairs.

Each test runs the CLI as a subprocess in its own BONSAI_HOME and checks what a user sees
(exit code, the one error line, `speculative decoding: live`) and what is left running (the
test's llama-server pids must be gone). Pre-spawn refusals are checked by the absence of any
log file: the server was never started.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

import tiny_gguf
from bonsai_launch.core.paths import logs_dir, run_dir
from bonsai_launch.server import client, instances
from bonsai_launch.server.process import free_port
from start_helpers import Foreground, bonsai, gone, json_out, no_server_left, processes_naming, stop_all

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_pair):
    d = tmp_path_factory.mktemp("tiny")
    return {
        **tiny_pair,
        "const_target": tiny_gguf.write_target(d / "const_target.gguf", constant_token=7),
        "const_drafter": tiny_gguf.write_dspark_drafter(d / "const_drafter.gguf", block_size=4, constant_token=7),
        "refused": tiny_gguf.write_runtime_refused_drafter(d / "refused.gguf"),
        "wide": tiny_gguf.write_dspark_drafter(d / "wide.gguf", target_embedding=128),
        "othervocab": tiny_gguf.write_dspark_drafter(d / "othervocab.gguf", tokens_like_target=False),
    }


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def start_args(model: Path, *extra: object, port: int | None = None) -> list[str]:
    return ["--model", str(model), "--port", str(port or free_port()), "--ctx", "2048", *map(str, extra)]


def never_spawned() -> bool:
    return not logs_dir().exists() or not any(logs_dir().iterdir())


# -- speculation is proven ------------------------------------------------------------------------


def test_dspark_drafter_is_live(llama_server, tiny):
    done = bonsai(
        ["start", *start_args(tiny["target"], "--drafter", tiny["drafter"], "--speculative"), "--detach", "--json"],
        server=llama_server,
    )
    data = json_out(done)
    spec = data["speculative"]
    assert spec["live"] and spec["type"] == "draft-dspark" and spec["n_max"] == 4
    assert spec["drafted"] > 0
    pid = data["pid"]
    assert bonsai(["stop", data["name"]], server=llama_server).returncode == 0
    assert gone(pid)


def test_agreeing_drafter_accepts_everything_and_changes_nothing(llama_server, tiny):
    prompt, n = "tok1 tok2 tok3", 24
    spec = json_out(
        bonsai(
            [
                "start",
                *start_args(tiny["const_target"], "--drafter", tiny["const_drafter"], "--speculative"),
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    assert spec["speculative"]["live"]
    assert spec["speculative"]["acceptance"] == 1.0
    with_spec = client.completion(spec["url"], prompt, n_predict=n, temperature=0)
    assert with_spec["timings"]["draft_n"] > 0
    assert with_spec["timings"]["draft_n_accepted"] == with_spec["timings"]["draft_n"]
    bonsai(["stop", "--all"], server=llama_server)

    plain = json_out(bonsai(["start", *start_args(tiny["const_target"]), "--detach", "--json"], server=llama_server))
    assert plain["speculative"] is None
    without = client.completion(plain["url"], prompt, n_predict=n, temperature=0)
    assert "draft_n" not in without["timings"] or without["timings"]["draft_n"] == 0
    assert with_spec["content"] == without["content"]


def test_runtime_refused_drafter_fails_with_the_servers_reason(llama_server, tiny):
    done = bonsai(
        [
            "start",
            *start_args(tiny["target"], "--drafter", tiny["refused"], "--speculative"),
            "--",
            "--spec-draft-p-min",
            "0.5",
        ],
        server=llama_server,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "speculative decoding: NOT live" in done.stderr
    assert "failed to initialize speculative decoding context: DSpark draft has no confidence head" in done.stderr
    assert "--spec-fallback" in done.stderr
    assert no_server_left(tiny["target"])
    assert instances.running() == []


def test_runtime_refused_drafter_with_fallback_keeps_serving(llama_server, tiny):
    done = bonsai(
        [
            "start",
            *start_args(tiny["target"], "--drafter", tiny["refused"], "--speculative"),
            "--spec-fallback",
            "--detach",
            "--",
            "--spec-draft-p-min",
            "0.5",
        ],
        server=llama_server,
    )
    assert done.returncode == 0, done.stderr
    assert "warning: speculative decoding: NOT live" in done.stderr
    assert "no confidence head" in done.stderr
    (inst,) = instances.running()
    assert not inst.speculative
    assert client.health(inst.base_url).ok
    ps = json_out(bonsai(["ps", "--json"], server=llama_server))
    assert ps[0]["speculative"] is False


# -- refused before spawning ------------------------------------------------------------------------


@pytest.mark.parametrize("drafter, words", [("wide", "embedding"), ("othervocab", "vocab")])
def test_mismatched_drafter_refused_before_spawning(llama_server, tiny, drafter, words):
    started = time.monotonic()
    done = bonsai(
        ["start", *start_args(tiny["target"], "--drafter", tiny[drafter], "--speculative")], server=llama_server
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: drafter does not fit the target")
    assert words in done.stderr.lower()
    assert never_spawned()
    assert time.monotonic() - started < 30  # sanity only; the real speed is in docs/benchmarks.md


def test_truncated_model_refused_before_spawning(llama_server, tiny, tmp_path):
    model = tmp_path / "half.gguf"
    model.write_bytes(Path(tiny["target"]).read_bytes())
    tiny_gguf.truncate(model, model.stat().st_size // 2)
    done = bonsai(["start", *start_args(model)], server=llama_server)
    assert done.returncode == 2
    assert "truncated" in done.stderr and done.stderr.count("\n") == 1
    assert never_spawned()


def test_port_in_use_refused_before_spawning(llama_server, tiny):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = bonsai(["start", *start_args(tiny["target"], port=port)], server=llama_server)
    assert done.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "--port" in done.stderr
    assert never_spawned()


def test_port_taken_by_a_bonsai_server_names_it(llama_server, tiny):
    first = json_out(bonsai(["start", *start_args(tiny["target"]), "--detach", "--json"], server=llama_server))
    port = first["url"].rsplit(":", 1)[1]
    done = bonsai(["start", *start_args(tiny["target"], port=int(port))], server=llama_server)
    assert done.returncode == 2
    assert f"by bonsai server '{first['name']}'" in done.stderr


def test_detach_again_with_the_same_settings_finds_the_server_up(llama_server, tiny):
    """README's first command run twice: the second `start --detach` of the same command line
    says where the running server is and exits 0; other settings on its port still fail."""
    args = start_args(tiny["target"])
    first = json_out(bonsai(["start", *args, "--detach", "--json"], server=llama_server))
    again = bonsai(["start", *args, "--detach", "--json"], server=llama_server)
    assert again.returncode == 0, again.stderr
    data = json_out(again)
    assert data["already_running"] is True and (data["name"], data["pid"]) == (first["name"], first["pid"])
    text = bonsai(["start", *args, "--detach"], server=llama_server)
    assert text.returncode == 0 and f"already running: {first['name']}" in text.stdout
    assert f"bonsai stop {first['name']}" in text.stdout
    assert [i.pid for i in instances.running()] == [first["pid"]]
    other = bonsai(["start", *args, "--parallel", "2", "--detach"], server=llama_server)
    assert other.returncode == 2 and "is already in use" in other.stderr


# -- signals and deaths: exit codes and no orphans ----------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.slow
def test_user_stop_exits_zero_and_leaves_nothing(llama_server, tiny, tmp_path, sig):
    fg = Foreground(start_args(tiny["target"]), llama_server, tmp_path)
    try:
        inst = fg.wait_serving()
        fg.proc.send_signal(sig)
        assert fg.wait() == 0, fg.err
        assert gone(inst.pid)
        assert no_server_left(tiny["target"])
        assert not (run_dir() / f"{inst.name}.json").exists()
    finally:
        fg.kill()


def test_server_killed_exits_nonzero_with_log_tail(llama_server, tiny, tmp_path):
    # With restarts off (BONSAI_RESTART=0); on, it comes back (tests/test_restart_server.py).
    from start_helpers import bonsai_env

    fg = Foreground(
        start_args(tiny["target"]), llama_server, tmp_path, env=bonsai_env(llama_server, BONSAI_RESTART="0")
    )
    try:
        inst = fg.wait_serving()
        os.kill(inst.pid, signal.SIGKILL)
        assert fg.wait() == 1
        assert "error: llama-server was killed by signal 9 (SIGKILL" in fg.err
        assert "while serving; last log lines:" in fg.err
        assert "listening on http://127.0.0.1" in fg.err
        assert instances.running() == []
    finally:
        fg.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_killing_bonsai_takes_the_server_along(llama_server, tiny, tmp_path):
    fg = Foreground(start_args(tiny["target"]), llama_server, tmp_path)
    try:
        inst = fg.wait_serving()
        fg.proc.kill()  # SIGKILL: bonsai cannot clean up; the kernel must
        fg.proc.wait(10)
        assert gone(inst.pid)
        assert instances.running() == []  # its state file is stale now, and removed on sight
    finally:
        fg.kill()


def test_ctrl_c_while_loading_stops_the_server(llama_server, tiny, tmp_path):
    # A port nobody answers on would never get ready; a slow load is simulated by signalling as
    # soon as the server process exists.
    fg = Foreground(start_args(tiny["target"]), llama_server, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not processes_naming(tiny["target"]) and time.monotonic() < deadline and fg.proc.poll() is None:
            time.sleep(0.01)
        fg.proc.send_signal(signal.SIGINT)
        assert fg.wait() == 0, fg.err
        assert no_server_left(tiny["target"])
        assert instances.running() == []
    finally:
        fg.kill()


def test_a_stop_during_the_spawn_stops_the_server_it_started(llama_server, tiny, monkeypatch):
    # The window the test above hits by chance on a loaded machine, forced: the stop signal arrives
    # once the server process exists but before bonsai has recorded it. bonsai must still know it
    # started a server (exit 0 rather than 130) and stop it, not leave it to die with its parent.
    from bonsai_launch.server import supervisor
    from bonsai_launch.server.plan import LaunchPlan, ModelPlan, ServerPlan
    from bonsai_launch.server.process import ServerProcess, SignalForwarder, StopRequested

    spawned: list[ServerProcess] = []
    real_spawn = ServerProcess.spawn

    def spawn_then_stop(*args, **kwargs):
        server = real_spawn(*args, **kwargs)
        spawned.append(server)
        os.kill(os.getpid(), signal.SIGUSR1)  # Python runs the handler before this call returns
        return server

    monkeypatch.setattr(ServerProcess, "spawn", spawn_then_stop)
    port = free_port()
    served = ModelPlan("target", str(tiny["target"]), ("-m", str(tiny["target"])), (), (), None, 512, 0, "cpu", None)
    plan = LaunchPlan(ServerPlan(str(llama_server), "127.0.0.1", port, metrics=False), served)
    try:
        with SignalForwarder((signal.SIGUSR1,)) as forwarder, pytest.raises(StopRequested):
            supervisor.launch(plan, forwarder=forwarder)
        assert len(spawned) == 1
        assert forwarder.server is spawned[0]
        assert gone(spawned[0].pid)
        assert instances.running() == []
    finally:
        for server in spawned:
            server.kill()


# -- detach, ps, logs, stop ---------------------------------------------------------------------------


@pytest.mark.slow
def test_detach_ps_logs_stop(llama_server, tiny):
    a = json_out(bonsai(["start", *start_args(tiny["target"]), "--detach", "--json"], server=llama_server))
    b = json_out(bonsai(["start", *start_args(tiny["target"]), "--detach", "--json"], server=llama_server))
    assert a["name"] == "target" and b["name"].startswith("target-")
    ps = json_out(bonsai(["ps", "--json"], server=llama_server))
    assert {p["pid"] for p in ps} == {a["pid"], b["pid"]}
    assert all(p["detached"] and p["speculative"] is False for p in ps)
    text = bonsai(["ps"], server=llama_server).stdout
    assert "PROFILE" in text and "UPTIME" in text and "SPECULATIVE" in text and str(a["pid"]) in text

    logs = bonsai(["logs", a["name"], "-n", "200"], server=llama_server)
    assert logs.returncode == 0 and "listening on http://127.0.0.1" in logs.stdout

    ambiguous = bonsai(["stop"], server=llama_server)
    assert ambiguous.returncode == 2 and "2 servers are running" in ambiguous.stderr

    assert bonsai(["stop", a["name"]], server=llama_server).returncode == 0
    assert gone(a["pid"])
    assert bonsai(["stop", "--all"], server=llama_server).returncode == 0
    assert gone(b["pid"])
    assert json_out(bonsai(["ps", "--json"], server=llama_server)) == []
    assert no_server_left(tiny["target"])


def test_stop_of_a_foreground_server_ends_its_bonsai_cleanly(llama_server, tiny, tmp_path):
    fg = Foreground(start_args(tiny["target"]), llama_server, tmp_path)
    try:
        inst = fg.wait_serving()
        assert bonsai(["stop", inst.name], server=llama_server).returncode == 0
        assert fg.wait() == 0
        assert gone(inst.pid)
    finally:
        fg.kill()


def test_stale_pid_files_are_removed_not_trusted(llama_server, tiny):
    # A process that is alive but is not a llama-server: never signalled, its file removed.
    bystander = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for name, pid in (("dead", dead.pid), ("bystander", bystander.pid)):
            instances.register(
                instances.Instance(
                    name=name,
                    pid=pid,
                    create_time=time.time(),
                    host="127.0.0.1",
                    port=1,
                    base_url="http://127.0.0.1:1",
                    profile="demo",
                    model="m.gguf",
                    log_path="x.log",
                    started_at=time.time(),
                    detached=True,
                    speculative=False,
                    argv=("llama-server",),
                )
            )
        assert len(list(run_dir().glob("*.json"))) == 2
        assert json_out(bonsai(["ps", "--json"], server=llama_server)) == []
        assert list(run_dir().glob("*.json")) == []
        done = bonsai(["stop", "bystander"], server=llama_server)
        assert done.returncode == 2 and "no server started by bonsai is running" in done.stderr
        assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE
    finally:
        bystander.kill()
        bystander.wait()


# -- run ------------------------------------------------------------------------------------------


def test_run_with_a_temporary_server_streams_and_cleans_up(llama_server, tiny):
    done = bonsai(["run", "--model", tiny["target"], "--ctx", "2048", "-n", "8", "hello"], server=llama_server)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "8 tokens" in done.stderr and "tokens/s" in done.stderr
    assert no_server_left(tiny["target"])
    assert instances.running() == []


def test_run_against_a_speculative_server_reports_acceptance(llama_server, tiny):
    data = json_out(
        bonsai(
            [
                "start",
                *start_args(tiny["const_target"], "--drafter", tiny["const_drafter"], "--speculative"),
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    done = bonsai(["run", "--url", data["openai_base_url"], "-n", "16", "--json", "hello"], server=llama_server)
    result = json_out(done)
    assert result["drafted"] > 0 and result["acceptance"] == 1.0
    text = bonsai(["run", "--url", data["url"], "-n", "16", "hello"], server=llama_server)
    assert "speculative: drafted" in text.stderr and "(100.0%)" in text.stderr


# -- the demo profile ----------------------------------------------------------------------------


@pytest.mark.readme  # the README's test command runs the demo model in the real llama-server here
def test_demo_profile_ngram_speculation_is_live(llama_server, demo_gguf, isolated_home):
    folder = isolated_home / "models" / "demo"
    folder.mkdir(parents=True)
    os.symlink(demo_gguf, folder / demo_gguf.name)
    env = {**os.environ, "BONSAI_LLAMA_SERVER": str(llama_server), "BONSAI_SPECULATIVE": "1"}
    done = bonsai(
        ["start", "--profile", "demo", "--port", str(free_port()), "--ctx", "4096", "--detach"], env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "speculative decoding: live (ngram-mod" in done.stdout
    assert re.search(r"acceptance [\d.]+% of [1-9]\d* drafted on the probe", done.stdout), done.stdout  # real drafts
    (inst,) = instances.running()
    assert inst.profile == "demo" and inst.speculative
    assert bonsai(["stop", "demo"], env=env).returncode == 0
    assert gone(inst.pid)


def test_run_reuses_the_running_server_of_the_profile(llama_server, tiny):
    data = json_out(bonsai(["start", *start_args(tiny["target"]), "--detach", "--json"], server=llama_server))
    assert "stop processing" not in Path(data["log"]).read_text()  # no request yet (no speculation proof)
    instances.update(data["name"], profile="demo")  # as if started with --profile demo
    done = bonsai(["run", "--profile", "demo", "-n", "4", "hello"], server=llama_server)
    assert done.returncode == 0, done.stderr
    assert "temporary llama-server" not in done.stderr
    assert "4 tokens" in done.stderr
    assert "stop processing" in Path(data["log"]).read_text()  # the running server answered it


# -- chat ------------------------------------------------------------------------------------------


def test_chat_keeps_history_and_leaves_nothing_behind(llama_server, tiny):
    import subprocess

    from start_helpers import ROOT, bonsai_env

    script = "hello\n/reset\nagain\n/exit\n"
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "chat", "--model", str(tiny["target"]), "--ctx", "2048", "-n", "4"],
        input=script,
        env=bonsai_env(llama_server),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "history cleared" in done.stderr
    stats_lines = [line for line in done.stderr.splitlines() if re.match(r"^\d+ tokens, ", line)]
    assert len(stats_lines) == 2, done.stderr  # one stats line per answer
    assert no_server_left(tiny["target"])
    assert instances.running() == []
