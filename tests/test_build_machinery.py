"""`bonsai build` end to end on a tiny fake llama.cpp (three C programs), never the real one."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from bonsai_launch.config.settings import resolve
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.hardware import GPU, Hardware
from bonsai_launch.core.paths import builds_dir
from bonsai_launch.llamacpp.builds import (
    BuildRequest,
    backend,
    build,
    ensure_server,
    find_installed,
    lookup,
    toolchain,
)
from bonsai_launch.llamacpp.builds import cmake as cmake_build
from build_helpers import fake_tree, file_index, help_patch, make_sdist, use_index, use_pin, write_pin


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


@pytest.fixture
def tree(tmp_path) -> Path:
    return fake_tree(tmp_path / "llama.cpp")


@pytest.fixture(autouse=True)
def cpu_machine(monkeypatch):
    """Auto-detection says cpu on every machine the tests run on, GPU or not (and on a Mac,
    where --backend auto would otherwise choose Metal: CI's macOS lane)."""
    monkeypatch.setattr(lookup, "detected_backend", lambda: "cpu")
    monkeypatch.setattr(lookup, "hardware_for", lambda requested, tools: Hardware("Linux", "x86_64", 2, 2, 8 * 2**30))


def test_build_from_local_folder(tree):
    con, out = _console()
    result = build(BuildRequest(backend="cpu", source=str(tree)), console=con)
    m = result.manifest
    assert not result.up_to_date and result.server.is_file() and os.access(result.server, os.X_OK)
    assert result.server == builds_dir() / m["key"] / "bin" / "llama-server"
    assert m["key"].startswith("cpu-") and m["backend"] == "cpu" and m["source"]["kind"] == "local"
    assert set(m["binaries"]) == {"llama-server", "llama-speculative-simple", "llama-bench", "llama-quantize"}
    assert not (Path(m["work_dir"]) / "bin" / "llama-cli").exists()  # only the four targets are built
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in m["cmake_flags"] and "-DCMAKE_BUILD_TYPE=Release" in m["cmake_flags"]
    assert "draft-dspark" in m["capabilities"]["spec_types"] and "--spec-draft-n-max" in m["capabilities"]["flags"]
    assert m["version"].startswith("version: 0.6.0-dev (build 0")
    assert m["build_seconds"] >= 0 and Path(m["log"]).is_file()
    steps = [cmake_build.parse_step(line) for line in Path(m["log"]).read_text().splitlines()]
    assert [s[:2] for s in steps if s][-1][0] == [s[:2] for s in steps if s][-1][1]  # [N/N] reached
    assert "cold CPU build takes about 12 minutes" in out.getvalue()
    # A source without llama.cpp's tools/ui: built all the same, without the chat page, and the manifest says why.
    assert m["ui"] == {"page": False, "key": "", "reason": "this llama.cpp source has no tools/ui chat page to build"}


def test_up_to_date_build_does_not_run_cmake(tree, monkeypatch):
    first = build(BuildRequest(source=str(tree)))

    def forbidden(*args, **kwargs):
        raise AssertionError("cmake or ninja ran for an up-to-date build")

    monkeypatch.setattr(cmake_build, "configure", forbidden)
    monkeypatch.setattr(cmake_build, "build", forbidden)
    monkeypatch.setattr(cmake_build, "run_logged", forbidden)
    start = time.perf_counter()
    again = build(BuildRequest(source=str(tree)))
    elapsed = time.perf_counter() - start
    assert again.up_to_date and again.manifest == first.manifest
    print(f"up-to-date check took {elapsed * 1000:.0f} ms")  # target < 500 ms; see docs/benchmarks.md


def test_changed_source_rebuilds_incrementally(tree):
    first = build(BuildRequest(source=str(tree)))
    (tree / "tool.c").write_text('#include <stdio.h>\nint main(void) { puts("v2"); return 0; }\n')
    second = build(BuildRequest(source=str(tree)))
    assert not second.up_to_date and second.manifest["key"] == first.manifest["key"]
    assert "configure_seconds" not in second.timings  # build.ninja exists: ninja alone
    out = subprocess.run([second.manifest["binaries"]["llama-bench"]], capture_output=True, text=True).stdout
    assert out.strip() == "v2"


def test_build_output_arrives_line_by_line(tmp_path):
    """ninja's status lines go through stdio; they must reach the progress bar as written,
    not when a pipe buffer fills. The child waits for us to have seen its first line."""
    seen = tmp_path / "seen"
    child = (
        "import os, sys, time\n"
        "print('one')\n"
        f"deadline = time.time() + 30\n"
        f"while not os.path.exists({str(seen)!r}) and time.time() < deadline: time.sleep(0.02)\n"
        f"print('two' if os.path.exists({str(seen)!r}) else 'buffered')\n"
    )
    lines = []

    def on_line(line: str) -> None:
        lines.append(line)
        seen.touch()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdio buffering as ninja has it
    rc = cmake_build.run_logged(
        [sys.executable, "-c", child], cwd=None, env=env, log=io.StringIO(), on_line=on_line, line_buffered=True
    )
    assert rc == 0 and lines == ["one", "two"]


def test_compile_error_prints_the_log_tail_and_installs_nothing(tree):
    (tree / "server.c").write_text("int main(void) { this is not C; }\n")
    con, out = _console()
    with pytest.raises(ActionFailed, match=r"ninja build failed \(exit \d+\); full log: .*build.log"):
        build(BuildRequest(source=str(tree)), console=con)
    assert "last " in out.getvalue() and "error" in out.getvalue().lower()
    assert not list(builds_dir().glob("*/bin/llama-server")) and not list(builds_dir().glob("*/manifest.json"))


def _as_a_terminal_delivers_ctrl_c() -> None:
    """preexec_fn: SIGINT at its default in the child, as in a terminal's foreground job. A
    shell ignores SIGINT in its background jobs (`pytest & other-work` in a script), and the
    child inherits that: Python then never turns SIGINT into KeyboardInterrupt, and this test
    waited 60 s for an exit that could not come (issue 22). A user's Ctrl+C reaches a
    foreground bonsai with the default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_when_started(tree: Path, marker: str, env: dict[str, str]) -> tuple[subprocess.Popen, int, str]:
    """Start `bonsai build`, wait for the step named by `marker` to start, send Ctrl+C's signal,
    and wait for bonsai to exit. Returns the process, the step's pid and stderr."""
    (tree / marker).write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bonsai_launch", "build", "--source", str(tree)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_terminal_delivers_ctrl_c,
    )
    pid_file = tree / f"{marker}.pid"
    # Generous bounds: they wait for events (the step started, bonsai exited), and a loaded
    # 2-core machine can take long to start Python and cmake; a hang still fails.
    deadline = time.monotonic() + 300
    while not pid_file.is_file() or not pid_file.read_text().strip():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the {marker} step never started"
        time.sleep(0.1)
    step = int(pid_file.read_text())
    proc.send_signal(signal.SIGINT)  # what Ctrl+C delivers to bonsai (the compiler has its own group)
    _out, err = proc.communicate(timeout=120)
    (tree / marker).unlink()
    pid_file.unlink()
    return proc, step, err


def _step_gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("marker", ["SLOW", "SLOW_CONFIGURE"], ids=["while-compiling", "while-configuring"])
def test_interrupted_build_leaves_no_installed_binary(tree, isolated_home, marker):
    env = dict(os.environ, BONSAI_HOME=str(isolated_home))
    proc, step, err = _interrupt_when_started(tree, marker, env)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _step_gone(step), "the build step outlived the interrupt"
    assert not list(builds_dir().glob("*/bin/llama-server")) and not list(builds_dir().glob("*/manifest.json"))

    # The next run continues in the same build folder and installs.
    result = build(BuildRequest(source=str(tree)))
    assert result.server.is_file()
    if marker == "SLOW":  # configuring had finished: ninja alone carries on
        assert "configure_seconds" not in result.timings


def test_compile_commands_name_the_source_by_a_path_no_patch_series_changes(tmp_path, monkeypatch):
    # ccache keys on the paths in each compile command. The patched source folder's name carries
    # the series' hash, so naming it directly made every patch change a cold build.
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    use_pin(monkeypatch, write_pin(tmp_path / "vendor", archive, sha), help_patch(tmp_path / "patches").parent)
    result = build(BuildRequest())
    link = result.key_dir / "src"
    assert link.is_symlink() and "-p" in link.resolve().parent.name  # the real folder is per series
    ninja_file = (result.key_dir / "work" / "build.ninja").read_text()
    assert str(link) in ninja_file and str(link.resolve()) not in ninja_file


def test_ensure_server_builds_when_nothing_is_installed(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    use_pin(monkeypatch, write_pin(tmp_path / "vendor", archive, sha))
    from bonsai_launch.llamacpp.choice import choose_server

    assert choose_server(resolve({}), "mainline").path is None
    con, out = _console()
    server = ensure_server(console=con)
    assert server.is_file() and "no llama-server is built for cpu yet" in out.getvalue()
    assert choose_server(resolve({}), "mainline").path == server


def test_git_source(tmp_path, tree):
    git = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(tree)], check=True)
    subprocess.run([*git, "-C", str(tree), "add", "."], check=True)
    subprocess.run([*git, "-C", str(tree), "commit", "-q", "-m", "fake"], check=True)
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = build(BuildRequest(source=f"git+{tree.as_uri()}@main"))
    src = result.manifest["source"]
    assert src["kind"] == "git" and src["commit"] == commit and src["build_number"] == 1


def test_cli_build_json_then_up_to_date(tree, isolated_home):
    env = dict(os.environ, BONSAI_HOME=str(isolated_home))
    argv = [sys.executable, "-m", "bonsai_launch", "build", "--source", str(tree)]
    first = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    manifest = json.loads(first.stdout)
    assert manifest["up_to_date"] is False and "draft-dspark" in manifest["capabilities"]["spec_types"]
    second = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert second.returncode == 0 and second.stdout.strip() == manifest["binaries"]["llama-server"]
    assert "up to date" in second.stderr


def test_cuda_without_nvcc_names_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    from bonsai_launch.cli import main

    monkeypatch.setattr(sys, "argv", ["bonsai", "build", "--backend", "cuda"])
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main.run()
    assert exit_info.value.code == 2 and time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert err.startswith("error: --backend cuda needs the CUDA toolkit, but nvcc was not found")
    assert "nvidia-cuda-toolkit" in err and "Traceback" not in err
    assert not (builds_dir().exists() and any(builds_dir().iterdir()))


def _tools(**found: str) -> toolchain.Toolchain:
    names = ("cc", "cxx", "cmake", "ninja", "ccache", "nvcc", "hipconfig", "glslc", "git")
    return toolchain.Toolchain(**{n: toolchain.Tool(n, found.get(n)) for n in names})


def _hw(gpus=(), os_name="Linux", arch="x86_64") -> Hardware:
    return Hardware(os_name, arch, 2, 2, 8 * 2**30, tuple(gpus))


def test_choose_backend():
    h200 = GPU(0, "NVIDIA H200", 141 * 2**30, 140 * 2**30, "9.0")
    auto = backend.choose_backend("auto", _hw([h200]), _tools(nvcc="/usr/bin/nvcc"))
    assert auto.backend == "cuda" and "-DCMAKE_CUDA_ARCHITECTURES=90" in auto.cmake_flags
    assert backend.choose_backend("auto", _hw([h200]), _tools()).backend == "cpu"  # GPU but no nvcc
    assert backend.choose_backend("auto", _hw(), _tools(nvcc="/usr/bin/nvcc")).backend == "cpu"  # nvcc, no GPU
    assert backend.choose_backend("auto", _hw(), _tools(nvcc="/usr/bin/nvcc")).reason.startswith(
        "nvcc found but no NVIDIA GPU"
    )
    assert backend.choose_backend("auto", _hw(), _tools()).reason == "no GPU toolchain found"
    explicit = backend.choose_backend("cuda", _hw(), _tools(nvcc="/usr/bin/nvcc"), cuda_archs="86,89")
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89" in explicit.cmake_flags
    with pytest.raises(BonsaiError, match="--cuda-archs"):
        backend.choose_backend("cuda", _hw(), _tools(nvcc="/usr/bin/nvcc"))
    assert backend.cuda_archs_from_gpus(["12.0", "8.6", "8.6"]) == ["120a", "86"]
    assert backend.choose_backend("auto", _hw(os_name="Darwin", arch="arm64"), _tools()).backend == "metal"
    with pytest.raises(BonsaiError, match="macOS on Apple Silicon"):
        backend.choose_backend("metal", _hw(), _tools())
    with pytest.raises(BonsaiError, match="ROCm"):
        backend.choose_backend("hip", _hw(), _tools())
    with pytest.raises(BonsaiError, match="Vulkan SDK"):
        backend.choose_backend("vulkan", _hw(), _tools())
    with pytest.raises(BonsaiError, match="not known"):
        backend.choose_backend("opencl", _hw(), _tools())


LAVAPIPE_SUMMARY = """Devices:
========
GPU0:
	apiVersion         = 1.3.230
	deviceType         = PHYSICAL_DEVICE_TYPE_CPU
	deviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
	driverName         = llvmpipe
"""
RADEON_SUMMARY = LAVAPIPE_SUMMARY.replace("GPU0:", "GPU1:") + LAVAPIPE_SUMMARY.replace(
    "PHYSICAL_DEVICE_TYPE_CPU", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"
).replace("llvmpipe (LLVM 15.0.6, 256 bits)", "AMD Radeon RX 7900 XTX (RADV NAVI31)").replace(
    "Devices:\n========\n", ""
)


def test_auto_builds_vulkan_only_for_a_vulkan_gpu_never_for_lavapipe(monkeypatch):
    """Debian's Vulkan packages bring lavapipe, a CPU implementation: with only that, `auto`
    builds for the CPU (a Vulkan build would be ~17x slower and, on Debian 12, fails to
    compile); a real Vulkan GPU makes it Vulkan; an explicit --backend vulkan is obeyed."""
    from bonsai_launch.core import hardware as machine

    lavapipe = machine.parse_vulkaninfo_summary(LAVAPIPE_SUMMARY)
    assert lavapipe == (machine.VulkanDevice("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU (software)"),)
    mesa = "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)"
    with_driver = LAVAPIPE_SUMMARY.replace("\tdeviceName", f"\tdriverInfo         = {mesa}\n\tdeviceName")
    assert machine.parse_vulkaninfo_summary(with_driver)[0].driver == mesa
    both = machine.parse_vulkaninfo_summary(RADEON_SUMMARY)
    assert [d.is_gpu for d in both] == [False, True] and both[1].name.startswith("AMD Radeon")

    sdk = _tools(glslc="/usr/bin/glslc")
    monkeypatch.setattr(backend, "vulkan_sdk_present", lambda tools: tools.glslc.found)
    monkeypatch.setattr(
        machine, "vulkan_devices", lambda system=None, fresh=False: machine.VulkanDevices(lavapipe, "vulkaninfo")
    )
    chosen = backend.choose_backend("auto", _hw(), sdk)
    assert chosen.backend == "cpu" and "no Vulkan GPU" in chosen.reason
    assert backend.choose_backend("vulkan", _hw(), sdk).backend == "vulkan"  # asked for: obeyed
    monkeypatch.setattr(
        machine, "vulkan_devices", lambda system=None, fresh=False: machine.VulkanDevices(both, "vulkaninfo")
    )
    chosen = backend.choose_backend("auto", _hw(), sdk)
    assert chosen.backend == "vulkan" and "AMD Radeon RX 7900 XTX" in chosen.reason


def test_without_vulkaninfo_a_render_node_stands_in_for_a_gpu(monkeypatch):
    from bonsai_launch.core import hardware as machine

    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    monkeypatch.setattr(machine.glob, "glob", lambda pattern: [])
    assert machine.vulkan_devices("Linux").gpus == ()
    monkeypatch.setattr(machine.glob, "glob", lambda pattern: ["/dev/dri/renderD128"])
    assert machine.vulkan_devices("Linux").gpus and machine.vulkan_devices("Linux").how == "render node"
    assert machine.vulkan_devices("Windows").gpus == ()  # no vulkaninfo: not guessed


def test_default_cpu_flags_are_the_warm_cache_flags():
    # The first real build reused a ccache filled by a hand build with exactly these flags.
    assert cmake_build.base_flags(11434) == [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_NUMBER=11434",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_APP=OFF",
        "-DGGML_NATIVE=ON",
        "-DGGML_CCACHE=ON",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
    ]
    assert "-DGGML_NATIVE=OFF" in cmake_build.base_flags(1, native=False)
    assert cmake_build.parse_step("[12/214] Building CXX object ggml/src/ggml.c.o") == (
        12,
        214,
        "Building CXX object ggml/src/ggml.c.o",
    )
    assert cmake_build.parse_step("-- Configuring done") is None


def test_find_installed_prefers_the_current_pin_and_patches(tmp_path, monkeypatch):
    from bonsai_launch.llamacpp.builds.install import write_manifest

    archive, sha = make_sdist(tmp_path / "dist")
    pin = write_pin(tmp_path / "vendor", archive, sha)
    use_pin(monkeypatch, pin, help_patch(tmp_path / "patches").parent)
    from bonsai_launch.llamacpp.builds.patches import load_series, series_hash

    current = series_hash(load_series(tmp_path / "patches"))

    def install(key: str, built_at: str, identity: str, patches: str, backend: str = "cpu") -> Path:
        key_dir = builds_dir() / key
        (key_dir / "bin").mkdir(parents=True)
        server = key_dir / "bin" / "llama-server"
        server.write_text("")
        write_manifest(
            key_dir,
            {
                "schema": 1,
                "key": key,
                "backend": backend,
                "built_at": built_at,
                "source": {"identity": identity},
                "patches_hash": patches,
                "binaries": {"llama-server": str(server)},
            },
        )
        return server

    assert find_installed("cpu") is None
    local = install("cpu-local", "2026-01-03", "local:/src", "")
    assert find_installed("cpu") == local
    old_patches = install("cpu-old", "2026-01-01", sha, "")
    assert find_installed("cpu") == old_patches  # the pin beats a newer local build
    current_build = install("cpu-now", "2026-01-02", sha, current)
    install("cuda-now", "2026-01-04", sha, current, backend="cuda")
    assert find_installed("cpu") == current_build


def test_a_failing_chat_page_build_still_builds_the_server(tree):
    """npm fails (the real npm, on a tools/ui whose build script exits 3): the server is built and
    installed without the page, and the manifest and `bonsai build` say why; the build never fails
    for the page."""
    import json as _json
    import shutil as _shutil

    if _shutil.which("npm") is None:
        import real_parts

        real_parts.missing("no npm on PATH", "apt-get install nodejs npm (or pip install -e '.[ui]')")
    ui = tree / "tools" / "ui"
    ui.mkdir(parents=True)
    (tree / "scripts").mkdir(exist_ok=True)
    (tree / "scripts" / "ui-assets.cmake").write_text("# stands in for b11434's script\n")
    (ui / "package.json").write_text(_json.dumps({"name": "ui", "version": "1.0.0", "scripts": {"build": "exit 3"}}))
    lock = {"name": "ui", "version": "1.0.0", "lockfileVersion": 3, "packages": {"": {"name": "ui"}}}
    (ui / "package-lock.json").write_text(_json.dumps(lock))
    con, out = _console()
    result = build(BuildRequest(backend="cpu", source=str(tree)), console=con)
    ui_state = result.manifest["ui"]
    assert result.server.is_file() and ui_state["page"] is False, ui_state
    assert "npm run build failed (exit 3" in ui_state["reason"] and ui_state["key"].startswith("ui-")
    assert "no chat page: npm run build failed" in out.getvalue()
