"""Before any download or configure: can this machine build the chosen GPU backend? In seconds.

Each check names the one thing missing and the command that fixes it, so a half-installed
toolkit is refused here instead of minutes later inside cmake (a partial CUDA toolkit, nvcc and
cudart without cuBLAS, used to pass bonsai's checks and fail in cmake's generate step with
`CUDA::cublas ... not found`).

- CUDA: nvcc and its version, the runtime, cuBLAS and CCCL headers and libraries (a system
  toolkit, or NVIDIA's PyPI wheels: cuda_toolkit.py), and whether nvcc accepts the host C++
  compiler (a preprocessing run of a one-line .cu file: nvcc checks the host compiler's version
  there). The CMake flags that point at the toolkit come back with the result.
- Vulkan: glslc, the headers, SPIRV-Headers' CMake package (ggml-vulkan requires it and neither
  libvulkan-dev nor glslc brings it), the loader library. Any 1.3 headers do: the pin's use of
  VK_EXT_layer_settings, which Debian 12's 1.3.239 headers lack, is guarded by patch 0007.
- HIP: ROCm 6.1 or newer with hipBLAS and rocBLAS.
- Metal: nothing beyond the compiler (checked for every build) and macOS on Apple Silicon
  (backend.py): llama.cpp compiles its shaders at run time.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.builds import cuda_toolkit
from bonsai_launch.llamacpp.builds.toolchain import Toolchain, nvcc_version

CUDA_EXTRA_HINT = (
    "pip install 'bonsai-launch[cuda]': NVIDIA's CUDA toolkit wheels (about 1.1 GB installed), which bonsai "
    "uses when no complete system toolkit is found"
)
MIN_CUDA = (11, 7)
VULKAN_APT = "`sudo apt install libvulkan-dev glslc spirv-headers` (Debian/Ubuntu), or the LunarG Vulkan SDK"
MIN_ROCM = (6, 1)


class PreflightFailed(BonsaiError):
    """A GPU backend cannot be built here; nothing was downloaded or configured (exit 1)."""

    def __init__(self, backend: str, message: str, fix: str) -> None:
        super().__init__(f"--backend {backend}: {message}", fix, exit_code=1)
        self.backend = backend


@dataclass(frozen=True)
class Preflight:
    """What the checks found: flags that point cmake at the toolchain, notes for the user."""

    backend: str
    cmake_flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:2])


# -- CUDA ---------------------------------------------------------------------------------------


def host_compiler_check(nvcc: Path, cxx: str | None, extra_flags: list[str], run=subprocess.run) -> str | None:
    """None when nvcc accepts the host compiler, else the line nvcc printed. Preprocessing a
    one-line file is enough: nvcc checks the host compiler's version in host_config.h."""
    host = os.environ.get("CUDAHOSTCXX", "").strip() or cxx
    with tempfile.TemporaryDirectory(prefix="bonsai-preflight-") as tmp:
        src = Path(tmp, "probe.cu")
        src.write_text("#include <cuda_runtime.h>\n__global__ void k(void) {}\n")
        argv = [str(nvcc), *(["-ccbin", host] if host else []), *extra_flags, "-E", "-x", "cu", str(src)]
        argv += ["-o", os.devnull]
        try:
            done = run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{nvcc} could not be run ({exc})"
    if done.returncode == 0:
        return None
    lines = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
    wanted = [ln for ln in lines if "error" in ln.lower()] or lines or [f"exit {done.returncode}"]
    return wanted[0]


def check_cuda(tools: Toolchain, *, toolkit: cuda_toolkit.CudaToolkit | None = None, run=subprocess.run) -> Preflight:
    kit = toolkit or cuda_toolkit.find_toolkit(tools.nvcc.path)
    missing = kit.missing()
    if kit.nvcc is None:
        raise PreflightFailed("cuda", "needs the CUDA toolkit, but nvcc was not found", CUDA_EXTRA_HINT)
    if missing:
        have = [p for p, v in (("nvcc", kit.nvcc), ("cudart", kit.cudart)) if v]
        where = f"of {kit.nvcc}" if kit.origin == "system" else f"in NVIDIA's wheels ({kit.nvcc.parent.parent})"
        raise PreflightFailed(
            "cuda",
            f"the CUDA toolkit {where} ({' and '.join(have)} found) lacks {', '.join(missing)}",
            CUDA_EXTRA_HINT + "; or install the missing parts, e.g. `sudo apt install nvidia-cuda-toolkit`",
        )
    version = nvcc_version(str(kit.nvcc))
    if version is None:
        raise PreflightFailed("cuda", f"{kit.nvcc} --version does not say its release", "reinstall the CUDA toolkit")
    if _version_tuple(version) < MIN_CUDA:
        raise PreflightFailed(
            "cuda", f"nvcc {version} is older than the {'.'.join(map(str, MIN_CUDA))} llama.cpp needs", CUDA_EXTRA_HINT
        )
    includes = [f"-isystem{p}" for p in kit.extra_includes]
    problem = host_compiler_check(kit.nvcc, tools.cxx.path, includes, run=run)
    if problem is not None:
        raise PreflightFailed(
            "cuda",
            f"nvcc {version} cannot compile with the host compiler {tools.cxx.path}: {problem}",
            "install a gcc/g++ this CUDA release supports and set CUDAHOSTCXX to it (CMake honours it)",
        )
    notes = []
    if kit.origin != "system":
        notes.append(f"CUDA {version} from NVIDIA's PyPI wheels ({kit.nvcc.parent.parent})")
    if kit.driver is None:
        notes.append("no NVIDIA driver library (libcuda) here: built without the VMM memory pool (GGML_CUDA_NO_VMM)")
    return Preflight("cuda", tuple(kit.cmake_flags()), tuple(notes), {"nvcc_version": version, **kit.to_json()})


# -- Vulkan -------------------------------------------------------------------------------------


def _vulkan_roots(system_root: Path | None) -> list[Path]:
    system_root = system_root or cuda_toolkit.SYSTEM_ROOT
    sdk = os.environ.get("VULKAN_SDK", "").strip()
    roots = [Path(sdk)] if sdk else []
    return roots + [system_root / "usr", system_root / "usr/local"]


def vulkan_headers(system_root: Path | None = None) -> tuple[Path | None, int | None]:
    """(vulkan_core.h, VK_HEADER_VERSION) of the headers CMake would use."""
    for root in _vulkan_roots(system_root):
        for inc in ("include", "Include"):  # the Windows SDK says Include
            header = root / inc / "vulkan" / "vulkan_core.h"
            if header.is_file():
                text = header.read_text(errors="replace")
                m = re.search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", text)
                return header, int(m.group(1)) if m else None
    return None, None


def check_vulkan(tools: Toolchain, *, system_root: Path | None = None) -> Preflight:
    if not tools.glslc.found:
        raise PreflightFailed("vulkan", "glslc (the shader compiler) was not found", VULKAN_APT)
    header, version = vulkan_headers(system_root)
    if header is None:
        raise PreflightFailed("vulkan", "the Vulkan headers (vulkan/vulkan_core.h) were not found", VULKAN_APT)
    roots = _vulkan_roots(system_root)
    spirv = cuda_toolkit.first_match(
        roots,
        [f"{d}/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake" for d in ("share", "lib", "lib/*-linux-gnu", "lib64")],
    )
    if spirv is None:
        raise PreflightFailed(
            "vulkan",
            "SPIRV-Headers (its CMake package, which ggml-vulkan requires) was not found",
            "`sudo apt install spirv-headers` (Debian/Ubuntu), or the LunarG Vulkan SDK",
        )
    loader = cuda_toolkit.first_match(
        roots, ["lib/*-linux-gnu/libvulkan.so", "lib64/libvulkan.so", "lib/libvulkan.so", "lib/libvulkan.dylib"]
    ) or cuda_toolkit.first_match(roots, ["Lib/vulkan-1.lib", "lib/vulkan-1.lib"])
    if loader is None:
        raise PreflightFailed("vulkan", "the Vulkan loader library (libvulkan.so) was not found", VULKAN_APT)
    from bonsai_launch.core import hardware

    seen = hardware.vulkan_devices()
    notes: tuple[str, ...] = ()
    if not seen.gpus:  # obeyed all the same (an explicit --backend vulkan); say what it will run on
        names = ", ".join(d.name for d in seen.devices) or "none"
        note = f"no Vulkan GPU here (devices: {names}): llama.cpp skips software devices such as lavapipe, "
        notes = (note + "so this build runs on the CPU unless GGML_VK_VISIBLE_DEVICES exposes one",)
    details = {"headers": str(header), "header_version": version, "loader": str(loader), "devices": seen.how}
    return Preflight("vulkan", notes=notes, details=details)


# -- HIP ----------------------------------------------------------------------------------------


def rocm_root(tools: Toolchain) -> Path:
    env = os.environ.get("ROCM_PATH", "").strip()
    if env:
        return Path(env)
    if tools.hipconfig.path:
        return Path(tools.hipconfig.path).resolve().parent.parent
    return Path("/opt/rocm")


def check_hip(tools: Toolchain, *, root: Path | None = None) -> Preflight:
    rocm = (
        "install ROCm 6.1 or newer with `hipblas-dev rocblas-dev`: https://rocm.docs.amd.com/projects/install-on-linux/"
    )
    if not tools.hipconfig.found:
        raise PreflightFailed("hip", "needs ROCm, but hipconfig was not found", rocm)
    root = root or rocm_root(tools)
    version_file = root / ".info" / "version"
    version = version_file.read_text().strip() if version_file.is_file() else None
    if version is not None and _version_tuple(version) < MIN_ROCM:
        raise PreflightFailed("hip", f"ROCm {version} at {root} is older than the 6.1 llama.cpp needs", rocm)
    for package in ("hip", "hipblas", "rocblas"):
        if cuda_toolkit.first_match(
            [root], [f"lib/cmake/{package}/{package}-config.cmake", f"lib*/cmake/{package}/*onfig.cmake"]
        ):
            continue
        raise PreflightFailed("hip", f"ROCm at {root} has no {package} CMake package", rocm)
    return Preflight("hip", details={"rocm": str(root), "version": version})


def check(backend: str, tools: Toolchain) -> Preflight:
    """The preflight of `backend` (cpu and metal need nothing more than the compiler)."""
    if backend == "cuda":
        return check_cuda(tools)
    if backend == "vulkan":
        return check_vulkan(tools)
    if backend == "hip":
        return check_hip(tools)
    return Preflight(backend)
