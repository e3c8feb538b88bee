"""Which llama.cpp backend to build: cpu, cuda, metal, vulkan or hip, chosen from the hardware and
the toolchain (or obeyed, when the user names one), with the reason; CUDA and HIP architectures."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.core import hardware as machine
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.builds.toolchain import INSTALL_HINTS, Toolchain, hint, is_msvc

BACKENDS = ("auto", "cpu", "cuda", "metal", "vulkan", "hip")


# Compute capability -> CMAKE_CUDA_ARCHITECTURES entry; Blackwell consumer parts need the
# arch-specific variant. Everything else is major*10+minor.
_CUDA_ARCH_OVERRIDES = {"12.0": "120a"}


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    cmake_flags: tuple[str, ...]
    reason: str
    explicit: bool = False  # the user named it (--backend, BONSAI_BACKEND): a failure stops, no CPU fallback


def cuda_archs_from_gpus(capabilities: list[str]) -> list[str]:
    archs = []
    for cc in capabilities:
        arch = _CUDA_ARCH_OVERRIDES.get(cc) or cc.replace(".", "")
        if arch not in archs:
            archs.append(arch)
    return archs


def _parse_arch_list(text: str, option: str) -> list[str]:
    items = [a.strip() for a in re.split(r"[,;\s]+", text) if a.strip()]
    for a in items:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", a):
            raise BonsaiError(f"{option} {text!r}: {a!r} is not an architecture", f"e.g. {option} 90 or {option} 86,89")
    return items


def _hip_targets() -> list[str]:
    for tool in ("amdgpu-arch", "/opt/rocm/llvm/bin/amdgpu-arch", "rocm_agent_enumerator"):
        exe = shutil.which(tool) or (tool if Path(tool).is_file() else None)
        if not exe:
            continue
        try:
            out = subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        targets = sorted({t for t in out.split() if t.startswith("gfx") and t != "gfx000"})
        if targets:
            return targets
    return []


def vulkan_sdk_present(tools: Toolchain) -> bool:
    if not tools.glslc.found:
        return False
    sdk = os.environ.get("VULKAN_SDK", "").strip()
    # Windows and macOS have no system headers: only the SDK (VULKAN_SDK/Include) brings them.
    return bool(sdk) or Path("/usr/include/vulkan/vulkan.h").is_file()


def cuda_compiler_present(tools: Toolchain) -> bool:
    """nvcc on this machine or in NVIDIA's wheels (a file check; preflight.py checks the rest)."""
    from bonsai_launch.llamacpp.builds import cuda_toolkit

    return tools.nvcc.found or cuda_toolkit.wheel_toolkit(cuda_toolkit.wheel_roots()).nvcc is not None


def _why_cpu(hardware, tools: Toolchain) -> str:
    """Why auto picked the CPU, naming what was found (a found nvcc is not 'no toolchain')."""
    if hardware.gpus and not cuda_compiler_present(tools):
        return "NVIDIA GPU found but no CUDA toolkit (pip install 'bonsai-launch[cuda]' brings one)"
    if tools.nvcc.found:
        return "nvcc found but no NVIDIA GPU (pass --cuda-archs to build for one anyway)"
    if tools.hipconfig.found:
        return "ROCm found but no AMD GPU"
    if vulkan_sdk_present(tools):
        return "the Vulkan SDK found but no Vulkan GPU (a software device is not one; --backend vulkan builds anyway)"
    return "no GPU toolchain found"


def choose_backend(
    requested: str, hardware, tools: Toolchain, *, cuda_archs: str | None = None, gpu_targets: str | None = None
) -> BackendChoice:
    """The backend to build and its cmake flags; refuses a backend whose toolchain is missing."""
    requested = (requested or "auto").lower()
    if requested not in BACKENDS:
        raise BonsaiError(f"--backend {requested!r} is not known", "allowed: " + ", ".join(BACKENDS))
    gpu_ccs = [g.compute_capability for g in hardware.gpus if g.compute_capability]
    system = hardware.os
    macos_arm = system == "Darwin" and hardware.arch in ("arm64", "aarch64")
    # llama.cpp builds Metal on every Mac unless told not to: say so for every other backend.
    no_metal = ("-DGGML_METAL=OFF",) if system == "Darwin" else ()

    explicit = requested != "auto"
    if requested == "auto":
        if (gpu_ccs or cuda_archs) and cuda_compiler_present(tools):
            requested, why = (
                "cuda",
                f"an NVIDIA GPU ({hardware.gpus[0].name if hardware.gpus else 'given by --cuda-archs'}) and a CUDA toolkit found",
            )
        elif macos_arm:
            requested, why = "metal", "macOS on Apple Silicon"
        elif system == "Linux" and tools.hipconfig.found and (gpu_targets or _hip_targets()):
            requested, why = "hip", "ROCm and an AMD GPU found"
        elif vulkan_sdk_present(tools) and (vulkan_gpus := machine.vulkan_devices(system).gpus):
            requested, why = "vulkan", f"the Vulkan SDK and a Vulkan GPU ({vulkan_gpus[0].name}) found"
        else:
            requested, why = "cpu", _why_cpu(hardware, tools)
    else:
        why = "--backend " + requested

    if requested == "cpu":
        return BackendChoice("cpu", no_metal, why, explicit)
    if requested == "metal":
        if not macos_arm:
            raise BonsaiError("--backend metal needs macOS on Apple Silicon", hint("metal", system))
        return BackendChoice("metal", ("-DGGML_METAL=ON",), why, explicit)
    if requested == "cuda":
        if not cuda_compiler_present(tools):
            raise BonsaiError("--backend cuda needs the CUDA toolkit, but nvcc was not found", hint("cuda", system))
        if system == "Windows" and tools.cxx.found and not is_msvc(tools.cxx.path):
            raise BonsaiError(
                f"--backend cuda on Windows needs MSVC, but the compiler is {tools.cxx.path}", hint("msvc_cuda", system)
            )
        if cuda_archs:
            archs = _parse_arch_list(cuda_archs, "--cuda-archs")
        elif gpu_ccs:
            archs = cuda_archs_from_gpus(gpu_ccs)
        else:
            raise BonsaiError(
                "--backend cuda: no NVIDIA GPU is visible to read the architecture from",
                "pass --cuda-archs, e.g. 90 (H100/H200), 89 (Ada), 86 or 80 (Ampere), 120a (Blackwell)",
            )
        # The compiler and library flags come from the preflight (preflight.py), which finds the toolkit.
        flags = ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(archs)]
        return BackendChoice("cuda", tuple(flags), why + f" (architectures {','.join(archs)})", explicit)
    if requested == "vulkan":
        if not vulkan_sdk_present(tools):
            raise BonsaiError(
                "--backend vulkan needs the Vulkan SDK (glslc and the Vulkan headers), which was not found",
                hint("vulkan", system),
            )
        return BackendChoice("vulkan", ("-DGGML_VULKAN=ON", *no_metal), why, explicit)
    # hip
    if system != "Linux":
        raise BonsaiError(f"--backend hip is not supported on {system}", hint("hip", system))
    if not tools.hipconfig.found:
        raise BonsaiError("--backend hip needs ROCm, but hipconfig was not found", INSTALL_HINTS["hip"])
    targets = _parse_arch_list(gpu_targets, "--gpu-targets") if gpu_targets else _hip_targets()
    if not targets:
        raise BonsaiError(
            "--backend hip: no AMD GPU is visible to read the target from",
            "pass --gpu-targets, e.g. gfx1100 (RX 7900) or gfx942 (MI300)",
        )
    return BackendChoice("hip", ("-DGGML_HIP=ON", "-DGPU_TARGETS=" + ";".join(targets)), why, explicit)
