"""scripts/*.sh under bash and dash (and *.ps1 under pwsh when installed).

A stand-in `bonsai` on PATH records what the wrappers hand it, so argument and environment
pass-through are checked exactly; one slow test runs the real thing end to end.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bonsai_launch.server import instances
from bonsai_launch.server.process import free_port
from start_helpers import gone, no_server_left

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
# POSIX shells only where the .sh wrappers are meant to run (Windows' bash is Git's or WSL's).
SHELLS = [s for s in ("bash", "dash") if shutil.which(s)] if sys.platform != "win32" else []

FAKE_BONSAI = """#!/bin/sh
for a in "$@"; do printf '[%s]' "$a"; done
printf '\\nBONSAI_SPECULATIVE=%s\\n' "${BONSAI_SPECULATIVE-unset}"
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "bonsai"
    fake.write_text(FAKE_BONSAI)
    fake.chmod(0o755)
    return folder


def run_script(shell: str, script: Path, args: list[str], path: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run(
        [shutil.which(shell), str(script), *args], env=full_env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_start_wrapper_passes_arguments_and_environment(shell, fake_bin):
    done = run_script(
        shell,
        SCRIPTS / "start_llama_server.sh",
        ["--threads", "2", "a b", "it's"],
        f"{fake_bin}:/usr/bin:/bin",
        BONSAI_SPECULATIVE="1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[start][--][--threads][2][a b][it's]", "BONSAI_SPECULATIVE=1"]


@pytest.mark.parametrize("shell", SHELLS)
def test_start_wrapper_passes_the_exit_code(shell, fake_bin):
    done = run_script(shell, SCRIPTS / "start_llama_server.sh", [], f"{fake_bin}:/usr/bin:/bin", FAKE_EXIT="3")
    assert done.returncode == 3
    assert done.stdout.splitlines()[0] == "[start][--]"


@pytest.mark.parametrize("shell", SHELLS)
def test_run_wrapper(shell, fake_bin):
    done = run_script(
        shell, SCRIPTS / "run_llama.sh", ["Why is the sky blue?", "--max-tokens", "5"], f"{fake_bin}:/usr/bin:/bin"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[run][Why is the sky blue?][--max-tokens][5]"
    usage = run_script(shell, SCRIPTS / "run_llama.sh", [], f"{fake_bin}:/usr/bin:/bin")
    assert usage.returncode == 2 and "usage:" in usage.stderr


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("script", ["start_llama_server.sh", "run_llama.sh"])
def test_wrappers_say_how_to_install_bonsai(shell, script, tmp_path):
    # A copy outside the checkout (no ../.venv) and a PATH with neither bonsai nor python.
    copy = tmp_path / "scripts" / script
    copy.parent.mkdir()
    shutil.copy(SCRIPTS / script, copy)
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_script(shell, copy, ["hello"], str(empty))
    assert done.returncode == 127
    assert "bonsai is not installed" in done.stderr
    assert "pip install 'bonsai-launch[demo]'" in done.stderr


@pytest.mark.skipif(
    not shutil.which("pwsh"),
    reason="PowerShell (pwsh) is not installed (tests/test_powershell.py parses the .ps1 instead)",
)
@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in bonsai is a #! script, which Windows cannot run")
@pytest.mark.parametrize(
    "script, expected",
    [("start_llama_server.ps1", "[start][--][--threads][2][a b]"), ("run_llama.ps1", "[run][--threads][2][a b]")],
)
def test_powershell_wrappers(script, expected, fake_bin):
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}", "BONSAI_SPECULATIVE": "1"}
    done = subprocess.run(
        ["pwsh", "-NoProfile", "-File", str(SCRIPTS / script), "--threads", "2", "a b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == expected


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_start_wrapper_serves_the_demo_with_speculation(shell, llama_server, demo_gguf, isolated_home, tmp_path):
    """The Done-when path: BONSAI_SPECULATIVE=1 start_llama_server.sh with the demo profile
    serves, proves speculation live, and Ctrl+C leaves no llama-server behind."""
    folder = isolated_home / "models" / "demo"
    folder.mkdir(parents=True)
    os.symlink(demo_gguf, folder / demo_gguf.name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "BONSAI_LLAMA_SERVER": str(llama_server),
        "BONSAI_PROFILE": "demo",
        "BONSAI_SPECULATIVE": "1",
        "BONSAI_PORT": str(free_port()),
        "BONSAI_CTX": "4096",
    }
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [shutil.which(shell), str(SCRIPTS / "start_llama_server.sh"), "--threads", "2"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 240
        while "press Ctrl+C to stop" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()
            time.sleep(0.1)
        text = out.read_text()
        assert "speculative decoding: live (ngram-mod" in text
        assert re.search(r"acceptance [\d.]+% of [1-9]\d* drafted on the probe", text), text  # real drafts
        (inst,) = instances.running()
        assert "--threads" in inst.argv  # trailing arguments reached llama-server
        proc.send_signal(signal.SIGINT)  # exec'd: the signal reaches bonsai itself
        assert proc.wait(30) == 0
        assert gone(inst.pid)
        assert no_server_left(demo_gguf)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
