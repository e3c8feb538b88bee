"""What `bonsai doctor` checks: hardware, toolchains, builds, models, the default port.

Gathering only reads and probes (nothing is built or downloaded); every problem found
carries the fix. The CLI renders the report as text or JSON.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError


@dataclass(frozen=True)
class Problem:
    severity: str  # "error": bonsai cannot work; "warning": something is missing or slower
    what: str
    fix: str


@dataclass
class Report:
    hardware: dict[str, Any] = field(default_factory=dict)
    toolchain: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)  # per backend: devices seen, preflight
    builds: list[dict[str, Any]] = field(default_factory=list)
    fork_only_files: list[str] = field(default_factory=list)  # catalog files only a PrismML fork build loads
    llama_server: dict[str, Any] | None = None
    models: list[dict[str, Any]] = field(default_factory=list)
    port: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = not any(p.severity == "error" for p in self.problems)
        return data


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _toolchain(report: Report, hw) -> Any:
    from bonsai_launch.llamacpp.builds import toolchain
    from bonsai_launch.llamacpp.builds.backend import choose_backend

    tools = toolchain.detect(versions=True)
    report.toolchain = tools.to_json()
    add = report.problems.append
    if not tools.cc.found or not tools.cxx.found:
        add(Problem("error", "no C/C++ compiler found", toolchain.compiler_hint(hw.os)))
    if not tools.cmake.found or not tools.ninja.found:
        add(Problem("error", "the cmake/ninja PyPI packages are missing", "pip install cmake ninja"))
    if not tools.ccache.found:
        add(
            Problem(
                "warning",
                "ccache is not installed: every rebuild compiles from scratch",
                toolchain.hint("ccache", hw.os),
            )
        )
    if hw.gpus and not tools.nvcc.found:
        add(
            Problem(
                "warning",
                f"an NVIDIA GPU ({hw.gpus[0].name}) is present but nvcc is not: builds are CPU-only",
                toolchain.hint("cuda", hw.os),
            )
        )
    try:
        choice = choose_backend("auto", hw, tools)
        report.backend = {"backend": choice.backend, "reason": choice.reason, "cmake_flags": list(choice.cmake_flags)}
    except Exception as exc:  # a BonsaiError from a half-installed GPU toolchain
        report.backend = {"backend": "cpu", "reason": str(exc), "cmake_flags": []}
    _backends(report, hw, tools)
    return tools


def _preflight(backend: str, tools) -> dict[str, Any]:
    from bonsai_launch.llamacpp.builds import preflight

    try:
        done = preflight.check(backend, tools)
    except preflight.PreflightFailed as exc:
        return {"ok": False, "problem": exc.message, "fix": exc.fix}
    return {"ok": True, "notes": list(done.notes)}


def _backends(report: Report, hw, tools) -> None:
    """Per GPU backend: the devices seen, whether its toolchain passes the preflight (run only
    where some of it is installed), and what a launch without --backend will use and why."""
    from bonsai_launch.core import hardware
    from bonsai_launch.llamacpp.builds import backend as backends
    from bonsai_launch.llamacpp.builds import fallback

    vulkan = hardware.vulkan_devices(hw.os, fresh=True)
    seen: dict[str, dict[str, Any]] = {
        "cuda": {"devices": [f"{g.name} (cc {g.compute_capability})" for g in hw.gpus], "how": "NVML"},
        "vulkan": {"devices": [f"{d.name} ({d.kind})" for d in vulkan.devices], "how": vulkan.how},
        "metal": {"devices": ["Apple Silicon GPU"] if hw.metal else [], "how": "platform"},
    }
    if hw.os == "Linux" and tools.hipconfig.found:
        seen["hip"] = {"devices": backends._hip_targets(), "how": "amdgpu-arch"}
    present = {
        "cuda": backends.cuda_compiler_present(tools),
        "vulkan": tools.glslc.found or backends.vulkan_sdk_present(tools),
        "hip": tools.hipconfig.found,
    }
    for name, entry in seen.items():
        if present.get(name):
            entry["preflight"] = _preflight(name, tools)
            failed = fallback.recorded_failure(name, tools)
            if failed:
                entry["failed_build"] = failed
    report.backends = seen
    requested, explicit = fallback.requested_backend(None) if _env_ok(report) else ("auto", False)
    chosen = report.backend.get("backend", "cpu")
    if explicit:
        report.backend.update(launch=requested, launch_reason=f"BONSAI_BACKEND={requested}")
    elif chosen != "cpu" and seen.get(chosen, {}).get("failed_build"):
        failed = seen[chosen]["failed_build"]
        report.backend.update(launch="cpu", launch_reason=f"the {chosen} build failed ({failed['log']})")
    elif chosen != "cpu" and not seen.get(chosen, {}).get("preflight", {"ok": True})["ok"]:
        check = seen[chosen]["preflight"]
        report.backend.update(launch="cpu", launch_reason=f"{chosen} cannot be built here: {check['problem']}")
        report.problems.append(Problem("warning", check["problem"] + "; start falls back to the CPU", check["fix"]))
    else:
        report.backend.update(launch=chosen, launch_reason=report.backend.get("reason"))


def _env_ok(report: Report) -> bool:
    from bonsai_launch.llamacpp.builds import fallback

    try:
        fallback.requested_backend(None)
    except BonsaiError as exc:  # a bad BONSAI_BACKEND
        report.problems.append(Problem("error", exc.message, "set BONSAI_BACKEND to a backend named, or unset it"))
        return False
    return True


def _builds(report: Report) -> None:
    from bonsai_launch.core.paths import builds_dir
    from bonsai_launch.llamacpp.builds.install import installed_builds
    from bonsai_launch.llamacpp.builds.patches import load_series, series_hash
    from bonsai_launch.llamacpp.builds.pin import load_pin

    try:
        pinned, patches_id = load_pin().default, series_hash(load_series())
    except Exception as exc:
        report.problems.append(Problem("error", f"the llama.cpp pin cannot be read: {exc}", "reinstall bonsai-launch"))
        pinned, patches_id = None, None
    from bonsai_launch.llamacpp.flavours import fork_only_files, kind_of_manifest, runnable_profiles, too_old_for

    try:
        from bonsai_launch.config.profiles import load_all

        profiles = list(load_all().values())
    except Exception:  # reported by _models
        profiles = []
    for key_dir, m in installed_builds(builds_dir()):
        caps = m.get("capabilities", {})
        kind = kind_of_manifest(m)
        report.builds.append(
            {
                "key": m.get("key"),
                "backend": m.get("backend"),
                "version": m.get("version"),
                "flavour": kind.flavour,
                "fork_release": kind.release,
                "kind": kind.label(),
                "profiles": runnable_profiles(kind, profiles),
                "too_old_for": too_old_for(kind.release, profiles) if kind.flavour == "fork" else [],
                "build_number": caps.get("build_number"),
                "source": m.get("source", {}).get("spec"),
                "is_pin": pinned is not None and m.get("source", {}).get("identity") == pinned.sha256,
                "current_patches": m.get("patches_hash") == patches_id,
                "built_at": m.get("built_at"),
                "build_seconds": m.get("build_seconds"),
                "llama_server": m.get("binaries", {}).get("llama-server"),
                "spec_types": caps.get("spec_types", []),
                "devices": _devices_now(m) if m.get("backend") != "cpu" else caps.get("devices", []),
                "path": str(key_dir),
            }
        )
    report.fork_only_files = fork_only_files(profiles)
    wanted = report.backend.get("launch") or report.backend.get("backend", "cpu")
    _old_forks(report, wanted, profiles)
    mine = [b for b in report.builds if b["backend"] == wanted and b["flavour"] == "mainline"]
    if not mine:
        report.problems.append(
            Problem(
                "warning",
                f"no llama-server is built for {wanted}",
                "run `bonsai build` (or let `bonsai start` build it; a cold CPU build takes about 12 minutes on 2 cores)",
            )
        )
    elif pinned and not any(b["is_pin"] for b in mine):
        report.problems.append(
            Problem(
                "warning",
                f"no {wanted} build of the pinned llama.cpp ({pinned.package}=={pinned.version})",
                "run `bonsai build`",
            )
        )
    elif pinned and not any(b["is_pin"] and b["current_patches"] for b in mine):
        report.problems.append(
            Problem(
                "warning",
                f"the {wanted} build of the pin predates the current patch series (vendor/llama.cpp/patches)",
                "run `bonsai build`",
            )
        )
    for b in mine:
        if b["is_pin"] and "draft-dspark" not in b["spec_types"]:
            report.problems.append(
                Problem("warning", f"build {b['key']} does not list draft-dspark", "run `bonsai build --force`")
            )


def _devices_now(manifest: dict[str, Any]) -> list[str]:
    """A GPU build's devices as its llama-server lists them now (the probe cache notices a GPU or
    driver that appeared since the build), not as the manifest recorded them at build time."""
    from bonsai_launch.llamacpp.binaries import probe

    server = manifest.get("binaries", {}).get("llama-server")
    try:
        return list(probe(server).devices) if server else []
    except Exception:  # a build whose binary is gone or broken: what it listed when built
        return list(manifest.get("capabilities", {}).get("devices", []))


def _old_forks(report: Report, backend: str, profiles: list) -> None:
    """Fork builds all older than what some profiles want: say which, and how to build the pin.
    The older builds keep running the profiles they load."""
    from bonsai_launch.llamacpp.flavours import FORK_BUILD_COMMAND, fork_release_wanted

    forks = [b for b in report.builds if b["backend"] == backend and b["flavour"] == "fork"]
    if not forks:
        return
    releases = [b["fork_release"] for b in forks]
    if any(r is None for r in releases):
        return  # a build of unknown release may be new enough: not claimed otherwise
    newest = max(releases)
    behind = sorted((w, p.name) for p in profiles if (w := fork_release_wanted(p)) is not None and newest < w)
    if not behind:
        return
    wanted = max(w for w, _ in behind)
    try:
        from bonsai_launch.llamacpp.builds.lookup import fork_sources

        pinned = next((f.ref for f in fork_sources()), "the pinned fork")
    except Exception:
        pinned = "the pinned fork"
    report.problems.append(
        Problem(
            "warning",
            f"the newest PrismML fork build for {backend} is b{newest}, older than the b{wanted} that "
            f"{', '.join(name for _, name in behind)} want",
            f"run `{FORK_BUILD_COMMAND}` (it builds {pinned}); the b{newest} build stays usable for the profiles it loads",
        )
    )


def _explicit_server(report: Report) -> None:
    import os

    from bonsai_launch.llamacpp.binaries import probe

    # BONSAI_LLAMA_SERVER names the binary, BONSAI_LLAMA_BIN (the reference's setting) its folder.
    name = next((n for n in ("BONSAI_LLAMA_SERVER", "BONSAI_LLAMA_BIN") if os.environ.get(n, "").strip()), None)
    if name is None:
        return
    explicit = os.environ[name].strip()
    try:
        from bonsai_launch.config.settings import resolve
        from bonsai_launch.llamacpp.choice import explicit_binary

        found = explicit_binary(resolve())
        assert found is not None
        caps = probe(found[0])
        report.llama_server = {
            "path": str(found[0]),
            "setting": name,
            **caps.to_json(),
            "flags": len(caps.flags),
            "options": len(caps.options.options) if caps.options else 0,
        }
        if "draft-dspark" not in caps.spec_types:
            report.problems.append(
                Problem(
                    "warning",
                    f"{name}={explicit} does not know draft-dspark (DSpark drafters need it)",
                    f"unset {name} to use `bonsai build`'s binary",
                )
            )
    except Exception as exc:
        report.llama_server = {"path": explicit, "setting": name, "error": str(exc)}
        report.problems.append(
            Problem(
                "error", f"{name}={explicit} cannot be used: {exc}", "point it at a working llama-server or unset it"
            )
        )


def _models(report: Report) -> None:
    from bonsai_launch.config.profiles import load_all
    from bonsai_launch.server.inputs import local_path

    try:
        profiles = load_all()
    except Exception as exc:
        report.problems.append(
            Problem("error", f"profiles cannot be loaded: {exc}", "fix or remove the profile file named")
        )
        return
    from bonsai_launch.models import lock as model_lock

    lock = model_lock.read_lock()
    for profile in profiles.values():
        profile = model_lock.apply(profile, lock)  # the files `bonsai pull` resolved from patterns
        present = [f.name for f in profile.files if f.name and local_path(profile, f.name).is_file()]
        if present:
            size = sum(local_path(profile, n).stat().st_size for n in present)
            report.models.append(
                {
                    "profile": profile.name,
                    "files": present,
                    "bytes": size,
                    "complete": len(present) == len(profile.files),
                }
            )


def _port(report: Report) -> None:
    from bonsai_launch.config.settings import resolve

    try:
        s = resolve()
        host, port = s["host"], s["port"]
    except Exception as exc:
        report.problems.append(Problem("error", str(exc), "fix the BONSAI_* variable named"))
        return
    free = port_free(host if host in ("127.0.0.1", "localhost", "::1") else "127.0.0.1", port)
    report.port = {"host": host, "port": port, "free": free}
    if not free:
        report.problems.append(
            Problem(
                "warning",
                f"port {port} on {host} is in use (another llama-server?)",
                "stop it (`bonsai ps`, `bonsai stop`) or set BONSAI_PORT to a free port",
            )
        )


def _self_tests(report: Report, rerun: bool, fault: str | None, console=None) -> None:
    """Each build's self-test verdict (`--self-test` reruns it for the builds of the current pin
    and patches), and a problem for each failed check, saying what bonsai does about it."""
    from bonsai_launch.llamacpp.builds import selftest_record as rec
    from bonsai_launch.llamacpp.builds.install import read_manifest
    from bonsai_launch.server import selftest

    for entry in report.builds:
        key_dir = Path(entry["path"])
        current = entry["is_pin"] and entry["current_patches"] and entry["flavour"] == "mainline"
        if rerun and current and (manifest := read_manifest(key_dir)) is not None:
            if console is not None:
                console.print(f"self-test of {entry['key']}:")
            plan = selftest.plan_self_test(manifest, cpu_server=selftest.cpu_reference(manifest), fault=fault)
            record: dict[str, Any] | None = selftest.run_self_test(plan, console=console)
        else:
            record = rec.read_record(key_dir)
        entry["self_test"] = record
        if record is None:
            if current:
                report.problems.append(
                    Problem(
                        "warning", f"build {entry['key']} has no self-test verdict", "run `bonsai doctor --self-test`"
                    )
                )
            continue
        log = record.get("log")
        if rec.failed(record, rec.HYBRID):
            report.problems.append(
                Problem(
                    "warning",
                    f"build {entry['key']}: {rec.hybrid_workaround(record)}",
                    f"`bonsai start` does this for hybrid targets on 2+ slots; report the log ({log})",
                )
            )
        for refusal in rec.refused_types(record).values():
            report.problems.append(
                Problem("error", f"build {entry['key']}: {refusal}", "report the log; `bonsai build --force`")
            )
        if gpu_why := rec.failed(record, rec.GPU):
            report.problems.append(
                Problem(
                    "warning",
                    f"build {entry['key']}: the GPU check failed ({gpu_why}); `auto` uses the CPU build, --backend "
                    f"{entry['backend']} stops",
                    f"report the log ({log}); `bonsai doctor --self-test` checks again",
                )
            )
        if spec_why := rec.failed(record, "speculative"):
            report.problems.append(
                Problem(
                    "warning",
                    f"build {entry['key']}: the speculative check failed ({spec_why})",
                    f"report the log ({log})",
                )
            )


def gather(self_test: bool = False, fault: str | None = None, console=None) -> Report:
    from bonsai_launch.core import hardware

    report = Report()
    hw = hardware.detect()
    report.hardware = hw.to_json()
    _toolchain(report, hw)
    _builds(report)
    _self_tests(report, self_test, fault, console)
    _explicit_server(report)
    _models(report)
    _port(report)
    return report
