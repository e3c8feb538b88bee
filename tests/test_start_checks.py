"""The supervisor's pieces without llama-server: log reasons, readiness, ports, pid files.

A stand-in "server" (a few lines of Python serving /health) plays llama-server where only
the HTTP behaviour matters, so these tests run anywhere in well under a second each.
"""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import time

import pytest

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.paths import run_dir
from bonsai_launch.server import client, instances
from bonsai_launch.server.process import ServerProcess, free_port
from bonsai_launch.server.supervisor import SpecProof, check_port_free, follow, speculation_failure_reason
from start_helpers import bonsai

REFUSED_LOG = """\
0.00.021.329 I common_speculative_init_result: loading draft model '/tmp/r.gguf'
0.00.029.640 E srv    load_model: draft vocab differs from the target
0.00.029.647 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 32768, kv_unified = 'false'
0.00.029.770 E srv    load_model: failed to initialize speculative decoding context: DSpark draft has no confidence head: please set --spec-draft-p-min 0
0.00.034.590 I srv  llama_server: model loaded
""".splitlines()


def test_reason_is_the_servers_own_words():
    reason = speculation_failure_reason(REFUSED_LOG)
    assert reason == (
        "draft vocab differs from the target; failed to initialize speculative decoding context: "
        "DSpark draft has no confidence head: please set --spec-draft-p-min 0"
    )
    assert speculation_failure_reason(["0.00.1 I srv ready"]) is None


def test_proof_summaries():
    live = SpecProof(True, "draft-dspark", 4, drafted=40, accepted=30, slots_speculative=True)
    assert (
        live.summary()
        == "speculative decoding: live (draft-dspark, n-max 4, acceptance 75.0% of 40 drafted on the probe)"
    )
    ngram = SpecProof(True, "ngram-mod", None, drafted=14, accepted=14, slots_speculative=True)
    assert ngram.summary().startswith(
        "speculative decoding: live (ngram-mod, n-max 64 (llama.cpp default), acceptance 100.0%"
    )
    dead = SpecProof(
        False, "draft-dspark", 4, 0, 0, False, reason="failed to initialize speculative decoding context: x"
    )
    assert (
        dead.summary()
        == "speculative decoding: NOT live (draft-dspark): failed to initialize speculative decoding context: x"
    )
    assert dead.to_json()["acceptance"] is None


def test_metrics_parsing():
    text = textwrap.dedent("""\
        # HELP llamacpp:spec_decode_num_drafts_total drafts
        # TYPE llamacpp:spec_decode_num_drafts_total counter
        llamacpp:spec_decode_num_drafts_total 12
        llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
        llamacpp:tokens_predicted_total 1.5e3
        garbage line
        """)
    m = client.parse_metrics(text)
    assert m["llamacpp:spec_decode_num_drafts_total"] == 12.0
    assert m['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == 9.0
    assert m["llamacpp:tokens_predicted_total"] == 1500.0
    assert client.acceptance({"draft_n": 8, "draft_n_accepted": 6}) == (8, 6, 0.75)
    assert client.acceptance({"predicted_n": 3}) == (0, 0, None)
    assert client.base("http://h:1/v1/") == "http://h:1"


def test_port_in_use_is_one_message_with_the_fix():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(BonsaiError) as err:
            check_port_free("127.0.0.1", port)
    assert f"port {port} on 127.0.0.1 is already in use" in err.value.message
    assert "--port" in err.value.fix
    check_port_free("127.0.0.1", port)  # free again once released


def test_non_loopback_host_refused_without_opt_in(tmp_path):
    done = bonsai(["start", "--model", tmp_path / "missing.gguf", "--host", "0.0.0.0"])
    assert done.returncode == 2
    assert done.stderr == (
        "error: BONSAI_HOST='0.0.0.0' is not a loopback address and remote access is not "
        "allowed (set BONSAI_ALLOW_REMOTE=1 (an API key is then required) or use 127.0.0.1)\n"
    )


@pytest.mark.server
def test_remote_host_gets_an_api_key_through_the_environment(llama_server, tmp_path, monkeypatch):
    # Planning only: nothing binds a non-loopback address in tests.
    import tiny_gguf
    from bonsai_launch.cli._launch import LaunchOptions
    from bonsai_launch.server.prepare import prepare_plan

    model = str(tiny_gguf.write_target(tmp_path / "t.gguf"))
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(llama_server))
    monkeypatch.setenv("BONSAI_ALLOW_REMOTE", "1")
    flags = LaunchOptions().flags(host="0.0.0.0")
    plan, generated = prepare_plan(flags, model, None, ())
    assert generated and len(generated) >= 32
    assert plan.env == {"LLAMA_API_KEY": generated}
    assert not any(generated in arg for arg in plan.argv)  # never on the command line (`ps` shows it)
    assert plan.base_url.startswith("http://127.0.0.1:")

    monkeypatch.setenv("BONSAI_API_KEY", "users-own-key")
    plan, generated = prepare_plan(flags, model, None, ())
    assert generated is None and plan.env == {"LLAMA_API_KEY": "users-own-key"}


# -- ServerProcess with a stand-in server ----------------------------------------------------------

STAND_IN = textwrap.dedent("""\
    import sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    print("stand-in: loading", flush=True)
    calls = 0
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            global calls
            calls += 1
            code = 503 if calls <= 3 else 200
            self.send_response(code); self.send_header("Content-Length", "2"); self.end_headers()
            self.wfile.write(b"{}")
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """)


def test_wait_ready_reports_loading_then_ready(tmp_path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    server = ServerProcess.spawn(
        [sys.executable, str(script), str(port)],
        env=None,
        log_path=tmp_path / "s.log",
        base_url=f"http://127.0.0.1:{port}",
    )
    seen: list[str] = []
    try:
        server.wait_ready(timeout=30, on_status=seen.append)
        assert server.alive()
        assert seen[-2:] == ["loading model", "ready"]
        assert "stand-in: loading" in server.log_tail()
    finally:
        code = server.stop(timeout=5)
    assert not server.alive() and code is not None


def test_server_that_exits_while_loading_shows_its_last_lines(tmp_path):
    argv = [sys.executable, "-c", "import sys; [print(f'line {i}') for i in range(40)]; sys.exit(3)"]
    server = ServerProcess.spawn(
        argv, env=None, log_path=tmp_path / "s.log", base_url=f"http://127.0.0.1:{free_port()}"
    )
    with pytest.raises(ActionFailed) as err:
        server.wait_ready(timeout=30)
    message = err.value.message
    assert "exited with code 3 while loading" in message
    assert "line 39" in message and "line 10" in message and "line 9\n" not in message  # the last 30 lines
    assert str(tmp_path / "s.log") in err.value.fix


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_illegal_instruction_explains_itself(tmp_path):
    # What a binary built for another CPU (AMX/AVX-512 hidden by a VM) looks like.
    argv = [sys.executable, "-c", "import os, signal; print('init', flush=True); os.kill(os.getpid(), signal.SIGILL)"]
    server = ServerProcess.spawn(
        argv, env=None, log_path=tmp_path / "s.log", base_url=f"http://127.0.0.1:{free_port()}"
    )
    with pytest.raises(ActionFailed) as err:
        server.wait_ready(timeout=30)
    assert "killed by signal 4 (illegal instruction" in err.value.message
    assert "bonsai build --force" in err.value.message and "init" in err.value.message


def test_missing_binary_is_an_action_failure(tmp_path):
    with pytest.raises(ActionFailed) as err:
        ServerProcess.spawn(
            [str(tmp_path / "no-such-llama-server")],
            env=None,
            log_path=tmp_path / "s.log",
            base_url="http://127.0.0.1:1",
        )
    assert "cannot run" in err.value.message and "bonsai build" in err.value.fix


def test_stop_escalates_to_kill(tmp_path):
    argv = [
        sys.executable,
        "-c",
        (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)"
        ),
    ]
    server = ServerProcess.spawn(argv, env=None, log_path=tmp_path / "s.log", base_url="http://127.0.0.1:1")
    # Wait for the event (SIGTERM ignored from here on), generously: on a loaded machine Python can
    # take seconds to start, and a SIGTERM before that point ends it with -15, not the kill.
    deadline = time.monotonic() + 120
    while "ready" not in "".join(server.log_tail()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.02)
    code = server.stop(timeout=0.5)
    assert code == -9 if sys.platform != "win32" else code is not None


# -- pid files ---------------------------------------------------------------------------------------


def _record(name: str, pid: int, create_time: float) -> instances.Instance:
    return instances.Instance(
        name=name,
        pid=pid,
        create_time=create_time,
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


def test_stale_and_unreadable_state_files_are_removed():
    instances.register(_record("dead", 2**22 + 12345, time.time()))
    (run_dir() / "broken.json").write_text("{not json")
    # Our own process is alive, but it is not a llama-server: never trusted.
    instances.register(_record("me", __import__("os").getpid(), time.time()))
    assert instances.running() == []
    assert list(run_dir().glob("*.json")) == []
    assert instances.unique_name("demo", 8080) == "demo"


def test_state_file_round_trip():
    inst = _record("demo", 1, 2.0)
    instances.register(inst)
    data = json.loads(instances.state_path("demo").read_text())
    assert data["name"] == "demo" and data["argv"] == ["llama-server"]
    assert instances.load(instances.state_path("demo")) == inst


def test_follow_reads_new_lines_until_the_process_ends(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("one\ntwo\n")
    alive = iter([True, False])
    lines = list(follow(log, offset=4, alive=lambda: next(alive), poll=0.01))
    assert lines == ["two"]


def test_header_cache_never_hides_a_changed_file(tmp_path):
    # `bonsai start` reads headers from a cache keyed by path, size and mtime; a file cut
    # short or replaced after a successful read must be read again.
    import os

    import tiny_gguf
    from bonsai_launch.models.gguf import inspect_gguf

    model = tiny_gguf.write_target(tmp_path / "t.gguf", layers=2)
    first = inspect_gguf(model)
    assert inspect_gguf(model) == first
    tiny_gguf.write_target(model, layers=3)
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert inspect_gguf(model).layers == 3
    tiny_gguf.truncate(model, model.stat().st_size // 2)
    with pytest.raises(BonsaiError, match="truncated"):
        inspect_gguf(model)


def test_docs_show_what_the_proof_prints():
    """SPECULATIVE.md quotes the proof line: it must be the format the code prints."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "SPECULATIVE.md").read_text()
    line = SpecProof(True, "draft-dspark", 4, drafted=16, accepted=14, slots_speculative=True).summary()
    assert line in doc


def test_test_helpers_cite_no_machine_paths():
    from pathlib import Path

    here = Path(__file__).resolve().parent
    for path in [here / "conftest.py", *sorted((here / "support").glob("*.py"))]:
        text = path.read_text()
        assert "/work/" not in text and "/home/" not in text, path.name
