"""server/restart.py's rules without llama-server: the policy, the job's JSON, the loop against a
stand-in server that dies a moment after answering /health 200 (tests/test_restart_server.py runs
the real binary)."""

from __future__ import annotations

import dataclasses
import sys
import time

import pytest

from bonsai_launch.cli.ps import restarts_cell
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.server import instances, restart
from bonsai_launch.server.process import ServerProcess, free_port

# answers /health 200, then exits with code 3 after a moment: a server that keeps crashing
DYING_SERVER = """
import http.server, sys, threading, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Timer(0.4, lambda: os._exit(3)).start()
print("listening", flush=True)
s.serve_forever()
"""


def test_backoff_grows_and_stays_at_its_last_step():
    p = restart.RestartPolicy()
    assert [p.delay(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]


def test_the_setting_turns_it_off_and_refuses_nonsense():
    assert restart.policy_from_env({}).enabled is True
    assert restart.policy_from_env({"BONSAI_RESTART": "0"}).enabled is False
    with pytest.raises(BonsaiError, match="BONSAI_RESTART='maybe'"):
        restart.policy_from_env({"BONSAI_RESTART": "maybe"})


def test_job_survives_json_for_the_keeper():
    job = restart.Job({"name": "x", "log_path": "/tmp/x.log"}, ["a"], {"K": "v"}, "ngram-mod", 4, "key", [0, 1])
    again = restart.Job.from_json(job.to_json())
    assert again == job and isinstance(again.policy.backoff_s, tuple)


def _instance(port: int, log: str) -> instances.Instance:
    return instances.Instance(
        name="dying",
        pid=1,
        create_time=0.0,
        host="127.0.0.1",
        port=port,
        base_url=f"http://127.0.0.1:{port}",
        profile=None,
        model="m.gguf",
        log_path=log,
        started_at=time.time(),
        detached=False,
        speculative=False,
        supervised=True,
    )


def test_a_crash_loop_ends_with_one_message_naming_the_log(tmp_path):
    port = free_port()
    log = tmp_path / "dying.log"
    argv = [sys.executable, "-c", DYING_SERVER, str(port)]
    policy = restart.RestartPolicy(max_exits=3, window_s=60, backoff_s=(0.05,))
    inst = _instance(port, str(log))
    instances.register(inst)
    job = restart.Job(inst.to_json(), argv, {}, policy=policy)
    server = ServerProcess.spawn(argv, env=None, log_path=log, base_url=inst.base_url)
    server.wait_ready(10)
    seen: list[ServerProcess] = []
    events: list[str] = []
    with pytest.raises(ActionFailed) as failed:
        restart.supervise(job, server, on_server=seen.append, on_event=events.append, poll=0.02)
    assert "3 unexpected exits within 60 s, a crash loop" in failed.value.message
    assert f"Log: {log}" in failed.value.message and "exited with code 3" in failed.value.message
    assert len(seen) == 2 and all(not s.alive() for s in seen)  # two restarts, both died
    assert sum("restarting it on port" in e and "last log lines:" in e for e in events) == 2
    assert sum(e.startswith("restarted: llama-server pid") for e in events) == 2
    text = log.read_text()
    assert text.count("[bonsai ") == 5 and "a crash loop" in text
    assert not instances.state_path("dying").exists()


def test_exit_code_0_and_restarts_off_are_not_restarted(tmp_path):
    port = free_port()
    log = tmp_path / "quiet.log"
    for argv, policy in (
        ([sys.executable, "-c", "pass"], restart.RestartPolicy()),
        ([sys.executable, "-c", "raise SystemExit(3)"], restart.RestartPolicy(enabled=False)),
    ):
        job = restart.Job(_instance(port, str(log)).to_json(), argv, {}, policy=policy)
        server = ServerProcess.spawn(argv, env=None, log_path=log, base_url=f"http://127.0.0.1:{port}")
        server.wait(10)
        seen: list[ServerProcess] = []
        with pytest.raises(ActionFailed, match="while serving"):
            restart.supervise(job, server, on_server=seen.append, poll=0.02)
        assert seen == []


def test_ps_cell():
    inst = _instance(1, "x.log")
    assert restarts_cell(inst) == "0"
    assert restarts_cell(dataclasses.replace(inst, supervised=False)) == "off"
    crashed = dataclasses.replace(inst, restarts=2, last_exit="was killed by signal 9 (SIGKILL: killed from outside)")
    assert restarts_cell(crashed) == "2 (last: was killed by signal 9)"


# answers /health 200 until it is killed
LIVING_SERVER = DYING_SERVER.replace("threading.Timer(0.4, lambda: os._exit(3)).start()", "")


def test_the_keeper_relays_then_restarts_and_stops_on_sigterm(tmp_path):
    import os
    import signal

    import psutil

    from bonsai_launch.server.keeper import spawn_kept

    port = free_port()
    log = tmp_path / "kept.log"
    argv = [sys.executable, "-c", LIVING_SERVER, str(port)]
    server, kept = spawn_kept(argv, env={"X_SECRET": "s"}, log_path=log, base_url=f"http://127.0.0.1:{port}")
    keeper = psutil.Process(kept.keeper.pid)
    try:
        assert psutil.Process(server.pid).ppid() == keeper.pid  # the keeper is the parent
        server.wait_ready(20)
        inst = dataclasses.replace(_instance(port, str(log)), name="kept", pid=server.pid, detached=True)
        instances.register(inst)
        policy = restart.RestartPolicy(backoff_s=(0.05,))
        kept.hand_over(
            restart.Job(inst.to_json(), argv, {"X_SECRET": "s"}, die_with_parent=False, policy=policy).to_json()
        )
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = instances.load(instances.state_path("kept"))
            if now is not None and now.pid != server.pid and now.state == "running":
                break
            time.sleep(0.05)
        assert now is not None and now.restarts == 1 and now.last_exit.startswith("was killed by signal 9"), now
        assert psutil.Process(now.pid).ppid() == keeper.pid
        assert "restarting it on port" in log.read_text() and "restarted: llama-server pid" in log.read_text()
        # a stop is a SIGTERM to the keeper: it stops the server and ends, nothing restarts
        keeper.terminate()
        keeper.wait(20)
        assert not psutil.pid_exists(now.pid) or psutil.Process(now.pid).status() == psutil.STATUS_ZOMBIE
        assert not instances.state_path("kept").exists()
    finally:
        for p in [keeper, *keeper.children(recursive=True)] if keeper.is_running() else []:
            p.kill()


# loads for a long while (a big model) before it would listen
LOADING_SERVER = "import time; print('loading', flush=True); time.sleep(60)"


def test_a_keeper_stopped_while_its_server_loads_relays_how_the_server_ended(tmp_path):
    """`bonsai stop` of a detached server that is still loading: the keeper stops it and says
    how it ended. Its stdin reader, a daemon thread, once held Python's buffer lock there, and
    the keeper aborted at exit ("Fatal Python error: _enter_buffered_busy"): the front then
    reported "killed by signal 6", its keeper's end, and the log held a fatal error."""
    import psutil

    from bonsai_launch.server.keeper import spawn_kept

    port = free_port()
    log = tmp_path / "kept.log"
    argv = [sys.executable, "-c", LOADING_SERVER]
    server, kept = spawn_kept(argv, env={}, log_path=log, base_url=f"http://127.0.0.1:{port}")
    keeper = psutil.Process(kept.keeper.pid)
    try:
        deadline = time.monotonic() + 20
        while "loading" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        keeper.terminate()  # what `bonsai stop` does first: it is the server's supervisor
        code = server.wait(30)
        assert kept.keeper.wait(30) == 0, log.read_text()
        assert code == -15, (code, log.read_text())  # the server's own end: our SIGTERM
        assert "Fatal Python error" not in log.read_text()
        assert not psutil.pid_exists(server.pid) or psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        for p in [keeper, *keeper.children(recursive=True)] if keeper.is_running() else []:
            p.kill()
