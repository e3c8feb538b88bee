"""Where the CUDA toolkit's parts are: a system toolkit, NVIDIA's PyPI wheels, or both.

Most machines with an NVIDIA card have the driver and no toolkit. NVIDIA publishes the compiler
and libraries as wheels (`pip install 'bonsai-launch[cuda]'`): the CUDA 13 wheels unpack into
one root, `site-packages/nvidia/cu13/` (bin/nvcc, include/ with cccl, lib/), and nvcc works in
place; older wheels use one root per package (nvidia/cuda_nvcc, nvidia/cublas, ...). CMake's
FindCUDAToolkit cannot find their libraries by itself: the wheels ship only versioned names
(`libcublas.so.13`) and no `libcuda.so` stub, so the build names each library
(`-DCUDA_cublas_LIBRARY=...`) and, where no driver library exists at all, builds without the
driver's virtual memory API (`-DGGML_CUDA_NO_VMM=ON`, which drops the libcuda link). Nothing
is copied or linked into site-packages. (Measured: shared/reference/gpu-builds.md.)

A partial system toolkit (nvcc and cudart, no cuBLAS) is found here and reported as missing
cuBLAS, so the build refuses it in seconds instead of failing in cmake's generate step.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from bonsai_launch.core.paths import exe_name

# The library files each part is recognised by (Linux, Windows import libraries).
_LIBS = {
    "cudart": ("libcudart.so", "libcudart.so.*", "cudart.lib"),
    "cublas": ("libcublas.so", "libcublas.so.*", "cublas.lib"),
    "cublasLt": ("libcublasLt.so", "libcublasLt.so.*", "cublasLt.lib"),
}
_DRIVER = ("libcuda.so", "libcuda.so.*", "nvcuda.dll")
# Where the system's folders are looked for, and the `nvidia` package folders (None: the ones
# importable here). Tests point both at fake trees so no machine's own toolkit leaks in.
SYSTEM_ROOT = Path("/")
WHEEL_LOCATIONS: list[str] | None = None


@dataclass(frozen=True)
class CudaToolkit:
    """The parts a ggml CUDA build needs, each with where it was found (None: not found)."""

    origin: str  # "system", "pypi", "system+pypi" (a system nvcc with cuBLAS from a wheel), or "none"
    nvcc: Path | None = None
    cudart_header: Path | None = None  # cuda_runtime.h
    cudart: Path | None = None
    cublas_header: Path | None = None  # cublas_v2.h
    cublas: Path | None = None
    cublasLt: Path | None = None
    cub: Path | None = None  # cub/cub.cuh (cccl): mean.cu, sum.cu and ssm-scan.cu include it
    driver: Path | None = None  # libcuda (the driver) or the toolkit's link stub
    extra_includes: tuple[Path, ...] = field(default=())  # wheel include folders outside nvcc's root

    def missing(self) -> list[str]:
        """What a build would miss, in words a user can search for."""
        parts = [
            ("nvcc", self.nvcc),
            ("the CUDA runtime (cuda_runtime.h, libcudart)", self.cudart_header and self.cudart),
            ("cuBLAS (cublas_v2.h, libcublas, libcublasLt)", self.cublas_header and self.cublas and self.cublasLt),
            ("CCCL (cub/cub.cuh)", self.cub),
        ]
        return [name for name, found in parts if not found]

    @property
    def complete(self) -> bool:
        return not self.missing()

    def cmake_flags(self) -> list[str]:
        """The configure flags that point CMake at these parts. A complete system toolkit needs
        none beyond the compiler; wheels need every library named (their files are versioned)."""
        if self.nvcc is None:
            return []
        flags = [f"-DCMAKE_CUDA_COMPILER={self.nvcc}"]
        if self.origin == "system":
            return flags
        if self.origin == "pypi" and self.cudart is not None:
            flags += [f"-DCUDA_CUDART={self.cudart}", f"-DCUDA_cudart_LIBRARY={self.cudart}"]
        flags += [f"-DCUDA_cublas_LIBRARY={self.cublas}", f"-DCUDA_cublasLt_LIBRARY={self.cublasLt}"]
        if self.driver is None:
            flags.append("-DGGML_CUDA_NO_VMM=ON")  # no libcuda anywhere: build without the VMM pool
        elif not self.driver.name.endswith((".so", ".dll")):
            flags.append(f"-DCUDA_cuda_driver_LIBRARY={self.driver}")  # only libcuda.so.1: name it
        if self.extra_includes:
            flags.append("-DCMAKE_CUDA_FLAGS=" + " ".join(f"-isystem {p}" for p in self.extra_includes))
        return flags

    def to_json(self) -> dict:
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items() if k != "extra_includes"}
        data["extra_includes"] = [str(p) for p in self.extra_includes]
        data["missing"] = self.missing()
        return data


def wheel_roots(locations: list[str] | None = None) -> list[Path]:
    """The folders NVIDIA's wheels installed into bonsai's environment: every child of the
    `nvidia` namespace package (nvidia/cu13, nvidia/cublas, ...), newest CUDA first."""
    locations = WHEEL_LOCATIONS if locations is None else locations
    if locations is None:
        try:
            spec = importlib.util.find_spec("nvidia")
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
    roots = [p for loc in locations for p in sorted(Path(loc).iterdir(), reverse=True) if p.is_dir()]
    return [p for p in roots if not p.name.startswith("__")]


def first_match(folders: list[Path], patterns: tuple[str, ...] | list[str]) -> Path | None:
    """The first file (sorted) matching any pattern, folder by folder."""
    for folder in folders:
        for pattern in patterns:
            found = sorted(glob.glob(str(folder / pattern)))
            if found:
                return Path(found[0])
    return None


def toolkit_roots(nvcc: Path, system_root: Path | None = None) -> list[Path]:
    """Where a system toolkit may live: above nvcc (resolved), CUDA_HOME/CUDA_PATH, /usr/local/cuda.
    nvcc on PATH is often a link or a one-line wrapper script (/usr/local/bin/nvcc exec'ing
    /usr/local/cuda-13.0/bin/nvcc), so the folder above it alone is not enough."""
    system_root = system_root or SYSTEM_ROOT
    roots = [nvcc.resolve().parent.parent]
    roots += [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT") if os.environ.get(v, "").strip()]
    roots.append(system_root / "usr/local/cuda")
    return list(dict.fromkeys(roots))


def _system_dirs(roots: list[Path], system_root: Path) -> tuple[list[Path], list[Path]]:
    """(include folders, library folders) of a system toolkit in `roots`, then the distribution's
    own folders (Debian's nvidia-cuda-toolkit puts nvcc in /usr/bin, headers in /usr/include)."""
    inc: list[Path] = []
    lib: list[Path] = []
    for root in roots:
        inc += [root / "include", *sorted(root.glob("targets/*/include"))]
        lib += [root / "lib64", root / "lib", root / "lib" / "x64", *sorted(root.glob("targets/*/lib"))]
    inc += [system_root / "usr/include"]
    lib += [
        *sorted(Path(p) for p in glob.glob(str(system_root / "usr/lib/*-linux-gnu"))),
        system_root / "usr/lib64",
        system_root / "usr/lib",
    ]
    return inc, lib


def find_driver(system_root: Path | None = None, stub_dirs: list[Path] | None = None) -> Path | None:
    """The driver library (libcuda) the build can link, or a toolkit's link stub; None where
    neither exists (a machine with no NVIDIA driver: build with GGML_CUDA_NO_VMM)."""
    system_root = system_root or SYSTEM_ROOT
    if platform.system() == "Windows":
        dll = Path(os.environ.get("SYSTEMROOT", r"C:\Windows"), "System32", "nvcuda.dll")
        return dll if dll.is_file() else None
    folders = [
        *sorted(Path(p) for p in glob.glob(str(system_root / "usr/lib/*-linux-gnu"))),
        system_root / "usr/lib64",
        system_root / "usr/lib/wsl/lib",
        system_root / "usr/lib",
        *(stub_dirs or []),
    ]
    return first_match(folders, _DRIVER[:2])


def _from_root(root: Path) -> dict[str, Path | None]:
    """What one wheel root (or a wheel-like toolkit folder) holds."""
    inc, lib = [root / "include", root / "include" / "cccl"], [root / "lib", root / "lib64"]
    nvcc = root / "bin" / exe_name("nvcc")
    return {
        "nvcc": nvcc if nvcc.is_file() else None,
        "cudart_header": first_match(inc, ("cuda_runtime.h",)),
        "cudart": first_match(lib, _LIBS["cudart"]),
        "cublas_header": first_match(inc, ("cublas_v2.h",)),
        "cublas": first_match(lib, _LIBS["cublas"]),
        "cublasLt": first_match(lib, _LIBS["cublasLt"]),
        "cub": first_match(inc, ("cub/cub.cuh",)),
    }


def system_toolkit(nvcc: str | None, system_root: Path | None = None) -> CudaToolkit:
    """The toolkit around a system nvcc (PATH, CUDACXX, CUDA_HOME, /usr/local/cuda)."""
    if not nvcc:
        return CudaToolkit("none")
    system_root = system_root or SYSTEM_ROOT
    roots = toolkit_roots(Path(nvcc), system_root)
    inc, lib = _system_dirs(roots, system_root)
    stubs = [s for r in roots for s in (r / "lib64/stubs", r / "lib/stubs", *sorted(r.glob("targets/*/lib/stubs")))]
    return CudaToolkit(
        "system",
        nvcc=Path(nvcc),
        cudart_header=first_match(inc, ("cuda_runtime.h",)),
        cudart=first_match(lib, _LIBS["cudart"]),
        cublas_header=first_match(inc, ("cublas_v2.h",)),
        cublas=first_match(lib, _LIBS["cublas"]),
        cublasLt=first_match(lib, _LIBS["cublasLt"]),
        cub=first_match(inc + [p / "cccl" for p in inc], ("cub/cub.cuh",)),
        driver=find_driver(system_root, stubs),
    )


def wheel_toolkit(roots: list[Path], system_root: Path | None = None) -> CudaToolkit:
    """The toolkit NVIDIA's wheels make together: nvcc from the root that has it, each other part
    from the first root that has it; headers outside nvcc's root become -isystem folders."""
    if not roots:
        return CudaToolkit("none")
    found: dict[str, Path] = {}
    where: dict[str, Path] = {}
    for root in roots:
        for part, path in _from_root(root).items():
            if part not in found and path is not None:
                found[part], where[part] = path, root
    extra: list[Path] = []
    for part, up in (("cudart_header", 1), ("cublas_header", 1), ("cub", 2)):  # cub/cub.cuh: two up
        if part in found and where[part] != where.get("nvcc"):
            folder = found[part].parents[up - 1]
            if folder not in extra:
                extra.append(folder)
    return CudaToolkit("pypi", **found, driver=find_driver(system_root), extra_includes=tuple(extra))


def find_toolkit(
    nvcc: str | None, *, locations: list[str] | None = None, system_root: Path | None = None
) -> CudaToolkit:
    """The toolkit a CUDA build uses: a complete system toolkit first; else NVIDIA's wheels when
    they are complete; else a system nvcc with cuBLAS from a wheel; else the system's (or the
    wheels') incomplete parts, whose `missing()` the preflight reports."""
    system = system_toolkit(nvcc, system_root)
    if system.complete:
        return system
    wheels = wheel_toolkit(wheel_roots(locations), system_root)
    if wheels.complete:
        return wheels
    if system.nvcc is not None and wheels.cublas_header and wheels.cublas and wheels.cublasLt:
        return CudaToolkit(
            "system+pypi",
            nvcc=system.nvcc,
            cudart_header=system.cudart_header,
            cudart=system.cudart,
            cublas_header=wheels.cublas_header,
            cublas=wheels.cublas,
            cublasLt=wheels.cublasLt,
            cub=system.cub or wheels.cub,
            driver=system.driver,
            extra_includes=(wheels.cublas_header.parent,),
        )
    return system if system.nvcc is not None or wheels.nvcc is None else wheels
