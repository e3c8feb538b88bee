"""scripts/bench_startup.py finds llama-server as `bonsai start` does, and never builds one.

It measures in a throwaway BONSAI_HOME, where no build exists: it used to start a cold build
there without a word unless BONSAI_LLAMA_SERVER was set by hand. No server runs here: the
script is stopped at the search (none found), or the search is called on its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_startup.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_startup", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_build_it_says_so_in_one_line_and_builds_nothing(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")} | {"BONSAI_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "no llama-server for profile demo" in done.stderr and "run `bonsai build`" in done.stderr
    assert not (home / "builds").exists() and not (home / "sources").exists()  # no build started


def test_a_bad_binary_setting_is_one_line_too(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")}
    env |= {"BONSAI_HOME": str(tmp_path), "BONSAI_LLAMA_SERVER": str(tmp_path / "nowhere")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "is not a file" in done.stderr


def test_it_finds_the_installed_build_and_the_users_own_binary(tmp_path, monkeypatch):
    """The same answer as `bonsai start` (server/prepare.choose_binary): `bonsai build`'s
    installed build for this machine's backend, unless BONSAI_LLAMA_SERVER names another."""
    from bonsai_launch.core.paths import builds_dir
    from bonsai_launch.llamacpp.builds.install import write_manifest
    from bonsai_launch.llamacpp.builds.lookup import detected_backend

    bin_dir = builds_dir() / "k" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("#!/bin/sh\n")
    write_manifest(
        bin_dir.parent,
        {
            "schema": 1,
            "backend": detected_backend(),
            "built_at": "2026-01-01",
            "binaries": {"llama-server": str(bin_dir / "llama-server")},
        },
    )
    script = _script()
    assert script.find_server("demo") == bin_dir / "llama-server"
    own = tmp_path / "own-llama-server"
    own.write_text("#!/bin/sh\n")
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(own))
    assert script.find_server("demo") == own
