"""`bonsai doctor`: every section is gathered, and each problem carries its fix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from bonsai_launch import doctor
from bonsai_launch.llamacpp.builds import backend, toolchain


def test_report_sections_and_fixes(monkeypatch):
    report = doctor.gather()
    data = report.to_json()
    for section in ("hardware", "toolchain", "backend", "builds", "models", "port", "problems", "ok"):
        assert section in data
    assert data["toolchain"]["cmake"]["path"] and data["toolchain"]["ninja"]["path"]  # the PyPI packages
    assert data["backend"]["backend"] in backend.BACKENDS
    # A fresh BONSAI_HOME has no build: that is reported with the command that fixes it.
    missing = [p for p in report.problems if "no llama-server is built" in p.what]
    assert missing and "bonsai build" in missing[0].fix
    assert all(p.fix for p in report.problems)


def test_busy_default_port_is_a_problem(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("BONSAI_PORT", str(port))
        report = doctor.gather()
    assert report.port == {"host": "127.0.0.1", "port": port, "free": False}
    assert any(f"port {port}" in p.what and "BONSAI_PORT" in p.fix for p in report.problems)


def test_missing_compiler_is_an_error_with_the_install_command(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    real = toolchain.detect

    def no_compiler(versions=True):
        tools = real(versions=False)
        return toolchain.Toolchain(
            **{**tools.__dict__, "cc": toolchain.Tool("cc", None), "cxx": toolchain.Tool("c++", None)}
        )

    monkeypatch.setattr(toolchain, "detect", no_compiler)
    report = doctor.gather()
    errors = [p for p in report.problems if p.severity == "error"]
    assert errors and "compiler" in errors[0].what and "install" in errors[0].fix
    assert report.to_json()["ok"] is False


def test_bad_explicit_server_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(tmp_path / "missing"))
    report = doctor.gather()
    assert report.llama_server["error"] and any("BONSAI_LLAMA_SERVER" in p.what for p in report.problems)


def test_cli_json(isolated_home):
    env = dict(os.environ, BONSAI_HOME=str(isolated_home))
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["hardware"]["logical_cores"] >= 1 and isinstance(data["problems"], list)
    text = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "doctor"], env=env, capture_output=True, text=True, timeout=120
    )
    assert text.returncode == 0 and "toolchain" in text.stdout and "fix:" in text.stdout


def test_nvcc_without_a_gpu_is_not_called_no_toolchain(monkeypatch):
    """doctor lists nvcc; the backend line must not then say that no GPU toolchain was found."""
    from bonsai_launch.core import hardware

    real = toolchain.detect

    def with_nvcc(versions=True):
        tools = real(versions=False)
        return toolchain.Toolchain(**{**tools.__dict__, "nvcc": toolchain.Tool("nvcc", "/usr/local/cuda/bin/nvcc")})

    monkeypatch.setattr(toolchain, "detect", with_nvcc)
    no_gpu = hardware.detect()
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: type(no_gpu)(**{**no_gpu.__dict__, "gpus": ()}))
    report = doctor.gather()
    assert report.backend["backend"] == "cpu"
    assert report.backend["reason"].startswith("nvcc found but no NVIDIA GPU")


def test_only_fork_only_files_are_said_to_need_the_fork(isolated_home):
    """Bonsai 2 and 2.5 run on bonsai's build (patch 0010): doctor no longer sends them to the fork;
    what it names are the catalog's `builds: fork` files (the ternary PQ2_0 alternatives)."""
    from bonsai_launch.config.profiles import load_all

    names = doctor.gather().to_json()["fork_only_files"]
    assert "Ternary-Bonsai-1.7B-PQ2_0.gguf" in names
    bonsai2 = {f.name for p in load_all().values() if p.family.startswith("bonsai2") for f in p.files}
    assert bonsai2 and not bonsai2 & set(names), names
