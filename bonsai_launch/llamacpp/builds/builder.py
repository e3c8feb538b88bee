"""`bonsai build` as a library: plan a build, skip it when up to date, else run and install it.

A build is keyed by what decides its output: the source (sdist sha256, git commit or local
folder), the patch series, the backend, the cmake flags, the compiler and the chat page's assets
when it has them (webui.py: built with npm once per pin; without them the key is as before). Each key has its
own folder under BONSAI_HOME/builds/<key>/ with `work/` (cmake's build folder, kept for
incremental rebuilds), `bin/`, `manifest.json` and `build.log`. The up-to-date check reads
a few small files and runs nothing but `c++ --version`: it takes well under half a second.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.paths import bonsai_home, builds_dir, exe_name
from bonsai_launch.llamacpp.builds import cmake as cmake_build
from bonsai_launch.llamacpp.builds import fallback, lookup, preflight, toolchain, webui
from bonsai_launch.llamacpp.builds.backend import choose_backend
from bonsai_launch.llamacpp.builds.install import install_binaries, read_manifest, write_manifest
from bonsai_launch.llamacpp.builds.patches import load_series, series_hash, touching
from bonsai_launch.llamacpp.builds.pin import load_pin
from bonsai_launch.llamacpp.builds.source import SourceTree, parse_source, prepare

EXE = exe_name("")  # ".exe" on Windows
COLD_CPU_NOTE = "a cold CPU build takes about 12 minutes on 2 cores (seconds with a warm ccache)"
COLD_GPU_NOTES = {  # measured: docs/benchmarks.md, Build times
    "cuda": "a cold CUDA build takes about 21 minutes on 2 cores for one architecture (ccache makes rebuilds cheap)",
    "vulkan": "a cold Vulkan build takes about 10 minutes on 2 cores (ccache makes rebuilds cheap)",
}
COLD_GPU_NOTE = "a cold GPU build takes longer than a CPU one (tens of minutes on a few cores)"


@dataclass(frozen=True)
class BuildRequest:
    backend: str = "auto"
    source: str | None = None  # None: the pin
    cuda_archs: str | None = None
    gpu_targets: str | None = None
    jobs: int | None = None
    portable: bool = False
    force: bool = False
    targets: tuple[str, ...] = cmake_build.TARGETS
    # auto's GPU choice, not the user's: when that build fails, say so and build for the CPU (fallback.py)
    fall_back_to_cpu: bool = False


@dataclass(frozen=True)
class BuildPlan:
    """Everything decided before anything runs: plain data, printable, comparable."""

    key: str
    backend: str
    backend_reason: str
    source: SourceTree
    patches_hash: str
    cmake_flags: tuple[str, ...]
    targets: tuple[str, ...]
    jobs: int
    compiler: dict[str, Any]
    cmake: Path
    ninja: Path
    key_dir: Path
    vcvars: str | None = None  # Windows without a developer prompt: build inside this .bat's environment
    notes: tuple[str, ...] = ()  # what the preflight wants said (a CUDA toolkit from PyPI, no driver)
    ui: webui.UiAssets = webui.NOT_ASKED  # the chat page embedded, or why none

    @property
    def work_dir(self) -> Path:
        return self.key_dir / "work"

    @property
    def log_path(self) -> Path:
        return self.key_dir / "build.log"


@dataclass(frozen=True)
class BuildResult:
    manifest: dict[str, Any]
    server: Path
    up_to_date: bool
    key_dir: Path
    timings: dict[str, float] = field(default_factory=dict)


def default_jobs(backend: str) -> int:
    """One job per core, but no more than memory allows (about 1 GiB per C++ job, 3 for GPU)."""
    cpus = os.cpu_count() or 1
    try:
        import psutil

        available = psutil.virtual_memory().available
    except Exception:
        return cpus
    per_job = (3 if backend in ("cuda", "hip") else 1) * 2**30
    return max(1, min(cpus, available // per_job))


def _key(material: dict[str, Any], backend: str, name: str = "") -> str:
    """`cpu-42dcf22328ae`; a named source's builds read as theirs: `cpu-prismml-0a1b2c3d4e5f`."""
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:12]
    return f"{backend}-{name}-{digest}" if name else f"{backend}-{digest}"


def plan_build(request: BuildRequest, *, console=None) -> BuildPlan:
    """Choose the backend, prepare the source (downloading it if needed) and name the build.

    The toolchain checks come first, so a missing nvcc fails in seconds, before any download.
    """
    pin = load_pin()
    spec = parse_source(request.source, pin)
    tools = toolchain.detect(versions=False)
    if not tools.cc.found or not tools.cxx.found:
        import platform

        looked = {
            "Windows": "$CC/$CXX, cl, clang-cl, gcc, clang, Visual Studio via vswhere",
            "Darwin": "$CC/$CXX, the Xcode command line tools",
        }.get(platform.system(), "$CC/$CXX, cc, c++, gcc, g++, clang")
        raise BonsaiError(f"no C/C++ compiler was found (looked for {looked})", toolchain.compiler_hint())
    cmake, ninja = toolchain.cmake_exe(), toolchain.ninja_exe()
    if cmake is None or ninja is None:
        raise BonsaiError(
            "the cmake and ninja PyPI packages are not installed in bonsai's environment",
            "pip install cmake ninja (they are dependencies of bonsai-launch)",
        )
    choice = choose_backend(
        request.backend,
        lookup.hardware_for(request.backend, tools),
        tools,
        cuda_archs=request.cuda_archs,
        gpu_targets=request.gpu_targets,
    )
    if request.jobs is not None and request.jobs < 1:
        raise BonsaiError(f"--jobs {request.jobs} must be at least 1", "omit it to use one job per core")
    # Before any download or configure: can this machine build the backend? (seconds)
    checked = preflight.check(choice.backend, tools)

    # Our patches are made against the pinned tree; another ref or a folder is built as it is.
    series = load_series() if spec.kind == "pin" else ()
    source = prepare(spec, pin, series, console=console, force=request.force)
    patches_id = series_hash(series)
    # The page first: its assets are part of what the build makes (and of its key). Never fails.
    # Only the patches that change the page's sources decide its assets: a kernel patch must not
    # cost an npm build of minutes.
    ui_patches = series_hash(touching(series, webui.UI_PATHS))
    ui = webui.provide(
        source.path, source.identity, ui_patches, source.build_number, console=console, retry=request.force
    )
    flags = cmake_build.base_flags(
        source.build_number, source.commit, native=not request.portable, ccache=tools.ccache.found
    ) + list(choice.cmake_flags + checked.cmake_flags)
    compiler = {"cc": tools.cc.path, "cxx": tools.cxx.path, "id": toolchain.compiler_id(str(tools.cxx.path))}
    material = {
        "source": source.identity,
        "patches": patches_id,
        "backend": choice.backend,
        "flags": cmake_build.key_flags(flags),
        "compiler": compiler,
        "targets": list(request.targets),
    }
    if ui.page:
        material["ui"] = ui.key
    key = _key(material, choice.backend, spec.name)
    return BuildPlan(
        key,
        choice.backend,
        choice.reason,
        source,
        patches_id,
        tuple(flags),
        tuple(request.targets),
        request.jobs or default_jobs(choice.backend),
        compiler,
        cmake,
        ninja,
        builds_dir() / key,
        tools.vcvars.path,
        checked.notes,
        ui,
    )


def current_install(plan: BuildPlan) -> dict[str, Any] | None:
    """The manifest of this exact build when it is installed and its source is unchanged."""
    data = read_manifest(plan.key_dir)
    if data is None or data.get("source", {}).get("fingerprint") != plan.source.fingerprint:
        return None
    for target in plan.targets:
        path = Path(data.get("binaries", {}).get(target, ""))
        if not path.is_file():
            return None
    return data


def build_env(vcvars: str | None = None) -> dict[str, str]:
    """cmake and ninja from the PyPI packages first on PATH; ccache paths relative to BONSAI_HOME
    so the cache is shared between build folders (and with an earlier build of the same tree).
    On Windows without a developer prompt, `vcvars` (vcvars64.bat) supplies MSVC's environment."""
    env = dict(os.environ)
    if vcvars:
        env.update(toolchain.msvc_environment(vcvars))
    dirs = [str(p.parent) for p in (toolchain.cmake_exe(), toolchain.ninja_exe()) if p is not None]
    env["PATH"] = os.pathsep.join(dict.fromkeys(dirs + env.get("PATH", "").split(os.pathsep)))
    env.setdefault("CCACHE_BASEDIR", str(bonsai_home().resolve()))
    return env


def _announce(plan: BuildPlan, console) -> None:
    if console is None:
        return
    note = COLD_CPU_NOTE if plan.backend == "cpu" else COLD_GPU_NOTES.get(plan.backend, COLD_GPU_NOTE)
    console.print(
        f"building llama-server ({plan.backend}: {plan.backend_reason}) from {plan.source.spec} "
        f"with {plan.jobs} job{'s' if plan.jobs != 1 else ''}; {note}"
    )
    for note in plan.notes:
        console.print(f"[dim]{note}[/]")
    console.print(f"[dim]build folder {plan.key_dir}, log {plan.log_path}[/]")


def _stable_source_path(src: Path, key_dir: Path) -> Path:
    """The source tree as `<key_dir>/src`, a link to the real folder, so that every compile
    command names it as `../src/...` from the build folder. The real folder's name carries the
    patch series' hash; with it in the paths, ccache (which makes paths relative to
    CCACHE_BASEDIR but keeps the names) missed on every file when one patch changed, and a
    one-file kernel patch cost a cold 12-minute build. Where links cannot be made (Windows
    without developer mode), the real path is used as before."""
    link = key_dir / "src"
    try:
        if link.is_symlink() and link.resolve() != src:
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(src, target_is_directory=True)
    except OSError:
        return src
    return link.absolute()


def run_build(plan: BuildPlan, *, console=None, force: bool = False) -> BuildResult:
    """Configure (when needed), compile, install and write the manifest, under a lock."""
    from filelock import FileLock

    from bonsai_launch.llamacpp.binaries import probe

    plan.key_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(plan.key_dir / ".lock")):
        if not force:
            existing = current_install(plan)
            if existing is not None:  # another bonsai built it while we waited for the lock
                return BuildResult(existing, Path(existing["binaries"]["llama-server"]), True, plan.key_dir)
        _announce(plan, console)
        env = build_env(plan.vcvars)
        src, work = _stable_source_path(plan.source.path.resolve(), plan.key_dir), plan.work_dir.resolve()
        timings: dict[str, float] = {}
        with open(plan.log_path, "w") as log:
            log.write(f"# bonsai build {plan.key} at {datetime.now(UTC).isoformat()}\n")
            # Configure again when forced, when never finished, or when flags that are not part of
            # the key (ccache appeared or went) changed; otherwise ninja alone is incremental.
            flags_file = work / ".bonsai-cmake-flags.json"
            wanted = json.dumps([str(src), *plan.cmake_flags])
            configured = (work / "build.ninja").is_file() and flags_file.is_file() and flags_file.read_text() == wanted
            if force or not configured:
                flags_file.unlink(missing_ok=True)
                timings["configure_seconds"] = cmake_build.configure(
                    plan.cmake, src, work, list(plan.cmake_flags), env, log, plan.log_path, console
                )
                flags_file.write_text(wanted)
            webui.install_into(plan.ui, work)  # before ninja: ui-assets.cmake embeds what is there
            timings["compile_seconds"] = cmake_build.build(
                plan.ninja,
                work,
                plan.targets,
                plan.jobs,
                env,
                log,
                plan.log_path,
                console,
                label=f"llama.cpp {plan.backend}",
            )
        binaries = install_binaries(work / "bin", plan.key_dir, tuple(t + EXE for t in plan.targets))
        server = binaries["llama-server" + EXE]
        caps = probe(server)
        manifest = {
            "schema": 1,
            "key": plan.key,
            "backend": plan.backend,
            "backend_reason": plan.backend_reason,
            "source": {**plan.source.to_json(), "fingerprint": plan.source.fingerprint},
            "patches_hash": plan.patches_hash,
            "cmake_flags": list(plan.cmake_flags),
            "targets": list(plan.targets),
            "jobs": plan.jobs,
            "compiler": plan.compiler,
            "build_seconds": round(sum(timings.values()), 2),
            **{k: round(v, 2) for k, v in timings.items()},
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "binaries": {t.removesuffix(EXE): str(p) for t, p in binaries.items()},
            "version": caps.version,
            "capabilities": caps.to_json(),
            "ui": plan.ui.to_json(),
            "work_dir": str(plan.work_dir),
            "log": str(plan.log_path),
        }
        write_manifest(plan.key_dir, manifest)
    return BuildResult(manifest, server, False, plan.key_dir, timings)


def build(request: BuildRequest | None = None, *, console=None) -> BuildResult:
    """Build (or find up to date) llama-server for `request`; returns the manifest and path.
    A GPU build `auto` chose (request.fall_back_to_cpu) that cannot be built says why, where its
    log is, and gives way to the CPU build; a backend the user named stops with the error."""
    request = request or BuildRequest()
    try:
        plan = plan_build(request, console=console)
    except preflight.PreflightFailed as exc:
        if not request.fall_back_to_cpu:
            raise
        return _fall_back(request, exc.backend, str(exc.message), None, console)
    if not request.force:
        existing = current_install(plan)
        if existing is not None:
            return BuildResult(existing, Path(existing["binaries"]["llama-server"]), True, plan.key_dir)
    tools = toolchain.detect(versions=False)
    try:
        result = run_build(plan, console=console, force=request.force)
    except ActionFailed as exc:
        if plan.backend != "cpu":
            fallback.record_failure(plan.backend, tools, exc.message, plan.log_path)
        if not request.fall_back_to_cpu or plan.backend == "cpu":
            raise
        return _fall_back(request, plan.backend, exc.message.split(";")[0], plan.log_path, console)
    fallback.clear_failure(plan.backend)
    return result


def _fall_back(request: BuildRequest, backend: str, message: str, log: Path | None, console) -> BuildResult:
    if console is not None:
        console.print(fallback.fallback_note(backend, message, log), markup=False, highlight=False)
    return build(replace(request, backend="cpu", fall_back_to_cpu=False), console=console)


def ensure_server(
    backend: str = "auto", *, console=None, flavour: str = "mainline", min_release: int | None = None
) -> Path:
    """The llama-server to launch for `backend`, building it first when none fits.

    An up-to-date build of the pin wins. Without one, a build the user made on purpose from
    another source (a git ref, a folder) for this backend is used as it is. Otherwise the pin
    is built now, which is announced with how long it takes. A fork build (`flavour="fork"`)
    is any installed fork build of at least `min_release`, else the pinned fork release
    (`--source prismml`), built now. `auto` (BONSAI_BACKEND unset) falls back to the CPU build
    when the GPU build it chose cannot be made; a named backend's failure stops.
    """
    if console is None:
        from bonsai_launch.core.console import console as make_console

        console = make_console(stderr=True)
    requested, explicit = fallback.requested_backend(None if backend == "auto" else backend)
    wanted = requested if explicit else lookup.detected_backend()
    if flavour == "fork":
        found = lookup.find_installed(wanted, "fork", min_release)
        if found is not None:
            return found
        forks = lookup.fork_sources()
        if not forks:
            raise BonsaiError("vendor/llama.cpp/pin.toml names no PrismML fork source", "reinstall bonsai-launch")
        older = lookup.find_installed(wanted, "fork") is not None
        console.print(
            f"no PrismML fork llama-server {'of b' + str(min_release) + ' or newer ' if older else ''}"
            f"is built for {wanted} yet: building {forks[0].ref} now (--source {forks[0].name})"
        )
        fork_request = BuildRequest(backend=wanted, source=forks[0].name, fall_back_to_cpu=not explicit)
        return build(fork_request, console=console).server
    mine = lookup.builds_of(wanted, "mainline")
    pinned = [data for data in mine if data.get("source", {}).get("kind") == "pin"]
    if not pinned and mine:
        return Path(mine[0]["binaries"]["llama-server"])
    if not pinned:
        console.print(f"no llama-server is built for {wanted} yet: building it now")
    return build(BuildRequest(backend=wanted, fall_back_to_cpu=not explicit), console=console).server
