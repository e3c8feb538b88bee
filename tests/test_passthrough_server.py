"""Arguments after `--` against the real llama-server: what it binds, listens on and runs is
what the plan says, and a secret never reaches its command line."""

from __future__ import annotations

import httpx
import psutil
import pytest

from bonsai_launch.core.paths import logs_dir
from bonsai_launch.server import client, instances
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, json_out, stop_all, with_pair

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def never_spawned() -> bool:
    return not logs_dir().exists() or not any(logs_dir().iterdir())


def listening(pid: int) -> set[tuple[str, int]]:
    proc = psutil.Process(pid)
    conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections(kind="tcp")
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


def cmdline(pid: int) -> list[str]:
    return psutil.Process(pid).cmdline()


def test_remote_host_after_dashdash_needs_opt_in_and_key(llama_server, tiny_pair):
    port = free_port()
    done = bonsai(
        ["start", "--model", tiny_pair["target"], "--port", port, "--", "--host", "0.0.0.0"], server=llama_server
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "-- --host='0.0.0.0' is not a loopback address" in done.stderr and "BONSAI_ALLOW_REMOTE=1" in done.stderr
    assert never_spawned()

    env = bonsai_env(llama_server, BONSAI_ALLOW_REMOTE="1", BONSAI_API_KEY="sk-remote-1")
    done = bonsai(
        ["start", "--model", tiny_pair["target"], "--port", port, "--detach", "--", "--host", "0.0.0.0"], env=env
    )
    assert done.returncode == 0, done.stderr
    assert f"listening on     0.0.0.0:{port} (all interfaces) (from --)" in done.stdout
    (inst,) = instances.running()
    assert listening(inst.pid) == {("0.0.0.0", port)}  # what the server really binds
    assert cmdline(inst.pid).count("--host") == 1 and "sk-remote-1" not in " ".join(cmdline(inst.pid))
    ps = bonsai(["ps"], env=env)
    row = next(line for line in ps.stdout.splitlines() if line.startswith("target"))
    assert f"0.0.0.0:{port}" in row and " yes " in row
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", trust_env=False).status_code == 401
    assert client.models(f"http://127.0.0.1:{port}", "sk-remote-1") == ["target"]


def test_port_after_dashdash_is_where_bonsai_and_the_server_meet(llama_server, tiny_pair):
    a, b = free_port(), free_port()
    done = bonsai(["start", "--model", tiny_pair["target"], "--port", a, "--", "--port", b], server=llama_server)
    assert done.returncode == 2 and f"--port {a} and -- --port {b} disagree" in done.stderr
    assert never_spawned()
    data = json_out(
        bonsai(["start", "--model", tiny_pair["target"], "--detach", "--json", "--", "--port", b], server=llama_server)
    )
    assert data["url"] == f"http://127.0.0.1:{b}" and data["plan"]["from_passthrough"] == ["port"]
    assert listening(data["pid"]) == {("127.0.0.1", b)}
    assert cmdline(data["pid"]).count("--port") == 1
    assert json_out(bonsai(["ps", "--json"], server=llama_server))[0]["port"] == b


def test_small_context_after_dashdash_with_speculation(llama_server, tiny_pair):
    done = bonsai(
        [
            "start",
            *with_pair(tiny_pair),
            "--port",
            free_port(),
            "--detach",
            "--json",
            "--",
            "-c",
            "1024",
        ],
        server=llama_server,
    )
    data = json_out(done)
    assert "below 16384" in done.stderr
    assert data["speculative"]["live"] and data["plan"]["ctx"] == 1024
    argv = cmdline(data["pid"])
    assert argv.count("-c") == 1 and argv[argv.index("-c") + 1] == "1024"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4" and argv[argv.index("-np") + 1] == "1"
    props = client.props(data["url"])
    assert props["default_generation_settings"]["n_ctx"] == 1024 and props["total_slots"] == 1


@pytest.mark.slow
def test_api_key_after_dashdash_is_required_and_never_shown(llama_server, tiny_pair):
    port = free_port()
    done = bonsai(
        [
            "start",
            *with_pair(tiny_pair),
            "--port",
            port,
            "--detach",
            "--",
            "--api-key",
            "sk-pass-1",
        ],
        server=llama_server,
    )
    assert done.returncode == 0, done.stderr
    assert "speculative decoding: live" in done.stdout  # the proof sent the key
    assert "sk-pass-1" not in done.stdout + done.stderr and "Bearer sk-p***" in done.stdout
    (inst,) = instances.running()
    assert "sk-pass-1" not in " ".join(cmdline(inst.pid)) and "--api-key" not in cmdline(inst.pid)
    ps_json = bonsai(["ps", "--json"], server=llama_server).stdout
    assert "sk-pass-1" not in ps_json and '"api_key_required": true' in ps_json
    url = f"http://127.0.0.1:{port}"
    assert httpx.get(url + "/v1/models", trust_env=False).status_code == 401
    assert client.models(url, "sk-pass-1") == ["target"]


def test_typo_never_starts_a_server(llama_server, tiny_pair):
    done = bonsai(["start", "--model", tiny_pair["target"], "--cxt", "4096"], server=llama_server)
    assert done.returncode == 2 and "unknown option --cxt (did you mean --ctx?)" in done.stderr
    assert never_spawned()


def test_run_starts_its_temporary_server_on_the_port_after_dashdash(llama_server, tiny_pair):
    port = free_port()
    done = bonsai(
        ["run", "--model", tiny_pair["target"], "-n", "4", "--json", "Hello", "--", "--port", port, "-t", "1"],
        server=llama_server,
    )
    data = json_out(done)
    assert data["server"] == f"http://127.0.0.1:{port}"
    assert instances.running() == []  # the temporary server is gone
