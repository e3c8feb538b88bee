"""Building llama-server from the pinned llama.cpp source (`bonsai build`).

Modules, one job each:
pin.py            what source: vendor/llama.cpp/pin.toml (the sdist, and named git sources such as the fork)
package_index.py  finding the sdist on the package indexes the user's pip is configured for
download.py       streaming it to disk, sha256 checked as it arrives
source.py         extracting, cloning (tag and commit checked), local folders
patches.py        our patch series, applied in name order
toolchain.py      compilers and tools on this machine, with the hint that installs each one
backend.py        which backend to build (cpu, cuda, metal, vulkan, hip) and why; CUDA/HIP architectures
cuda_toolkit.py   where the CUDA toolkit's parts are: a system toolkit, NVIDIA's PyPI wheels, or both
preflight.py      can this machine build the chosen GPU backend? checked in seconds, before any download
fallback.py       BONSAI_BACKEND, and auto's failed GPU build giving way to the CPU build (remembered)
cmake.py          configure and compile: hermetic flags, a progress bar, a full log, clean interrupts
install.py        binaries and the manifest that says what they are
kernel_check.py   the CPU kernel check (cpu_kernels_check.c) compiled against a build's ggml and run
selftest_record.py  the self-test's verdict kept beside the manifest, and what it means for a launch
lookup.py         which installed build a launch uses (`find_installed`, the backend `auto` means here)
builder.py        the whole flow, the up-to-date check, `ensure_server` for `bonsai start`
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bonsai_launch.llamacpp.builds.builder import (
        BuildPlan,
        BuildRequest,
        BuildResult,
        build,
        ensure_server,
        plan_build,
    )
    from bonsai_launch.llamacpp.builds.lookup import detected_backend, find_installed

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


def __getattr__(name: str) -> Any:
    """builder.py's and lookup.py's names, imported on first use: `bonsai start` with a built
    binary reads only install.py's manifest and lookup.py, and importing builder (the source,
    preflight and CMake modules with it) would add to every start-up."""
    if name in ("detected_backend", "find_installed"):
        from bonsai_launch.llamacpp.builds import lookup

        return getattr(lookup, name)
    if name in __all__:
        from bonsai_launch.llamacpp.builds import builder

        return getattr(builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
