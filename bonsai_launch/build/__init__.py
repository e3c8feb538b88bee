"""Building llama-server from the pinned llama.cpp source (`bonsai build`).

Modules, one job each: pin (what source), package_index + download (getting the sdist),
source (extracting, cloning, local folders), patches (our patch series), toolchain (compilers
and backend choice), cmake_build (configure and compile), install (binaries and manifest),
builder (the whole flow, the up-to-date check, `ensure_server` for `bonsai start`).
"""

from bonsai_launch.build.builder import (
    BuildPlan,
    BuildRequest,
    BuildResult,
    build,
    detected_backend,
    ensure_server,
    find_installed,
    plan_build,
)

__all__ = [
    "BuildPlan",
    "BuildRequest",
    "BuildResult",
    "build",
    "detected_backend",
    "ensure_server",
    "find_installed",
    "plan_build",
]
