"""The build self-test (issue 38): a build proves itself on the machine it runs on, in seconds,
on tiny files it writes, with no network. Run at the end of `bonsai build` (for the build it
made, when no record of it exists yet) and by `bonsai doctor --self-test`.

plan_self_test (pure) decides which checks a build gets; run_self_test runs them, writes the
verdict beside the manifest (llamacpp/builds/selftest_record.py, which also says what a failure
changes) and returns it. The checks (selftest_checks.py):
- kernels: the CPU kernels of the served weight types against the reference (CPU builds);
- hybrid_two_slots: a tiny qwen35 target on 2 slots with 2 concurrent requests answers what one
  request at a time does, repacking on (the AMX case, run everywhere);
- speculative: draft-mtp on the same hybrid target is lossless against plain;
- gpu_offload (GPU builds): the tiny model fully offloaded against the CPU build's next-token
  distribution, within the Vulkan lane's tolerance.
"""

from __future__ import annotations

import platform
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bonsai_launch.llamacpp.builds import selftest_record

FAULTS = ("hybrid", "gpu", "speculative")


@dataclass(frozen=True)
class SelfTestPlan:
    key_dir: Path
    server: Path
    backend: str
    checks: tuple[str, ...]
    cpu_server: Path | None = None  # the reference of the GPU check
    fault: str | None = None  # BONSAI_SELF_TEST_FAULT: a check forced to see a wrong answer
    threads: int = 2
    our_patches: bool = True  # the pin with our patch series: the kernel check also asks for our kernels


def plan_self_test(
    manifest: dict[str, Any], *, cpu_server: Path | None = None, fault: str | None = None
) -> SelfTestPlan:
    server = Path(manifest["binaries"]["llama-server"])
    backend = str(manifest.get("backend", "cpu"))
    checks = ["kernels"] if backend == "cpu" else []
    checks += [selftest_record.HYBRID, "speculative"]
    if backend != "cpu":
        checks.append(selftest_record.GPU)
    source = manifest.get("source", {})
    ours = source.get("kind") == "pin" and bool(source.get("patches"))
    key_dir = server.resolve().parent.parent
    return SelfTestPlan(key_dir, server, backend, tuple(checks), cpu_server, fault, our_patches=ours)


def cpu_flags() -> dict[str, bool]:
    """What the CPU offers of the flags our kernels branch on (Linux: /proc/cpuinfo)."""
    names = {"avx2": "avx2", "avx512": "avx512f", "avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni"}
    names |= {"amx": "amx_int8"}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    return {k: v in flags for k, v in names.items()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_self_test(plan: SelfTestPlan, *, console=None) -> dict[str, Any]:
    """Run the planned checks, keep the verdict beside the manifest, return it."""
    from bonsai_launch.server import selftest_checks as checks

    start = time.monotonic()
    results: list[dict[str, Any]] = []
    device = cpu_name() if plan.backend == "cpu" else plan.backend
    log_path = plan.key_dir / "selftest.log"
    with tempfile.TemporaryDirectory(prefix="bonsai-selftest-") as tmp, open(log_path, "w") as log:
        log.write(f"# bonsai self-test of {plan.key_dir.name} at {datetime.now(UTC).isoformat()}\n")
        for name in plan.checks:
            t0 = time.monotonic()
            try:
                result = checks.RUNNERS[name](plan, Path(tmp), log)
            except Exception as exc:  # a check that cannot run is a failed check, with why
                result = {"status": "failed", "detail": f"{type(exc).__name__}: {exc}"}
            result = {"name": name, **result, "seconds": round(time.monotonic() - t0, 2)}
            if result.get("device"):
                device = result.pop("device")
            log.write(f"## {name}: {result['status']} {result.get('detail', '')}\n")
            results.append(result)
            if console is not None:
                colour = {"passed": "green", "failed": "red"}.get(result["status"], "yellow")
                console.print(
                    f"  self-test {name}: [{colour}]{result['status']}[/] {result.get('detail', '')} "
                    f"[dim]({result['seconds']:.1f} s)[/]"
                )
    record = {
        "schema": selftest_record.SCHEMA,
        "key": plan.key_dir.name,
        "backend": plan.backend,
        "binary": plan.server.name,
        "binary_stamp": selftest_record.binary_stamp(plan.server),
        "ran_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - start, 2),
        "passed": all(r["status"] != "failed" for r in results),
        "cpu_flags": cpu_flags(),
        "device": device,
        "fault": plan.fault,
        "checks": results,
        "log": str(log_path),
    }
    selftest_record.write_record(plan.key_dir, record)
    why = selftest_record.failed(record, selftest_record.GPU)
    if plan.backend != "cpu":
        from bonsai_launch.llamacpp.builds import fallback, toolchain

        if why is not None:  # remembered like a failed compile: `auto` skips it
            fallback.record_failure(
                plan.backend, toolchain.detect(versions=False), f"its self-test failed: {why}", log_path
            )
        elif any(c["name"] == selftest_record.GPU and c["status"] == "passed" for c in results):
            fallback.clear_failure(plan.backend)  # a rerun that passes on the device: usable again
    return record


def ensure_self_test(
    manifest: dict[str, Any], *, console=None, fault: str | None = None
) -> tuple[dict[str, Any], bool]:
    """The build's verdict: the kept one when its binary is unchanged and no fault is asked for,
    else a fresh run (`bonsai build` after every build, cached or not, costs one file read).
    Returns (verdict, whether it ran now)."""
    key_dir = Path(manifest["binaries"]["llama-server"]).resolve().parent.parent
    kept = selftest_record.read_record(key_dir)
    if kept is not None and fault is None and kept.get("fault") is None:
        return kept, False
    plan = plan_self_test(manifest, cpu_server=cpu_reference(manifest), fault=fault)
    return run_self_test(plan, console=console), True


def cpu_reference(manifest: dict[str, Any]) -> Path | None:
    """The GPU check's reference: the CPU build, else (a GPU machine that built only its GPU
    backend) the same binary with nothing offloaded (-ngl 0, its CPU backend)."""
    if manifest.get("backend") == "cpu":
        return None
    from bonsai_launch.llamacpp.builds.lookup import find_installed

    try:
        found = find_installed("cpu")
    except Exception:  # an unreadable pin: the GPU build's own CPU path still serves as reference
        found = None
    return found or Path(manifest["binaries"]["llama-server"])


def after_build(result, request, *, console=None, fault: str | None = None):
    """`bonsai build`'s last step: the self-test of the build it made or found (kept verdicts
    cost one file read). A GPU build failing its GPU check is remembered like a failed compile
    (`auto` launches then use the CPU build); auto's build goes on with the CPU build, a backend
    the user named stops. Returns (build result, verdict, whether it ran now)."""
    from dataclasses import replace

    from bonsai_launch.core.errors import ActionFailed
    from bonsai_launch.llamacpp.builds import fallback
    from bonsai_launch.llamacpp.builds.builder import build

    record, ran = ensure_self_test(result.manifest, console=console, fault=fault)
    backend = str(result.manifest.get("backend"))
    why = selftest_record.failed(record, selftest_record.GPU)
    if backend == "cpu" or why is None:
        return result, record, ran
    log = Path(record["log"])
    if not request.fall_back_to_cpu:
        raise ActionFailed(
            f"the {backend} build's self-test failed its GPU check: {why}",
            f"the log is {log} (please report it); `--backend cpu` runs on the CPU build",
        )
    if console is not None:
        console.print(fallback.fallback_note(backend, f"its self-test failed: {why}", log), markup=False)
    cpu = build(replace(request, backend="cpu", fall_back_to_cpu=False), console=console)
    return after_build(cpu, replace(request, backend="cpu"), console=console, fault=fault)


def summary(record: dict[str, Any], ran: bool = True) -> str:
    """One line for `bonsai build`: passed in N s, or which checks failed and where the log is."""
    bad = [c for c in record.get("checks", []) if c.get("status") == "failed"]
    kept = "" if ran else f", kept from {record.get('ran_at')} (`bonsai doctor --self-test` reruns it)"
    if not bad:
        return f"self-test passed in {record.get('seconds', 0):.1f} s ({len(record.get('checks', []))} checks{kept})"
    names = "; ".join(f"{c['name']}: {c.get('detail', '')}" for c in bad)
    return f"self-test FAILED ({names}){kept}; log: {record.get('log')}"
