"""What this machine can compile with: compilers, cmake, ninja, CUDA, Vulkan, MSVC, Xcode, and the hints that install them.

cmake and ninja come from their PyPI packages (dependencies of bonsai), so a machine with
just a C/C++ compiler can build. The backend is chosen from what is installed and visible:
CUDA needs nvcc and an NVIDIA GPU (or an explicit architecture list), Metal needs macOS on
Apple Silicon, Vulkan its SDK, HIP hipconfig. Asking for a backend whose toolchain is
missing fails at once with the exact thing to install, for the system at hand:

- Windows: MSVC with Ninja. cl.exe is used from a developer prompt when one is open;
  otherwise vswhere finds Visual Studio (or its Build Tools) and the build runs inside
  the environment of its vcvars64.bat, so no developer prompt is needed. CUDA (nvcc.exe,
  CUDA_PATH) and Vulkan (VULKAN_SDK) build with MSVC too; HIP is built on Linux only.
- macOS: the Xcode command line tools (`xcode-select -p`; without them /usr/bin/cc is
  only a stub that offers to install them). Metal needs nothing more: llama.cpp embeds its
  shader source and compiles it at run time. llama.cpp turns Metal on by default on every
  Mac, so a CPU build there passes -DGGML_METAL=OFF.
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
from typing import Any

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import exe_name

INSTALL_HINTS: dict[str, Any] = {  # Linux wording; hint() picks the one for another system
    "compiler": {
        "Linux": "install a C/C++ compiler: `sudo apt install build-essential` (Debian/Ubuntu) or "
        "`sudo dnf install gcc-c++` (Fedora)",
        "Darwin": "install the Xcode command line tools: `xcode-select --install`",
    },
    "cuda": "pip install 'bonsai-launch[cuda]' (NVIDIA's toolkit wheels, no system install), or install the "
    "CUDA toolkit so that `nvcc` is on PATH: `sudo apt install nvidia-cuda-toolkit` "
    "(Debian/Ubuntu) or NVIDIA's installer from https://developer.nvidia.com/cuda-downloads; "
    "if it is installed, add its bin folder (usually /usr/local/cuda/bin) to PATH",
    "vulkan": "install the Vulkan SDK: `sudo apt install libvulkan-dev glslc spirv-headers` (Debian/Ubuntu) or "
    "https://vulkan.lunarg.com/sdk/home (then set VULKAN_SDK)",
    "hip": "install ROCm, which provides hipconfig and hipcc: "
    "https://rocm.docs.amd.com/projects/install-on-linux/ (then add /opt/rocm/bin to PATH)",
    "metal": "Metal builds need macOS on Apple Silicon; use --backend cpu or vulkan here",
    "ccache": "optional, makes rebuilds take seconds: `sudo apt install ccache` or `brew install ccache`",
}

# Where another system needs other words (platform.system() names).
SYSTEM_HINTS = {
    "Windows": {
        "compiler": 'install Visual Studio 2022 Build Tools with the "Desktop development with C++" workload '
        '(`winget install Microsoft.VisualStudio.2022.BuildTools --override "--add '
        'Microsoft.VisualStudio.Workload.VCTools --includeRecommended"`); bonsai finds it with vswhere, '
        "no developer prompt needed",
        "cuda": "install the CUDA toolkit from https://developer.nvidia.com/cuda-downloads after Visual Studio "
        "(so it adds its MSVC integration); it sets CUDA_PATH. Open a new terminal afterwards",
        "vulkan": "install the Vulkan SDK from https://vulkan.lunarg.com/sdk/home (it sets VULKAN_SDK); "
        "open a new terminal afterwards",
        "hip": "bonsai builds HIP (ROCm) on Linux only; on Windows use --backend vulkan for AMD GPUs",
        "metal": "Metal builds need macOS on Apple Silicon; use --backend cuda, vulkan or cpu here",
        "ccache": "optional, makes rebuilds take seconds: `winget install Ccache.Ccache` or `choco install ccache`",
        "msvc_cuda": "CUDA on Windows compiles with MSVC (cl.exe): install Visual Studio Build Tools with the "
        '"Desktop development with C++" workload',
    },
    "Darwin": {
        "cuda": "CUDA does not exist on macOS; Apple Silicon builds --backend metal",
        "vulkan": "install the Vulkan SDK (MoltenVK) from https://vulkan.lunarg.com/sdk/home and set VULKAN_SDK, "
        "or use --backend metal on Apple Silicon",
        "hip": "bonsai builds HIP (ROCm) on Linux only",
        "metal": "Metal builds need Apple Silicon; this Intel Mac builds --backend cpu",
        "ccache": "optional, makes rebuilds take seconds: `brew install ccache`",
    },
}


def hint(topic: str, system: str | None = None) -> str:
    """The install hint for `topic` ("compiler", "cuda", "vulkan", ...) on `system`."""
    system = system or platform.system()
    special = SYSTEM_HINTS.get(system, {}).get(topic)
    if special:
        return special
    if topic == "compiler":
        return INSTALL_HINTS["compiler"].get(system, INSTALL_HINTS["compiler"]["Linux"])
    return INSTALL_HINTS[topic]


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
    # System-specific, found only there: Visual Studio's vcvars64.bat when cl.exe is not on
    # PATH (Windows), the Xcode command line tools folder (macOS).
    vcvars: Tool = Tool("vcvars64.bat", None)
    xcode_clt: Tool = Tool("xcode-select", None)

    def to_json(self) -> dict:
        system_only = ("vcvars", "xcode_clt")
        return {k: asdict(v) for k, v in self.__dict__.items() if k not in system_only or v.found}


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
    nvcc = exe_name("nvcc")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", nvcc).is_file():
            return str(Path(home, "bin", nvcc))
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
    glslc = exe_name("glslc")
    for folder in ("bin", "Bin"):  # the Windows SDK says Bin
        if sdk and Path(sdk, folder, glslc).is_file():
            return str(Path(sdk, folder, glslc))
    return shutil.which("glslc")


# -- Windows: MSVC -------------------------------------------------------------------------------


def _vswhere() -> Path | None:
    base = os.environ.get("ProgramFiles(x86)") or os.environ.get("ProgramFiles") or r"C:\Program Files (x86)"  # noqa: SIM112 - Windows spells them so
    path = Path(base, "Microsoft Visual Studio", "Installer", "vswhere.exe")
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def find_vcvars(run=subprocess.run) -> str | None:
    """vcvars64.bat of the newest Visual Studio (or Build Tools) with the C++ x64 tools."""
    vswhere = _vswhere()
    if vswhere is None:
        return None
    try:
        done = run(
            [
                str(vswhere),
                "-latest",
                "-products",
                "*",
                "-requires",
                "Microsoft.VisualStudio.Component.VC.Tools.x86.x64",
                "-property",
                "installationPath",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    install = (done.stdout or "").strip().splitlines()
    if not install:
        return None
    vcvars = Path(install[0].strip(), "VC", "Auxiliary", "Build", "vcvars64.bat")
    return str(vcvars) if vcvars.is_file() else None


def msvc_cl_from_vcvars(vcvars: str) -> str | None:
    """The newest Hostx64/x64 cl.exe beside vcvars64.bat (for the build key), without running it."""
    tools = Path(vcvars).parents[2] / "Tools" / "MSVC"
    found = sorted(
        tools.glob("*/bin/Hostx64/x64/cl.exe"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parts[-5].split(".")],
    )
    return str(found[-1]) if found else None


def msvc_environment(vcvars: str, run=subprocess.run) -> dict[str, str]:
    """The environment vcvars64.bat makes (PATH, INCLUDE, LIB, ...), read back from `set`.

    This one command is a cmd.exe line, not an argv list: cmd is the only thing that can
    run a .bat and report the environment it leaves behind.
    """
    line = f'cmd.exe /d /s /c ""{vcvars}" >nul 2>&1 && set"'
    try:
        done = run(line, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BonsaiError(f"running {vcvars} failed ({exc})", hint("compiler", "Windows")) from None
    if done.returncode != 0:
        raise BonsaiError(f"{vcvars} failed (exit {done.returncode})", hint("compiler", "Windows"))
    env = {}
    for entry in (done.stdout or "").splitlines():
        name, sep, value = entry.partition("=")
        if sep and name:
            env[name] = value
    if "INCLUDE" not in {k.upper() for k in env}:
        raise BonsaiError(f"{vcvars} did not set up a compiler environment (no INCLUDE)", hint("compiler", "Windows"))
    # Say which compiler to use: CMake would otherwise take the first it finds on PATH.
    env["CC"] = env["CXX"] = "cl"
    return env


def is_msvc(compiler: str | None) -> bool:
    return bool(compiler) and Path(str(compiler)).name.lower() in ("cl", "cl.exe", "clang-cl", "clang-cl.exe")


# -- macOS: Xcode command line tools ---------------------------------------------------------------


def find_xcode_clt(run=subprocess.run) -> str | None:
    """The developer folder `xcode-select -p` prints, or None when the tools are not installed."""
    try:
        done = run(["xcode-select", "-p"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = (done.stdout or "").strip()
    return path if done.returncode == 0 and path else None


def detect(versions: bool = True, system: str | None = None) -> Toolchain:
    """Every tool the build may use. `versions=False` skips running them (fast path).
    `system` (a platform.system() name) is for tests of another system's branch."""
    system = system or platform.system()
    vcvars = xcode = None
    if system == "Windows":
        # MSVC first: $CC/$CXX, a developer prompt's cl, then Visual Studio found by vswhere
        # (a gcc that another program put on PATH must not win over an installed MSVC);
        # MinGW's gcc or clang only when there is no Visual Studio at all.
        cc = _which_env("CC", "cl", "clang-cl")
        cxx = _which_env("CXX", "cl", "clang-cl")
        if cxx is None:
            vcvars = find_vcvars()
            cc = cxx = msvc_cl_from_vcvars(vcvars) if vcvars else None
        if cxx is None:
            cc, cxx = shutil.which("gcc") or shutil.which("clang"), shutil.which("g++") or shutil.which("clang++")
    else:
        cc = _which_env("CC", "cc", "gcc", "clang")
        cxx = _which_env("CXX", "c++", "g++", "clang++")
        if system == "Darwin":
            xcode = find_xcode_clt()
            if xcode is None and not (os.environ.get("CC") or os.environ.get("CXX")):
                cc = cxx = None  # /usr/bin/cc without the tools is a stub that cannot compile
    cm, nj = cmake_exe(), ninja_exe()
    ccache = shutil.which("ccache")
    nvcc = find_nvcc()
    hip = shutil.which("hipconfig") or (
        str(Path("/opt/rocm/bin/hipconfig")) if Path("/opt/rocm/bin/hipconfig").is_file() else None
    )
    glslc = find_glslc()
    git = shutil.which("git")

    def v(path, argv_tail=("--version",)):
        return _first_line([str(path), *argv_tail]) if (versions and path) else None

    return Toolchain(
        cc=Tool("cc", cc, v(cc) if not is_msvc(cc) else None),
        cxx=Tool("c++", cxx, compiler_id(cxx) if (versions and cxx) else None),
        cmake=Tool("cmake", str(cm) if cm else None, v(cm)),
        ninja=Tool("ninja", str(nj) if nj else None, v(nj)),
        ccache=Tool("ccache", ccache, v(ccache)),
        nvcc=Tool("nvcc", nvcc, nvcc_version(nvcc) if (versions and nvcc) else None),
        hipconfig=Tool("hipconfig", hip, v(hip, ("--version",))),
        glslc=Tool("glslc", glslc, v(glslc)),
        git=Tool("git", git, v(git)),
        vcvars=Tool("vcvars64.bat", vcvars),
        xcode_clt=Tool("xcode-select", xcode),
    )


@functools.lru_cache(maxsize=8)
def compiler_id(cxx: str) -> str | None:
    """`c++ --version`'s first line: part of the build key (a new compiler means a new build).
    MSVC's cl.exe has no --version: run bare, its banner ("Microsoft (R) C/C++ Optimizing
    Compiler Version 19.x for x64") is the first line it prints."""
    if Path(cxx).name.lower() in ("cl", "cl.exe"):
        try:  # the banner is on stderr; stdout has only "usage: cl [ option... ] filename..."
            done = subprocess.run([cxx], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = (done.stderr or "").strip().splitlines()
        return lines[0].strip() if lines else None
    return _first_line([cxx, "--version"])


def compiler_hint(system: str | None = None) -> str:
    return hint("compiler", system)
