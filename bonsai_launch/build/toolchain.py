"""What this machine can compile with, and which llama.cpp backend to build.

cmake and ninja come from their PyPI packages (dependencies of bonsai), so a machine with
just a C/C++ compiler can build. The backend is chosen from what is installed and visible:
CUDA needs nvcc and an NVIDIA GPU (or an explicit architecture list), Metal needs macOS on
Apple Silicon, Vulkan its SDK, HIP hipconfig. Asking for a backend whose toolchain is
missing fails at once with the exact thing to install.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bonsai_launch.errors import BonsaiError

BACKENDS = ("auto", "cpu", "cuda", "metal", "vulkan", "hip")

INSTALL_HINTS = {
    "compiler": {
        "Linux": "install a C/C++ compiler: `sudo apt install build-essential` (Debian/Ubuntu) or "
                 "`sudo dnf install gcc-c++` (Fedora)",
        "Darwin": "install the Xcode command line tools: `xcode-select --install`",
        "Windows": "install Visual Studio Build Tools with the \"Desktop development with C++\" workload",
    },
    "cuda": "install the CUDA toolkit so that `nvcc` is on PATH: `sudo apt install nvidia-cuda-toolkit` "
            "(Debian/Ubuntu) or NVIDIA's installer from https://developer.nvidia.com/cuda-downloads; "
            "if it is installed, add its bin folder (usually /usr/local/cuda/bin) to PATH",
    "vulkan": "install the Vulkan SDK: `sudo apt install libvulkan-dev glslc` (Debian/Ubuntu) or "
              "https://vulkan.lunarg.com/sdk/home (then set VULKAN_SDK)",
    "hip": "install ROCm, which provides hipconfig and hipcc: "
           "https://rocm.docs.amd.com/projects/install-on-linux/ (then add /opt/rocm/bin to PATH)",
    "metal": "Metal builds need macOS on Apple Silicon; use --backend cpu or vulkan here",
    "ccache": "optional, makes rebuilds take seconds: `sudo apt install ccache` or `brew install ccache`",
}

# Compute capability -> CMAKE_CUDA_ARCHITECTURES entry; Blackwell consumer parts need the
# arch-specific variant. Everything else is major*10+minor.
_CUDA_ARCH_OVERRIDES = {"12.0": "120a"}


@dataclass(frozen=True)
class Tool:
    name: str
    path: str | None
    version: str | None = None

    @property
    def found(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class Toolchain:
    cc: Tool
    cxx: Tool
    cmake: Tool
    ninja: Tool
    ccache: Tool
    nvcc: Tool
    hipconfig: Tool
    glslc: Tool
    git: Tool

    def to_json(self) -> dict:
        return {k: asdict(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    cmake_flags: tuple[str, ...]
    reason: str


def _first_line(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0].strip() if text else None


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing it (importing `cmake` lists every
    file of its distribution, about 0.2 s, which the up-to-date path cannot afford)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def cmake_exe() -> Path | None:
    """The cmake binary of the PyPI package (not its wrapper script, not the system one)."""
    exe = "cmake.exe" if os.name == "nt" else "cmake"
    pkg = _package_dir("cmake")
    if pkg is not None and (pkg / "data" / "bin" / exe).is_file():
        return pkg / "data" / "bin" / exe
    try:
        import cmake

        path = Path(cmake.CMAKE_BIN_DIR) / exe
        if path.is_file():
            return path
    except (ImportError, AttributeError):
        pass
    return None


def ninja_exe() -> Path | None:
    """The ninja binary of the PyPI package (its BIN_DIR: the environment's scripts folder)."""
    exe = "ninja.exe" if os.name == "nt" else "ninja"
    try:
        import ninja

        path = Path(ninja.BIN_DIR) / exe
        if path.is_file():
            return path
    except (ImportError, AttributeError):
        pass
    path = Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin") / exe
    return path if path.is_file() else None


def _which_env(var: str, *names: str) -> str | None:
    value = os.environ.get(var, "").strip()
    if value:  # the user's choice, even when it is broken: then it is "not found"
        return shutil.which(value.split()[0])
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def find_nvcc() -> str | None:
    found = _which_env("CUDACXX", "nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").is_file():
            return str(Path(home, "bin", "nvcc"))
    return None


def nvcc_version(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release\s+([\d.]+)", out)
    return match.group(1) if match else None


def find_glslc() -> str | None:
    sdk = os.environ.get("VULKAN_SDK", "").strip()
    if sdk and Path(sdk, "bin", "glslc").is_file():
        return str(Path(sdk, "bin", "glslc"))
    return shutil.which("glslc")


def detect(versions: bool = True) -> Toolchain:
    """Every tool the build may use. `versions=False` skips running them (fast path)."""
    cc = _which_env("CC", "cc", "gcc", "clang")
    cxx = _which_env("CXX", "c++", "g++", "clang++")
    cm, nj = cmake_exe(), ninja_exe()
    ccache = shutil.which("ccache")
    nvcc = find_nvcc()
    hip = shutil.which("hipconfig") or (str(Path("/opt/rocm/bin/hipconfig")) if Path("/opt/rocm/bin/hipconfig").is_file() else None)
    glslc = find_glslc()
    git = shutil.which("git")

    def v(path, argv_tail=("--version",)):
        return _first_line([str(path), *argv_tail]) if (versions and path) else None

    return Toolchain(
        cc=Tool("cc", cc, v(cc)),
        cxx=Tool("c++", cxx, compiler_id(cxx) if (versions and cxx) else None),
        cmake=Tool("cmake", str(cm) if cm else None, v(cm)),
        ninja=Tool("ninja", str(nj) if nj else None, v(nj)),
        ccache=Tool("ccache", ccache, v(ccache)),
        nvcc=Tool("nvcc", nvcc, nvcc_version(nvcc) if (versions and nvcc) else None),
        hipconfig=Tool("hipconfig", hip, v(hip, ("--version",))),
        glslc=Tool("glslc", glslc, v(glslc)),
        git=Tool("git", git, v(git)),
    )


@functools.lru_cache(maxsize=8)
def compiler_id(cxx: str) -> str | None:
    """`c++ --version`'s first line: part of the build key (a new compiler means a new build)."""
    return _first_line([cxx, "--version"])


def compiler_hint() -> str:
    return INSTALL_HINTS["compiler"].get(platform.system(), INSTALL_HINTS["compiler"]["Linux"])


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
    return bool(sdk) or Path("/usr/include/vulkan/vulkan.h").is_file()


def _why_cpu(hardware, tools: Toolchain) -> str:
    """Why auto picked the CPU, naming what was found (a found nvcc is not 'no toolchain')."""
    if hardware.gpus and not tools.nvcc.found:
        return "NVIDIA GPU found but no nvcc (CUDA toolkit)"
    if tools.nvcc.found:
        return "nvcc found but no NVIDIA GPU (pass --cuda-archs to build for one anyway)"
    if tools.hipconfig.found:
        return "ROCm found but no AMD GPU"
    return "no GPU toolchain found"


def choose_backend(requested: str, hardware, tools: Toolchain, *, cuda_archs: str | None = None,
                   gpu_targets: str | None = None) -> BackendChoice:
    """The backend to build and its cmake flags; refuses a backend whose toolchain is missing."""
    requested = (requested or "auto").lower()
    if requested not in BACKENDS:
        raise BonsaiError(f"--backend {requested!r} is not known", "allowed: " + ", ".join(BACKENDS))
    gpu_ccs = [g.compute_capability for g in hardware.gpus if g.compute_capability]
    macos_arm = hardware.os == "Darwin" and hardware.arch in ("arm64", "aarch64")

    if requested == "auto":
        if tools.nvcc.found and (gpu_ccs or cuda_archs):
            requested, why = "cuda", "nvcc and an NVIDIA GPU found"
        elif macos_arm:
            requested, why = "metal", "macOS on Apple Silicon"
        elif tools.hipconfig.found and (gpu_targets or _hip_targets()):
            requested, why = "hip", "ROCm and an AMD GPU found"
        elif vulkan_sdk_present(tools):
            requested, why = "vulkan", "the Vulkan SDK found"
        else:
            requested, why = "cpu", _why_cpu(hardware, tools)
    else:
        why = "--backend " + requested

    if requested == "cpu":
        return BackendChoice("cpu", (), why)
    if requested == "metal":
        if not macos_arm:
            raise BonsaiError("--backend metal needs macOS on Apple Silicon", INSTALL_HINTS["metal"])
        return BackendChoice("metal", ("-DGGML_METAL=ON",), why)
    if requested == "cuda":
        if not tools.nvcc.found:
            raise BonsaiError("--backend cuda needs the CUDA toolkit, but nvcc was not found", INSTALL_HINTS["cuda"])
        if cuda_archs:
            archs = _parse_arch_list(cuda_archs, "--cuda-archs")
        elif gpu_ccs:
            archs = cuda_archs_from_gpus(gpu_ccs)
        else:
            raise BonsaiError("--backend cuda: no NVIDIA GPU is visible to read the architecture from",
                              "pass --cuda-archs, e.g. 90 (H100/H200), 89 (Ada), 86 or 80 (Ampere), 120a (Blackwell)")
        flags = ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(archs)]
        if not shutil.which("nvcc"):
            flags.append("-DCMAKE_CUDA_COMPILER=" + str(tools.nvcc.path))
        return BackendChoice("cuda", tuple(flags), why + f" (architectures {','.join(archs)})")
    if requested == "vulkan":
        if not vulkan_sdk_present(tools):
            raise BonsaiError("--backend vulkan needs the Vulkan SDK (glslc and the Vulkan headers), which was not found",
                              INSTALL_HINTS["vulkan"])
        return BackendChoice("vulkan", ("-DGGML_VULKAN=ON",), why)
    # hip
    if not tools.hipconfig.found:
        raise BonsaiError("--backend hip needs ROCm, but hipconfig was not found", INSTALL_HINTS["hip"])
    targets = _parse_arch_list(gpu_targets, "--gpu-targets") if gpu_targets else _hip_targets()
    if not targets:
        raise BonsaiError("--backend hip: no AMD GPU is visible to read the target from",
                          "pass --gpu-targets, e.g. gfx1100 (RX 7900) or gfx942 (MI300)")
    return BackendChoice("hip", ("-DGGML_HIP=ON", "-DGPU_TARGETS=" + ";".join(targets)), why)
