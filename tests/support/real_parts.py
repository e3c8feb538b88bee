"""The real parts the suite needs, and the one way a test may do without them.

Tests that need the real llama-server (built by `bonsai build` from the CURRENT pin and patch
series) or the demo model package FAIL when it is missing or stale: a green run must mean the
real server and the real model were exercised. Setting SKIP_REAL_SERVER_TESTS=1 (documented
in README.md) turns those failures into skips for a quick run on a machine without a build;
.ci/run never sets it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SKIP_VAR = "SKIP_REAL_SERVER_TESTS"


def skipping_allowed() -> bool:
    return os.environ.get(SKIP_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def missing(reason: str, fix: str) -> None:
    """Fail the test (or skip it when the caller opted in) because a real part is missing."""
    if skipping_allowed():
        pytest.skip(f"{reason} ({SKIP_VAR} is set)")
    pytest.fail(f"{reason}: {fix} (or set {SKIP_VAR}=1 to skip the tests that need it)", pytrace=False)


def stale_build_problem(server: Path) -> str | None:
    """Why `server` is not a build of the current pin and patch series, or None when it is.

    Bonsai's builds carry a manifest beside bin/; a binary outside a bonsai build (pointed at
    by BONSAI_LLAMA_SERVER) is checked by its build number only."""
    from bonsai_launch.llamacpp.builds.install import read_manifest
    from bonsai_launch.llamacpp.builds.patches import load_series, series_hash
    from bonsai_launch.llamacpp.builds.pin import load_pin

    pin = load_pin().default
    series = load_series()
    manifest = read_manifest(server.resolve().parent.parent)
    if manifest is None:
        from bonsai_launch.llamacpp.binaries import probe_uncached

        try:
            build = probe_uncached(server).build_number
        except Exception as exc:  # any failure to run it is the problem
            return f"{server} cannot be probed ({exc})"
        pinned = pin.version.split(".")[0]
        return None if str(build) == pinned else f"{server} is llama.cpp build {build}, not the pinned {pinned}"
    source = manifest.get("source") or {}
    if source.get("identity") != pin.sha256:
        return f"{server} was built from {source.get('spec') or source.get('kind')}, not the pinned {pin.package}=={pin.version}"
    if manifest.get("patches_hash", "") != series_hash(series):
        built = ", ".join(source.get("patches") or []) or "no patches"
        wanted = ", ".join(p.name for p in series) or "no patches"
        return f"{server} was built with an older patch series ({built}; now: {wanted})"
    return None


def find_real_server() -> tuple[Path | None, str | None]:
    """(the binary, None) when a current build is found, else (maybe a binary, the problem)."""
    explicit = os.environ.get("BONSAI_LLAMA_SERVER") or os.environ.get("BONSAI_TEST_LLAMA_SERVER")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            return None, f"BONSAI_LLAMA_SERVER={explicit!r} is not a file"
    else:
        try:
            from bonsai_launch.llamacpp.builds import find_installed

            path = find_installed("auto")
        except Exception as exc:
            return None, f"no llama-server found ({exc})"
        if path is None:
            return None, "no llama-server is built"
    try:
        return path, stale_build_problem(path)
    except Exception as exc:  # an unreadable pin is a problem to report, not a crash
        return path, f"cannot check {path} against the pin ({exc})"


def require_litellm() -> None:
    """The fleet tests run the real LiteLLM proxy: without the `fleet` extra they fail like the
    other real-part tests (or skip under SKIP_REAL_SERVER_TESTS=1)."""
    import importlib.util

    if importlib.util.find_spec("litellm") is None:
        missing("litellm[proxy] is not installed", "pip install -e '.[fleet]' (.ci/run installs it)")
