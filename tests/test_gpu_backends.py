"""GPU backends without a GPU: the preflight on fake toolchain folders, CUDA from a fake layout of
NVIDIA's wheels, auto falling back to the CPU build when its GPU build fails, BONSAI_BACKEND, and
the probe cache noticing a GPU that appears. Nothing here compiles a GPU backend: the builds are
the tiny fake llama.cpp of build_helpers (three C programs), the failures are injected."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.hardware import Hardware
from bonsai_launch.core.paths import builds_dir
from bonsai_launch.llamacpp.builds import (
    BuildRequest,
    backend,
    build,
    builder,
    cuda_toolkit,
    fallback,
    lookup,
    preflight,
    toolchain,
)
from bonsai_launch.llamacpp.builds import cmake as cmake_build
from build_helpers import fake_tree, file_index, make_sdist, use_index, use_pin, write_pin

FAKE_NVCC = """#!/bin/sh
for a in "$@"; do
  if [ "$a" = "--version" ]; then echo "Cuda compilation tools, release ${FAKE_NVCC_RELEASE:-13.5}, V13.5.37"; exit 0; fi
done
if [ -n "$FAKE_NVCC_HOST_ERROR" ]; then
  echo "$FAKE_NVCC_HOST_ERROR" >&2; exit 1
fi
exit 0
"""


def touch(root: Path, *names: str) -> Path:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


def fake_nvcc(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_NVCC)
    path.chmod(0o755)
    return path


def _tools(**found: str) -> toolchain.Toolchain:
    names = ("cc", "cxx", "cmake", "ninja", "ccache", "nvcc", "hipconfig", "glslc", "git")
    defaults = {"cxx": "/usr/bin/c++"}
    return toolchain.Toolchain(**{n: toolchain.Tool(n, found.get(n, defaults.get(n))) for n in names})


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400, force_terminal=False), buf


@pytest.fixture(autouse=True)
def no_real_toolkits(tmp_path, monkeypatch):
    """Neither this machine's toolkits nor its wheels leak in: an empty system root, no wheels,
    no CUDA_HOME/VULKAN_SDK/BONSAI_BACKEND, no system nvcc unless a test puts one there."""
    sysroot = tmp_path / "sysroot"
    sysroot.mkdir()
    monkeypatch.setattr(cuda_toolkit, "SYSTEM_ROOT", sysroot)
    monkeypatch.setattr(cuda_toolkit, "WHEEL_LOCATIONS", [])
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDACXX", "CUDAHOSTCXX", "VULKAN_SDK", "BONSAI_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    monkeypatch.setattr(lookup, "hardware_for", lambda requested, tools: Hardware("Linux", "x86_64", 2, 2, 8 * 2**30))
    return sysroot


def partial_toolkit(root: Path) -> Path:
    """nvcc, cudart and CCCL, no cuBLAS: what this project's development machine has."""
    touch(root, "include/cuda_runtime.h", "include/cccl/cub/cub.cuh", "lib64/libcudart.so", "lib64/libcudart.so.13")
    return fake_nvcc(root / "bin" / "nvcc")


def cu13_wheels(site: Path) -> Path:
    """The CUDA 13 wheels' one root, nvidia/cu13 (versioned library names only, no libcuda)."""
    root = site / "nvidia" / "cu13"
    touch(root, "include/cuda_runtime.h", "include/cublas_v2.h", "include/cccl/cub/cub.cuh")
    touch(root, "lib/libcudart.so.13", "lib/libcublas.so.13", "lib/libcublasLt.so.13")
    fake_nvcc(root / "bin" / "nvcc")
    return site / "nvidia"


# -- CUDA: what is found where ------------------------------------------------------------------


def test_a_partial_toolkit_is_refused_by_preflight_before_any_download_or_cmake(tmp_path, monkeypatch, capsys):
    """The issue's case: nvcc and cudart, no cuBLAS. nvcc on PATH is a wrapper script (as here:
    /usr/local/bin/nvcc exec's /usr/local/cuda-13.0/bin/nvcc), found through CUDA_HOME."""
    real = partial_toolkit(tmp_path / "cuda-13.0")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda-13.0"))
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: str(wrapper))

    def forbidden(*args, **kwargs):
        raise AssertionError("the source was fetched or cmake ran")

    monkeypatch.setattr(builder, "prepare", forbidden)
    monkeypatch.setattr(cmake_build, "configure", forbidden)
    from bonsai_launch.cli import main

    monkeypatch.setattr(sys, "argv", ["bonsai", "build", "--backend", "cuda", "--cuda-archs", "90"])
    with pytest.raises(SystemExit) as exit_info:
        main.run()
    err = capsys.readouterr().err
    assert exit_info.value.code == 1, err
    assert err.startswith(f"error: --backend cuda: the CUDA toolkit of {wrapper} (nvcc and cudart found) lacks cuBLAS")
    assert "bonsai-launch[cuda]" in err and "Traceback" not in err
    assert not (builds_dir().exists() and any(builds_dir().iterdir()))


def test_cuda_wheels_stand_in_for_a_missing_toolkit(tmp_path, no_real_toolkits):
    kit = cuda_toolkit.find_toolkit(None, locations=[str(cu13_wheels(tmp_path / "site"))])
    root = tmp_path / "site" / "nvidia" / "cu13"
    assert kit.origin == "pypi" and kit.complete and kit.driver is None
    assert kit.cmake_flags() == [
        f"-DCMAKE_CUDA_COMPILER={root}/bin/nvcc",
        f"-DCUDA_CUDART={root}/lib/libcudart.so.13",
        f"-DCUDA_cudart_LIBRARY={root}/lib/libcudart.so.13",
        f"-DCUDA_cublas_LIBRARY={root}/lib/libcublas.so.13",
        f"-DCUDA_cublasLt_LIBRARY={root}/lib/libcublasLt.so.13",
        "-DGGML_CUDA_NO_VMM=ON",  # no libcuda anywhere
    ]
    # A driver that ships only libcuda.so.1 is named; an unversioned one is found by CMake itself.
    touch(no_real_toolkits, "usr/lib/x86_64-linux-gnu/libcuda.so.1")
    flags = cuda_toolkit.find_toolkit(None, locations=[str(tmp_path / "site" / "nvidia")]).cmake_flags()
    assert "-DGGML_CUDA_NO_VMM=ON" not in flags
    assert f"-DCUDA_cuda_driver_LIBRARY={no_real_toolkits}/usr/lib/x86_64-linux-gnu/libcuda.so.1" in flags
    touch(no_real_toolkits, "usr/lib/x86_64-linux-gnu/libcuda.so")
    flags = cuda_toolkit.find_toolkit(None, locations=[str(tmp_path / "site" / "nvidia")]).cmake_flags()
    assert not any("NO_VMM" in f or "cuda_driver" in f for f in flags)


def test_a_system_nvcc_borrows_cublas_from_its_wheel(tmp_path):
    nvcc = partial_toolkit(tmp_path / "cuda")
    site = tmp_path / "site" / "nvidia"
    touch(site / "cublas", "include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13")
    kit = cuda_toolkit.find_toolkit(str(nvcc), locations=[str(site)])
    assert kit.origin == "system+pypi" and kit.complete
    flags = kit.cmake_flags()
    assert f"-DCUDA_cublas_LIBRARY={site}/cublas/lib/libcublas.so.13" in flags
    assert f"-DCMAKE_CUDA_FLAGS=-isystem {site}/cublas/include" in flags  # else cublas_v2.h is not found
    assert "-DGGML_CUDA_NO_VMM=ON" in flags and not any(f.startswith("-DCUDA_CUDART") for f in flags)


def test_a_complete_system_toolkit_needs_only_its_compiler(tmp_path):
    nvcc = partial_toolkit(tmp_path / "cuda")
    touch(tmp_path / "cuda", "include/cublas_v2.h", "lib64/libcublas.so", "lib64/libcublasLt.so")
    touch(tmp_path / "cuda", "lib64/stubs/libcuda.so")
    kit = cuda_toolkit.find_toolkit(str(nvcc), locations=[str(cu13_wheels(tmp_path / "site"))])
    assert kit.origin == "system" and kit.cmake_flags() == [f"-DCMAKE_CUDA_COMPILER={nvcc}"]


def test_cuda_preflight_checks_the_release_and_the_host_compiler(tmp_path, monkeypatch):
    site = cu13_wheels(tmp_path / "site")
    monkeypatch.setattr(cuda_toolkit, "WHEEL_LOCATIONS", [str(site)])
    done = preflight.check("cuda", _tools())
    assert done.details["nvcc_version"] == "13.5" and "-DGGML_CUDA_NO_VMM=ON" in done.cmake_flags
    assert any("PyPI wheels" in n for n in done.notes) and any("GGML_CUDA_NO_VMM" in n for n in done.notes)
    monkeypatch.setenv(
        "FAKE_NVCC_HOST_ERROR", "error -- unsupported GNU version! gcc versions later than 14 are not supported!"
    )
    with pytest.raises(preflight.PreflightFailed, match="unsupported GNU version") as failed:
        preflight.check("cuda", _tools())
    assert "CUDAHOSTCXX" in (failed.value.fix or "")
    monkeypatch.delenv("FAKE_NVCC_HOST_ERROR")
    monkeypatch.setenv("FAKE_NVCC_RELEASE", "11.4")
    with pytest.raises(preflight.PreflightFailed, match=r"nvcc 11\.4 is older than the 11\.7"):
        preflight.check("cuda", _tools())
    monkeypatch.setattr(cuda_toolkit, "WHEEL_LOCATIONS", [])
    with pytest.raises(BonsaiError, match="nvcc was not found"):
        backend.choose_backend("cuda", Hardware("Linux", "x86_64", 2, 2, 0), _tools(), cuda_archs="90")


def test_cuda_builds_with_only_the_wheels(tmp_path, monkeypatch):
    """`bonsai build --backend cuda --cuda-archs 90` with no system toolkit: the wheels' hints
    reach cmake (the fake tree ignores them), the build is keyed as CUDA and installs."""
    monkeypatch.setattr(cuda_toolkit, "WHEEL_LOCATIONS", [str(cu13_wheels(tmp_path / "site"))])
    tree = fake_tree(tmp_path / "llama.cpp")
    con, out = _console()
    result = build(BuildRequest(backend="cuda", cuda_archs="90", source=str(tree)), console=con)
    flags = result.manifest["cmake_flags"]
    assert result.manifest["backend"] == "cuda" and "-DCMAKE_CUDA_ARCHITECTURES=90" in flags
    assert any(f.startswith("-DCUDA_cublas_LIBRARY=") and f.endswith("libcublas.so.13") for f in flags)
    assert "CUDA 13.5 from NVIDIA's PyPI wheels" in out.getvalue()


def test_auto_builds_cuda_only_with_a_gpu_and_a_toolkit(tmp_path, monkeypatch):
    from bonsai_launch.core.hardware import GPU

    h200 = Hardware("Linux", "x86_64", 2, 2, 0, (GPU(0, "NVIDIA H200", 1, 1, "9.0"),))
    no_gpu = Hardware("Linux", "x86_64", 2, 2, 0)
    chosen = backend.choose_backend("auto", h200, _tools())
    assert chosen.backend == "cpu" and "bonsai-launch[cuda]" in chosen.reason  # GPU, no toolkit at all
    monkeypatch.setattr(cuda_toolkit, "WHEEL_LOCATIONS", [str(cu13_wheels(tmp_path / "site"))])
    assert backend.choose_backend("auto", h200, _tools()).backend == "cuda"  # the wheels count
    assert backend.choose_backend("auto", no_gpu, _tools()).backend == "cpu"  # a toolkit is not a GPU


# -- Vulkan and HIP -----------------------------------------------------------------------------


def test_vulkan_preflight_names_each_missing_part(no_real_toolkits, monkeypatch):
    root = no_real_toolkits
    tools = _tools(glslc="/usr/bin/glslc")
    with pytest.raises(preflight.PreflightFailed, match="glslc"):
        preflight.check_vulkan(_tools())
    with pytest.raises(preflight.PreflightFailed, match=r"vulkan_core\.h"):
        preflight.check_vulkan(tools)
    header = root / "usr/include/vulkan/vulkan_core.h"
    header.parent.mkdir(parents=True)
    # Debian 12's headers lack VK_EXT_layer_settings: enough since patch 0007 guards the pin's use of it
    header.write_text("#define VK_HEADER_VERSION 239\n#define VK_EXT_debug_utils 1\n")
    with pytest.raises(preflight.PreflightFailed, match="SPIRV-Headers") as failed:
        preflight.check_vulkan(tools)
    assert "spirv-headers" in (failed.value.fix or "")
    touch(root, "usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake")  # where Debian's package puts it
    with pytest.raises(preflight.PreflightFailed, match="loader"):
        preflight.check_vulkan(tools)
    touch(root, "usr/lib/x86_64-linux-gnu/libvulkan.so")
    from bonsai_launch.core import hardware as machine

    lavapipe = (machine.VulkanDevice("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU (software)"),)
    monkeypatch.setattr(
        machine, "vulkan_devices", lambda system=None, fresh=False: machine.VulkanDevices(lavapipe, "vulkaninfo")
    )
    done = preflight.check_vulkan(tools)
    assert done.details["header_version"] == 239
    assert len(done.notes) == 1 and "llvmpipe" in done.notes[0] and "GGML_VK_VISIBLE_DEVICES" in done.notes[0]


def test_hip_preflight(tmp_path):
    tools = _tools(hipconfig=str(tmp_path / "rocm/bin/hipconfig"))
    with pytest.raises(preflight.PreflightFailed, match="hipconfig was not found"):
        preflight.check_hip(_tools(), root=tmp_path / "rocm")
    (tmp_path / "rocm/.info").mkdir(parents=True)
    (tmp_path / "rocm/.info/version").write_text("5.7.1\n")
    with pytest.raises(preflight.PreflightFailed, match=r"ROCm 5\.7\.1 .* older than the 6\.1"):
        preflight.check_hip(tools, root=tmp_path / "rocm")
    (tmp_path / "rocm/.info/version").write_text("6.2.0\n")
    touch(tmp_path / "rocm", "lib/cmake/hip/hip-config.cmake", "lib/cmake/rocblas/rocblas-config.cmake")
    with pytest.raises(preflight.PreflightFailed, match="no hipblas CMake package"):
        preflight.check_hip(tools, root=tmp_path / "rocm")
    touch(tmp_path / "rocm", "lib/cmake/hipblas/hipblas-config.cmake")
    assert preflight.check_hip(tools, root=tmp_path / "rocm").details["version"] == "6.2.0"


# -- auto falls back, a named backend stops -----------------------------------------------------


@pytest.fixture
def vulkan_machine(tmp_path, monkeypatch):
    """A pin (the fake sdist), auto choosing Vulkan, its preflight passing; the compile of the
    Vulkan build fails (injected at the build step), the CPU build works."""
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    use_pin(monkeypatch, write_pin(tmp_path / "vendor", archive, sha))
    monkeypatch.setattr(lookup, "detected_backend", lambda: "vulkan")
    monkeypatch.setattr(backend, "vulkan_sdk_present", lambda tools: True)
    monkeypatch.setattr(preflight, "check", lambda name, tools, **kw: preflight.Preflight(name))
    real_build = cmake_build.build

    def failing_gpu_build(ninja, work, targets, jobs, env, log, log_path, console=None, label="build"):
        if "vulkan" in label:
            log.write("ggml-vulkan.cpp:5225: error: 'LayerSettingEXT' is not a member of 'vk'\n")
            log.flush()
            raise ActionFailed(f"ninja build failed (exit 1); full log: {log_path}", "read the log")
        return real_build(ninja, work, targets, jobs, env, log, log_path, console, label=label)

    monkeypatch.setattr(cmake_build, "build", failing_gpu_build)


def test_auto_goes_on_with_the_cpu_build_when_its_gpu_build_fails(vulkan_machine, capsys):
    from bonsai_launch.server.prepare import build_server

    server = build_server()  # what `bonsai start` runs when nothing is built
    err = capsys.readouterr().err
    assert server.is_file() and server.parent.parent.name.startswith("cpu-")
    note = [line for line in err.splitlines() if "the vulkan build failed" in line]
    assert len(note) == 1, err
    log = Path(note[0].split("; log: ")[1].split(";")[0])
    assert log.is_file() and "LayerSettingEXT" in log.read_text() and log.parent.name.startswith("vulkan-")
    assert "using the CPU build instead" in note[0] and "BONSAI_BACKEND=vulkan" in note[0]
    # remembered: the next launch does not spend minutes on the same failure
    assert fallback.recorded_failure("vulkan", toolchain.detect(versions=False)) is not None


def test_a_named_backend_that_fails_stops_with_the_error(vulkan_machine, monkeypatch, capsys):
    from bonsai_launch.server.prepare import build_server

    monkeypatch.setenv("BONSAI_BACKEND", "vulkan")
    with pytest.raises(ActionFailed, match="ninja build failed"):
        build_server()
    assert not any(p.name.startswith("cpu-") for p in builds_dir().iterdir())
    assert "using the CPU build" not in capsys.readouterr().err


def test_auto_falls_back_when_the_preflight_refuses(tmp_path, monkeypatch):
    tree = fake_tree(tmp_path / "llama.cpp")

    def refuse(name, tools, **kw):
        if name == "vulkan":
            raise preflight.PreflightFailed("vulkan", "the Vulkan headers lack VK_EXT_layer_settings", "newer headers")
        return preflight.Preflight(name)

    monkeypatch.setattr(backend, "vulkan_sdk_present", lambda tools: True)
    monkeypatch.setattr(preflight, "check", refuse)
    con, out = _console()
    result = build(BuildRequest(backend="vulkan", source=str(tree), fall_back_to_cpu=True), console=con)
    assert result.manifest["backend"] == "cpu"
    assert "the vulkan build failed (--backend vulkan: the Vulkan headers lack VK_EXT_layer_settings)" in out.getvalue()
    with pytest.raises(preflight.PreflightFailed):
        build(BuildRequest(backend="vulkan", source=str(tree)))


def test_a_remembered_failure_holds_until_the_toolchain_changes(tmp_path, monkeypatch):
    glslc = touch(tmp_path, "bin/glslc") / "bin/glslc"
    tools = _tools(glslc=str(glslc))
    monkeypatch.setattr(toolchain, "detect", lambda versions=True, system=None: tools)
    monkeypatch.setattr(lookup, "choose_backend", lambda *a, **k: backend.BackendChoice("vulkan", (), "a GPU"))
    assert lookup.detected_backend() == "vulkan"
    fallback.record_failure("vulkan", tools, "ninja build failed", tmp_path / "build.log")
    assert lookup.detected_backend() == "cpu"
    monkeypatch.setenv("BONSAI_BACKEND", "vulkan")
    assert lookup.detected_backend() == "vulkan"  # named: obeyed, failure or not
    monkeypatch.delenv("BONSAI_BACKEND")
    os.utime(glslc, ns=(1, 1))  # an upgraded toolchain gets another try
    assert lookup.detected_backend() == "vulkan"


def test_backend_is_the_flag_then_bonsai_backend_then_auto(monkeypatch):
    assert fallback.requested_backend(None) == ("auto", False)
    monkeypatch.setenv("BONSAI_BACKEND", "Vulkan")
    assert fallback.requested_backend(None) == ("vulkan", True)
    assert fallback.requested_backend("cpu") == ("cpu", True)
    assert fallback.requested_backend("auto") == ("auto", False)  # the flag wins, even as auto
    monkeypatch.setenv("BONSAI_BACKEND", "opencl")
    with pytest.raises(BonsaiError, match=r"BONSAI_BACKEND='opencl' is not a known value; allowed: one of auto, cpu"):
        fallback.requested_backend(None)


# -- the probe cache ----------------------------------------------------------------------------


def test_a_probe_taken_without_a_gpu_is_taken_again_when_one_appears(tmp_path, monkeypatch):
    from bonsai_launch.llamacpp import binaries
    from bonsai_launch.llamacpp.capabilities import Capabilities

    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    probes = []

    def fake_probe(path):
        probes.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return Capabilities(str(path), backend="cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu")

    monkeypatch.setattr(binaries, "probe_uncached", fake_probe)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert binaries.probe(binary).backend == "cpu"
    assert binaries.probe(binary).backend == "cpu" and len(probes) == 1  # cached
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the machine changed, the binary did not
    assert binaries.probe(binary).backend == "cuda" and len(probes) == 2


# -- doctor -------------------------------------------------------------------------------------


def test_doctor_shows_the_devices_per_backend_and_why_one_is_used(tmp_path, no_real_toolkits, monkeypatch):
    from bonsai_launch import doctor
    from bonsai_launch.core import hardware as machine

    lavapipe = (machine.VulkanDevice("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU (software)"),)
    monkeypatch.setattr(
        machine, "vulkan_devices", lambda system=None, fresh=False: machine.VulkanDevices(lavapipe, "vulkaninfo")
    )
    monkeypatch.setattr(machine, "detect", lambda: Hardware("Linux", "x86_64", 2, 2, 8 * 2**30))
    monkeypatch.setattr(cuda_toolkit, "WHEEL_LOCATIONS", [str(cu13_wheels(tmp_path / "site"))])
    tools = _tools(glslc="/usr/bin/glslc", cc="/usr/bin/cc", cmake="/x/cmake", ninja="/x/ninja")
    monkeypatch.setattr(toolchain, "detect", lambda versions=True, system=None: tools)
    monkeypatch.setattr(backend, "vulkan_sdk_present", lambda tools: True)

    report = doctor.gather()
    vulkan, cuda = report.backends["vulkan"], report.backends["cuda"]
    assert vulkan["devices"] == ["llvmpipe (LLVM 15.0.6, 256 bits) (CPU (software))"] and vulkan["how"] == "vulkaninfo"
    assert vulkan["preflight"]["ok"] is False and "vulkan_core.h" in vulkan["preflight"]["problem"]
    assert cuda["devices"] == [] and cuda["preflight"]["ok"] is True  # the wheels' toolkit, no GPU
    assert report.backend["backend"] == "cpu" and "no Vulkan GPU" in report.backend["reason"]
    assert report.backend["launch"] == "cpu"

    monkeypatch.setenv("BONSAI_BACKEND", "vulkan")
    report = doctor.gather()
    assert report.backend["launch"] == "vulkan" and report.backend["launch_reason"] == "BONSAI_BACKEND=vulkan"
    monkeypatch.delenv("BONSAI_BACKEND")

    # auto would pick Vulkan (a real GPU), but its toolchain is incomplete: start uses the CPU, and says why
    monkeypatch.setattr(backend, "choose_backend", lambda *a, **k: backend.BackendChoice("vulkan", (), "a GPU"))
    report = doctor.gather()
    assert report.backend["launch"] == "cpu" and "vulkan cannot be built here" in report.backend["launch_reason"]
    assert any("start falls back to the CPU" in p.what and p.fix for p in report.problems)


def test_the_cuda_extra_brings_every_part_the_discovery_needs():
    import re
    import tomllib

    root = Path(__file__).resolve().parents[1]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cuda"]
    names = {re.split(r"[<>=!~ ]", req)[0] for req in extra}
    # nvcc (+ crt: its host headers), the runtime, cub (cccl), cuBLAS: each missing() part
    assert names == {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cublas"}
    assert "bonsai-launch[cuda]" in preflight.CUDA_EXTRA_HINT


def test_doctor_lists_a_gpu_builds_devices_as_they_are_now(monkeypatch):
    """A CUDA build made where no GPU was visible recorded no devices in its manifest; once a GPU
    is there, doctor shows it (the probe runs again: the devices visible changed)."""
    from bonsai_launch import doctor
    from bonsai_launch.llamacpp import binaries
    from bonsai_launch.llamacpp.builds.install import SCHEMA, write_manifest
    from bonsai_launch.llamacpp.capabilities import Capabilities

    key_dir = builds_dir() / "cuda-0123456789ab"
    server = key_dir / "bin" / "llama-server"
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\n")
    caps = {"backend": "cpu", "devices": [], "spec_types": [], "flags": []}
    write_manifest(
        key_dir,
        {
            "schema": SCHEMA,
            "key": key_dir.name,
            "backend": "cuda",
            "binaries": {"llama-server": str(server)},
            "capabilities": caps,
            "source": {},
        },
    )
    visible = []
    monkeypatch.setattr(
        binaries,
        "probe_uncached",
        lambda path: Capabilities(str(path), backend="cuda" if visible else "cpu", devices=tuple(visible)),
    )
    assert doctor.gather().builds[0]["devices"] == []
    visible.append("CUDA0: NVIDIA H200 (143771 MiB, 143000 MiB free)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # stands in for the GPU appearing
    assert doctor.gather().builds[0]["devices"] == visible


# -- the vulkan lane's test-rig settings stay in the tests ---------------------------------------

# Settings a lavapipe test rig has needed (Mesa 22.3's; tests/test_vulkan_lane.py): on a real
# GPU they would turn off fusion, half precision or parallel submissions (slower).
LAVAPIPE_RIG = ("GGML_VK_DISABLE_FUSION", "GGML_VK_SERIALIZE_SUBMISSIONS", "GGML_VK_DISABLE_F16")


def test_bonsai_never_applies_the_lavapipe_rig_settings():
    from bonsai_launch.llamacpp.capabilities import Capabilities
    from test_plan import plan_for

    vulkan = Capabilities("llama-server", backend="vulkan", devices=("Vulkan0: AMD Radeon RX 7900 XTX",))
    for profile, model in (("demo", None), ("ternary-27b", None)):
        plan = plan_for(profile, "cpu-24g", caps=vulkan, with_drafter=profile != "demo", model=model)
        assert plan.argv[plan.argv.index("-ngl") + 1] == "99"  # a Vulkan build offloads
        assert not any(k.startswith("GGML_") for k in plan.env), plan.env
        pairs = set(zip(plan.argv, plan.argv[1:], strict=False))
        assert not pairs & {("-fa", "off"), ("--flash-attn", "off")}  # the profile's or llama.cpp's choice
    package = Path(backend.__file__).resolve().parents[2]
    for source in package.rglob("*.py"):
        text = source.read_text()
        for name in LAVAPIPE_RIG:
            assert name not in text, f"{source} mentions {name}"
    # GGML_VK_VISIBLE_DEVICES is read (the probe cache's key) and set only by `fleet --gpus`,
    # each replica to the GPU it was given; a single server's plan has no GGML_* above
