"""Paths, binary names, probing and build toolchains of Windows and macOS, run on Linux.

Each test names the system it stands in for (a `platform`/`system` argument, or
sys.platform patched for one call) and fakes only what cannot exist here: cl.exe, vswhere,
vcvars64.bat, xcode-select, a CUDA_PATH folder, a llama-server.exe.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bonsai_launch.core import paths
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.hardware import GPU, Hardware
from bonsai_launch.llamacpp import binaries
from bonsai_launch.llamacpp.builds import backend, builder, toolchain

DATA = Path(__file__).parent / "data"
# The stand-ins for cl.exe and llama-server.exe are #! scripts: they run on Linux and macOS.
needs_sh = pytest.mark.skipif(os.name == "nt", reason="the stand-in programs are extensionless #! scripts")


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- BONSAI_HOME and names ---------------------------------------------------------------------------


def test_windows_home_is_local_appdata(monkeypatch):
    # platformdirs' documented override stands in for the Known Folder Windows would report.
    monkeypatch.setenv("WIN_PD_OVERRIDE_LOCAL_APPDATA", r"C:\Users\Ana Lopez\AppData\Local")
    home = paths.default_home("win32")
    assert str(home).startswith(r"C:\Users\Ana Lopez\AppData\Local") and home.name.endswith("bonsai")
    assert "Roaming" not in str(home)


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_posix_home_is_the_xdg_cache(monkeypatch, tmp_path, platform):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert paths.default_home(platform) == tmp_path / "bonsai"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.default_home(platform) == Path.home() / ".cache" / "bonsai"


def test_bonsai_home_variable_wins_everywhere(monkeypatch, tmp_path):
    monkeypatch.setenv("BONSAI_HOME", str(tmp_path))
    assert paths.bonsai_home() == tmp_path


def test_exe_names():
    assert paths.exe_name("llama-server", "win32") == "llama-server.exe"
    assert paths.exe_name("llama-server.exe", "win32") == "llama-server.exe"
    assert paths.exe_name("llama-server", "darwin") == "llama-server"
    assert paths.exe_name("", "win32") == ".exe" and paths.exe_name("", "linux") == ""


def test_bonsai_llama_server_may_leave_out_exe_on_windows(tmp_path):
    folder = tmp_path / "llama-b11434-bin-win-cuda-12.4-x64"
    exe = executable(folder / "llama-server.exe", "")
    assert binaries.explicit_server(str(exe), platform="win32") == exe
    assert binaries.explicit_server(str(folder / "llama-server"), platform="win32") == exe
    with pytest.raises(BonsaiError, match=r"llama-server\.exe binary .BONSAI_LLAMA_BIN at its folder"):
        binaries.explicit_server(str(tmp_path / "nothing"), platform="win32")
    with pytest.raises(BonsaiError):  # elsewhere a name is the name
        binaries.explicit_server(str(folder / "llama-server"), platform="linux")


def test_start_reads_both_windows_spellings(tmp_path, monkeypatch):
    """What `bonsai start` uses (server_choice): BONSAI_LLAMA_SERVER without .exe on Windows,
    BONSAI_LLAMA_BIN holding llama-server.exe."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.llamacpp import choice as server_choice

    exe = executable(tmp_path / "bin" / "llama-server.exe", "")
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(tmp_path / "bin" / "llama-server"))
    try:
        found = server_choice.explicit_binary(resolve())
    finally:
        monkeypatch.setattr(sys, "platform", "linux")
    assert found == (exe, "BONSAI_LLAMA_SERVER")
    monkeypatch.delenv("BONSAI_LLAMA_SERVER")
    monkeypatch.setenv("BONSAI_LLAMA_BIN", str(tmp_path / "bin"))
    assert server_choice.explicit_binary(resolve()) == (exe, "BONSAI_LLAMA_BIN")


@needs_sh
def test_probe_reads_a_windows_llama_server_exe(tmp_path):
    """What a Windows build prints: CRLF line ends, UTF-8 device names whatever the locale."""
    help_text = (DATA / "llama-server-b11434-help.txt").read_text()
    (tmp_path / "help.txt").write_bytes(help_text.replace("\n", "\r\n").encode())
    devices = "Available devices:\r\n  Vulkan0: AMD Radeon\u2122 RX 7900 XTX (24560 MiB, 24000 MiB free)\r\n"
    (tmp_path / "devices.txt").write_bytes(devices.encode("utf-8"))
    server = executable(
        tmp_path / "llama-server.exe",
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --help) cat '{tmp_path / 'help.txt'}' ;;\n"
        "  --version) printf 'version: 0.6.0-dev (build 11434, commit unknown)\\r\\n' >&2 ;;\n"
        f"  --list-devices) cat '{tmp_path / 'devices.txt'}' ;;\n"
        "esac\n",
    )
    caps = binaries.probe(server)
    assert caps.binary.endswith("llama-server.exe")
    assert caps.accepts("--spec-draft-n-max") and "draft-dspark" in caps.spec_types
    assert caps.build_number == 11434
    assert caps.backend == "vulkan"
    assert caps.devices == ("Vulkan0: AMD Radeon\u2122 RX 7900 XTX (24560 MiB, 24000 MiB free)",)
    assert not any("\r" in flag for flag in caps.flags)


def test_metal_devices_make_a_metal_backend():
    """A macOS build lists `MTL0: Apple M2 Pro (...)`: no "metal" in it (ggml-metal names its
    devices MTL<n>). Taking it for CPU would plan -ngl 0 on a Mac."""
    from bonsai_launch.llamacpp.capabilities import backend_from_devices, parse_devices

    devices = parse_devices("Available devices:\n  MTL0: Apple M2 Pro (21845 MiB, 21844 MiB free)\n")
    assert backend_from_devices(devices) == "metal"
    assert backend_from_devices(("ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24000 MiB free)",)) == "hip"
    assert backend_from_devices(()) == "cpu"


def test_a_binary_that_cannot_start_says_why(monkeypatch, tmp_path):
    """Windows reports a missing DLL (cudart64_12.dll) as exit 0xC0000135 with no output."""
    server = executable(tmp_path / "llama-server.exe", "")
    monkeypatch.setattr(
        binaries.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a[0], 0xC0000135, "", "")
    )
    with pytest.raises(BonsaiError, match=r"0xc0000135 and printed nothing \(a DLL it needs was not found"):
        binaries.probe_uncached(server)


# -- Windows toolchain: MSVC + Ninja --------------------------------------------------------------------

# What cl.exe prints when run bare: the banner on stderr, its usage on stdout.
CL_BANNER = (
    "#!/bin/sh\necho 'Microsoft (R) C/C++ Optimizing Compiler Version 19.40.33811 for x64' >&2\n"
    "echo 'usage: cl [ option... ] filename... [ /link linkoption... ]'\nexit 0\n"
)


@pytest.fixture
def bare_path(monkeypatch, tmp_path):
    """A PATH with nothing but a folder the test fills; no compiler variables."""
    folder = tmp_path / "path"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    for var in ("CC", "CXX", "CUDACXX", "CUDA_HOME", "CUDA_PATH", "VULKAN_SDK"):
        monkeypatch.delenv(var, raising=False)
    toolchain.find_vcvars.cache_clear()
    yield folder
    getattr(toolchain.find_vcvars, "cache_clear", lambda: None)()  # may still be a test's stand-in


@needs_sh
def test_windows_developer_prompt_cl_is_the_compiler(bare_path):
    executable(bare_path / "cl", CL_BANNER)
    tools = toolchain.detect(versions=True, system="Windows")
    assert Path(tools.cxx.path).name == "cl" and toolchain.is_msvc(tools.cxx.path)
    assert tools.cxx.version == "Microsoft (R) C/C++ Optimizing Compiler Version 19.40.33811 for x64"
    assert "vcvars" not in tools.to_json()  # a developer prompt needs no vcvars


def _visual_studio(root: Path) -> Path:
    vs = root / "Microsoft Visual Studio" / "2022" / "BuildTools"
    vcvars = executable(vs / "VC" / "Auxiliary" / "Build" / "vcvars64.bat", "@echo off\n")
    for version in ("14.38.33130", "14.40.33807", "14.9.1"):
        executable(vs / "VC" / "Tools" / "MSVC" / version / "bin" / "Hostx64" / "x64" / "cl.exe", CL_BANNER)
    return vcvars


def test_windows_without_a_developer_prompt_finds_visual_studio(bare_path, monkeypatch, tmp_path):
    vcvars = _visual_studio(tmp_path / "Program Files (x86)")
    executable(tmp_path / "Program Files (x86)" / "Microsoft Visual Studio" / "Installer" / "vswhere.exe", "")
    monkeypatch.setenv("ProgramFiles(x86)", str(tmp_path / "Program Files (x86)"))
    calls = []

    def vswhere(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, str(vcvars.parents[3]) + "\r\n", "")

    assert toolchain.find_vcvars(run=vswhere) == str(vcvars)
    assert "Microsoft.VisualStudio.Component.VC.Tools.x86.x64" in calls[0] and "-latest" in calls[0]
    toolchain.find_vcvars.cache_clear()
    monkeypatch.setattr(toolchain, "find_vcvars", lambda: str(vcvars))
    tools = toolchain.detect(versions=False, system="Windows")
    assert tools.vcvars.path == str(vcvars)
    assert "14.40.33807" in tools.cxx.path and tools.cxx.path.endswith("cl.exe")  # the newest MSVC


@needs_sh
def test_installed_msvc_wins_over_a_gcc_on_path(bare_path, monkeypatch, tmp_path):
    executable(bare_path / "gcc", "")
    executable(bare_path / "g++", "")
    vcvars = _visual_studio(tmp_path / "VS")
    monkeypatch.setattr(toolchain, "find_vcvars", lambda: str(vcvars))
    tools = toolchain.detect(versions=False, system="Windows")
    assert toolchain.is_msvc(tools.cxx.path) and tools.vcvars.found
    monkeypatch.setattr(toolchain, "find_vcvars", lambda: None)  # no Visual Studio: MinGW then
    tools = toolchain.detect(versions=False, system="Windows")
    assert Path(tools.cxx.path).name == "g++" and not tools.vcvars.found


def test_no_visual_studio_at_all_gives_the_build_tools_hint(bare_path, monkeypatch):
    monkeypatch.setattr(toolchain, "find_vcvars", lambda: None)
    tools = toolchain.detect(versions=False, system="Windows")
    assert not tools.cxx.found
    assert "Desktop development with C++" in toolchain.compiler_hint("Windows")
    assert "winget install Microsoft.VisualStudio.2022.BuildTools" in toolchain.compiler_hint("Windows")


def test_msvc_environment_is_read_back_from_cmd():
    seen = []

    def cmd(line, **kwargs):
        seen.append(line)
        return subprocess.CompletedProcess(
            line,
            0,
            "Path=C:\\VS\\bin;C:\\Windows\r\nINCLUDE=C:\\VS\\include\r\nLIB=C:\\VS\\lib\r\nVSCMD_VER=17.10\r\n",
            "",
        )

    env = toolchain.msvc_environment(r"C:\Program Files\VS\vcvars64.bat", run=cmd)
    assert env["INCLUDE"] == "C:\\VS\\include" and env["Path"].startswith("C:\\VS\\bin")
    assert env["CC"] == env["CXX"] == "cl"  # not a gcc that happens to be on PATH
    assert seen == [r'cmd.exe /d /s /c ""C:\Program Files\VS\vcvars64.bat" >nul 2>&1 && set"']
    with pytest.raises(BonsaiError, match="no INCLUDE"):
        toolchain.msvc_environment("x.bat", run=lambda line, **k: subprocess.CompletedProcess(line, 0, "A=1\n", ""))


def test_build_env_uses_vcvars_when_given(monkeypatch):
    monkeypatch.setattr(toolchain, "msvc_environment", lambda vcvars: {"INCLUDE": "/vs/include", "PATH": "/vs/bin"})
    env = builder.build_env("vcvars64.bat")
    assert env["INCLUDE"] == "/vs/include"
    assert env["PATH"].split(os.pathsep)[-1] == "/vs/bin"  # cmake and ninja of the PyPI packages come first
    assert "INCLUDE" not in builder.build_env(None) or os.environ.get("INCLUDE")


def test_windows_cuda_and_vulkan_tools_are_found_by_their_sdk_variables(bare_path, monkeypatch, tmp_path):
    nvcc = executable(tmp_path / "CUDA" / "v12.4" / "bin" / "nvcc.exe", "")
    glslc = executable(tmp_path / "VulkanSDK" / "1.3.290.0" / "Bin" / "glslc.exe", "")
    monkeypatch.setenv("CUDA_PATH", str(nvcc.parents[1]))
    monkeypatch.setenv("VULKAN_SDK", str(glslc.parents[1]))
    monkeypatch.setattr(sys, "platform", "win32")
    try:
        found = toolchain.find_nvcc(), toolchain.find_glslc()
    finally:
        monkeypatch.setattr(sys, "platform", "linux")
    assert found == (str(nvcc), str(glslc))


def _hw(system: str, arch: str = "x86_64", gpus=()) -> Hardware:
    return Hardware(system, arch, 8, 16, 32 * 2**30, tuple(gpus))


def _tools(**found: str) -> toolchain.Toolchain:
    names = ("cc", "cxx", "cmake", "ninja", "ccache", "nvcc", "hipconfig", "glslc", "git")
    return toolchain.Toolchain(**{n: toolchain.Tool(n, found.get(n)) for n in names})


RTX = GPU(0, "NVIDIA GeForce RTX 4090", 24 * 2**30, 22 * 2**30, "8.9")


def test_windows_backends():
    msvc = _tools(cc="C:/VS/cl.exe", cxx="C:/VS/cl.exe", nvcc="C:/CUDA/bin/nvcc.exe")
    auto = backend.choose_backend("auto", _hw("Windows", gpus=[RTX]), msvc)
    assert auto.backend == "cuda" and "-DCMAKE_CUDA_ARCHITECTURES=89" in auto.cmake_flags
    assert "-DGGML_METAL=OFF" not in auto.cmake_flags
    mingw = _tools(cc="C:/mingw/gcc.exe", cxx="C:/mingw/g++.exe", nvcc="C:/CUDA/bin/nvcc.exe")
    with pytest.raises(BonsaiError, match="needs MSVC") as err:
        backend.choose_backend("cuda", _hw("Windows", gpus=[RTX]), mingw)
    assert "Desktop development with C++" in err.value.fix
    with pytest.raises(BonsaiError) as err:
        backend.choose_backend("cuda", _hw("Windows", gpus=[RTX]), _tools(cxx="C:/VS/cl.exe"))
    assert "CUDA_PATH" in err.value.fix and "apt" not in err.value.fix
    with pytest.raises(BonsaiError) as err:
        backend.choose_backend("vulkan", _hw("Windows"), _tools(cxx="C:/VS/cl.exe"))
    assert "VULKAN_SDK" in err.value.fix and "apt" not in err.value.fix
    with pytest.raises(BonsaiError, match="not supported on Windows"):
        backend.choose_backend("hip", _hw("Windows"), _tools(hipconfig="C:/hip/hipconfig"))
    assert backend.choose_backend("cpu", _hw("Windows"), msvc).cmake_flags == ()


@needs_sh
def test_windows_cl_banner_is_the_compiler_id(tmp_path):
    cl = executable(tmp_path / "cl.exe", CL_BANNER)
    toolchain.compiler_id.cache_clear()
    assert toolchain.compiler_id(str(cl)) == "Microsoft (R) C/C++ Optimizing Compiler Version 19.40.33811 for x64"


# -- macOS toolchain: Xcode command line tools + Metal ------------------------------------------------------


@needs_sh
def test_macos_without_command_line_tools_has_no_compiler(bare_path, monkeypatch):
    executable(bare_path / "cc", "#!/bin/sh\nexit 1\n")  # /usr/bin/cc is a stub until the tools are installed
    executable(bare_path / "c++", "#!/bin/sh\nexit 1\n")
    monkeypatch.setattr(toolchain, "find_xcode_clt", lambda: None)
    tools = toolchain.detect(versions=False, system="Darwin")
    assert not tools.cc.found and not tools.cxx.found
    assert toolchain.compiler_hint("Darwin") == "install the Xcode command line tools: `xcode-select --install`"
    monkeypatch.setattr(toolchain, "find_xcode_clt", lambda: "/Library/Developer/CommandLineTools")
    tools = toolchain.detect(versions=False, system="Darwin")
    assert tools.cxx.found and tools.to_json()["xcode_clt"]["path"] == "/Library/Developer/CommandLineTools"


def test_xcode_select_answers():
    ok = toolchain.find_xcode_clt(
        run=lambda argv, **k: subprocess.CompletedProcess(argv, 0, "/Applications/Xcode.app/Contents/Developer\n", "")
    )
    assert ok == "/Applications/Xcode.app/Contents/Developer"
    missing = toolchain.find_xcode_clt(
        run=lambda argv, **k: subprocess.CompletedProcess(
            argv, 2, "", "xcode-select: error: unable to get active developer directory"
        )
    )
    assert missing is None


def test_macos_backends(monkeypatch):
    clang = _tools(cc="/usr/bin/cc", cxx="/usr/bin/c++")
    metal = backend.choose_backend("auto", _hw("Darwin", "arm64"), clang)
    assert metal.backend == "metal" and metal.cmake_flags == ("-DGGML_METAL=ON",)
    # llama.cpp turns Metal on by default on every Mac: a CPU build must turn it off.
    assert backend.choose_backend("cpu", _hw("Darwin", "arm64"), clang).cmake_flags == ("-DGGML_METAL=OFF",)
    intel = backend.choose_backend("auto", _hw("Darwin", "x86_64"), clang)
    assert intel.backend == "cpu" and intel.cmake_flags == ("-DGGML_METAL=OFF",)
    with pytest.raises(BonsaiError) as err:
        backend.choose_backend("metal", _hw("Darwin", "x86_64"), clang)
    assert "Apple Silicon" in err.value.fix and "Intel Mac" in err.value.fix
    with pytest.raises(BonsaiError) as err:
        backend.choose_backend("cuda", _hw("Darwin", "arm64"), clang)
    assert "does not exist on macOS" in err.value.fix
    monkeypatch.setenv("VULKAN_SDK", "/Users/ana/VulkanSDK/1.3.290.0/macOS")
    vulkan = backend.choose_backend(
        "vulkan", _hw("Darwin", "arm64"), _tools(cxx="/usr/bin/c++", glslc="/sdk/bin/glslc")
    )
    assert vulkan.cmake_flags == ("-DGGML_VULKAN=ON", "-DGGML_METAL=OFF")


def test_linux_flags_are_unchanged():
    """The build key of existing Linux builds depends on these: no new flags there."""
    gcc = _tools(cc="/usr/bin/cc", cxx="/usr/bin/c++")
    assert backend.choose_backend("auto", _hw("Linux"), gcc).cmake_flags == ()
    assert toolchain.hint("cuda", "Linux") == toolchain.INSTALL_HINTS["cuda"]


def test_installing_over_a_running_windows_binary_says_what_to_do(monkeypatch, tmp_path):
    """Windows will not rename a bin/ folder whose llama-server.exe is running."""
    from bonsai_launch.core.errors import ActionFailed
    from bonsai_launch.llamacpp.builds import install

    work = tmp_path / "work" / "bin"
    executable(work / "llama-server.exe", "")
    key_dir = tmp_path / "key"
    (key_dir / "bin").mkdir(parents=True)
    real_replace = os.replace

    def in_use(src, dst):
        if Path(src).name == "bin":
            raise PermissionError(13, "Access is denied")
        real_replace(src, dst)

    monkeypatch.setattr(install.os, "replace", in_use)
    with pytest.raises(ActionFailed, match="probably running") as err:
        install.install_binaries(work, key_dir, ("llama-server.exe",))
    assert "bonsai stop" in err.value.fix
    assert [p.name for p in key_dir.iterdir()] == ["bin"]  # no half-made .bin.new left behind
