"""The unit `bonsai service install` writes really serves, run the way systemd runs it: its
ExecStart words with only its Environment= lines (plus HOME and PATH, which the user manager
gives), from `/`, against the real llama-server on the suite's tiny model. The manager's stop
(KillMode=mixed: SIGTERM to bonsai alone) is a clean stop, exit 0, so Restart=on-failure leaves
it stopped, and no llama-server is left behind. systemd is not PID 1 here, so this is the part
of the manager's job a test can do.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bonsai_launch.server import instances
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, health_ok, json_out, no_server_left, stop_all

pytestmark = [pytest.mark.server, pytest.mark.skipif(sys.platform != "linux", reason="a systemd unit")]


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def unit_command(text: str) -> tuple[list[str], dict[str, str]]:
    """ExecStart's words and the Environment= values, unquoted as systemd unquotes them (our
    units use its shell-like quoting and `%%`/`$$` for `%`/`$`)."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        value = value.replace("%%", "%").replace("$$", "$")
        if key == "ExecStart":
            argv = shlex.split(value)
        elif key == "Environment":
            name, _, val = shlex.split(value)[0].partition("=")
            env[name] = val
    return argv, env


def test_the_installed_unit_serves_and_stops_cleanly_on_the_managers_sigterm(llama_server, tiny_pair, tmp_path):
    port = free_port()
    env = bonsai_env(llama_server, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    done = bonsai(
        ["service", "install", "--model", tiny_pair["target"], "--port", port, "--ctx", 1024, "--json"], env=env
    )
    unit = Path(json_out(done)["path"])
    assert unit.is_relative_to(tmp_path)
    argv, unit_env = unit_command(unit.read_text())
    assert unit_env["BONSAI_LLAMA_SERVER"] == str(llama_server)  # the settings of the shell that installed it

    manager_env = {"HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin", **unit_env}
    out = tmp_path / "journal.txt"
    with open(out, "wb") as journal:
        proc = subprocess.Popen(argv, env=manager_env, cwd="/", stdout=journal, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        inst = None
        while time.monotonic() < deadline and inst is None:
            assert proc.poll() is None, out.read_text(errors="replace")
            inst = next((i for i in instances.running() if i.port == port and health_ok(i.base_url)), None)
            time.sleep(0.2)
        assert inst is not None, out.read_text(errors="replace")
        assert not inst.detached and inst.supervised and inst.supervisor_pid == proc.pid
        proc.send_signal(signal.SIGTERM)  # KillMode=mixed: bonsai alone gets it
        assert proc.wait(60) == 0, out.read_text(errors="replace")  # 0: Restart=on-failure leaves it stopped
        assert no_server_left(tiny_pair["target"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
