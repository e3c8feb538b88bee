"""What this machine has: CPU cores, RAM, NVIDIA GPUs, Apple Silicon, Vulkan devices.

A missing library or driver means "not present", never a crash: every probe is wrapped.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: str | None = None  # "9.0" for H100/H200


@dataclass(frozen=True)
class Hardware:
    os: str
    arch: str
    physical_cores: int
    logical_cores: int
    ram_bytes: int
    gpus: tuple[GPU, ...] = ()
    metal: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def ram_gb(self) -> float:
        return self.ram_bytes / 2**30

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus) or self.metal

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ram_gb"] = round(self.ram_gb, 1)
        return data


def _nvidia_driver_may_be_loaded() -> bool:
    """False only where we can tell cheaply: Linux with neither the driver's control node nor
    its /proc entry (every NVIDIA driver makes both)."""
    if platform.system() != "Linux":
        return True
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")


def _nvidia_gpus(notes: list[str]) -> tuple[GPU, ...]:
    if not _nvidia_driver_may_be_loaded():
        return ()  # nvmlInit would fail, after 30-40 ms of importing pynvml
    try:
        import pynvml
    except ImportError:
        notes.append("nvidia-ml-py not installed: NVIDIA GPUs not probed")
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU, container without /dev/nvidia*
        return ()
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                cc = f"{major}.{minor}"
            except Exception:
                cc = None
            gpus.append(
                GPU(i, name.decode() if isinstance(name, bytes) else str(name), int(mem.total), int(mem.free), cc)
            )
    except Exception as exc:
        notes.append(f"NVIDIA probe failed: {exc}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return tuple(gpus)


def _linux_physical_cores() -> int | None:
    """psutil's own first method (one core per distinct sibling list in sysfs), without importing
    psutil: its import is about 20 ms of every `bonsai start`."""
    lists = glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/core_cpus_list")
    lists = lists or glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list")
    seen = set()
    for path in lists:
        try:
            with open(path, "rb") as fh:
                seen.add(fh.read().strip())
        except OSError:
            return None
    return len(seen) or None


def _cores_and_ram(system: str) -> tuple[int, int, int]:
    """(physical cores, logical cores, RAM bytes): Linux from sysfs and sysconf; elsewhere (and
    whenever those fail) psutil."""
    physical = _linux_physical_cores() if system == "Linux" else None
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if system == "Linux" else 0
    except (ValueError, OSError):
        ram = 0
    if physical and ram > 0:
        return physical, os.cpu_count() or physical, ram
    import psutil

    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return physical, psutil.cpu_count(logical=True) or physical, int(psutil.virtual_memory().total)


def detect() -> Hardware:
    notes: list[str] = []
    system = platform.system()
    machine = platform.machine().lower()
    physical, logical, ram = _cores_and_ram(system)
    return Hardware(
        os=system,
        arch=machine,
        physical_cores=physical,
        logical_cores=logical,
        ram_bytes=ram,
        gpus=_nvidia_gpus(notes),
        metal=system == "Darwin" and machine in ("arm64", "aarch64"),
        notes=tuple(notes),
    )


# -- Vulkan ------------------------------------------------------------------------------------
# A Vulkan build pays only on a Vulkan GPU. Mesa's lavapipe (llvmpipe) is a real Vulkan
# implementation on the CPU: present wherever mesa-vulkan-drivers is installed, and ~17x slower
# than llama.cpp's CPU backend, so it never counts as a device `auto` builds for.
_VULKAN_GPU_TYPES = {
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": "discrete GPU",
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": "integrated GPU",
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": "virtual GPU",
}


@dataclass(frozen=True)
class VulkanDevice:
    name: str
    kind: str  # "discrete GPU", "integrated GPU", "virtual GPU", "CPU (software)" or "other"
    driver: str = ""  # vulkaninfo's driverInfo, e.g. "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)"

    @property
    def is_gpu(self) -> bool:
        return self.kind in _VULKAN_GPU_TYPES.values()


def parse_vulkaninfo_summary(text: str) -> tuple[VulkanDevice, ...]:
    """The devices `vulkaninfo --summary` lists (its deviceType, deviceName and driverInfo lines,
    per GPUn block)."""
    devices, kind, name, driver = [], None, None, ""
    for line in text.splitlines() + ["GPU_END:"]:
        stripped = line.strip()
        if stripped.startswith("GPU") and stripped.endswith(":"):
            if kind is not None or name is not None:
                devices.append(VulkanDevice(name or "unnamed", kind or "other", driver))
            kind = name = None
            driver = ""
        elif stripped.startswith("deviceType"):
            value = stripped.partition("=")[2].strip()
            kind = _VULKAN_GPU_TYPES.get(value, "CPU (software)" if value.endswith("_CPU") else "other")
        elif stripped.startswith("deviceName"):
            name = stripped.partition("=")[2].strip()
        elif stripped.startswith("driverInfo"):
            driver = stripped.partition("=")[2].strip()
    return tuple(devices)


@dataclass(frozen=True)
class VulkanDevices:
    devices: tuple[VulkanDevice, ...]
    how: str  # how we know: "vulkaninfo", or the fallback that stood in for it

    @property
    def gpus(self) -> tuple[VulkanDevice, ...]:
        return tuple(d for d in self.devices if d.is_gpu)


def vulkan_devices(system: str | None = None, *, fresh: bool = False) -> VulkanDevices:
    """The Vulkan devices here, software ones included (they are listed, never chosen by `auto`).
    `vulkaninfo --summary` when it is installed; on Linux without it, a GPU render node
    (/dev/dri/renderD*) stands in for "a Vulkan GPU may be present". vulkaninfo's answer is
    remembered (see _vulkaninfo_summary) unless `fresh`."""
    system = system or platform.system()
    exe = shutil.which("vulkaninfo")
    if exe:
        text = _vulkaninfo_summary(exe, system, fresh)
        if text is not None:
            return VulkanDevices(parse_vulkaninfo_summary(text), "vulkaninfo")
    if system == "Linux":
        nodes = sorted(glob.glob("/dev/dri/renderD*"))
        if nodes:
            return VulkanDevices((VulkanDevice(f"a GPU at {nodes[0]}", "integrated GPU"),), "render node")
    return VulkanDevices((), "no vulkaninfo" if not exe else "vulkaninfo failed")


# Where the Vulkan loader finds drivers (their JSON manifests); a driver installed or removed
# changes these folders, so the remembered summary is asked for again.
_VULKAN_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
_VULKAN_DRIVER_VARS = ("VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES")


def _vulkaninfo_summary(exe: str, system: str, fresh: bool) -> str | None:
    """`vulkaninfo --summary`'s output, kept under BONSAI_HOME/cache: it takes 0.1-0.5 s (it
    loads every driver), and `auto` asks on every `bonsai start`. Asked again when vulkaninfo,
    the drivers' manifests, the device nodes or the visibility variables change."""
    import hashlib

    from bonsai_launch.core import json_cache
    from bonsai_launch.core.paths import bonsai_home

    seen = [exe, str(_mtime(exe)), device_fingerprint(system)]
    seen += [f"{name}={os.environ[name]}" for name in _VULKAN_DRIVER_VARS if name in os.environ]
    for folder in _VULKAN_ICD_DIRS:
        seen += [f"{path}:{_mtime(path)}" for path in sorted(glob.glob(os.path.join(folder, "*.json")))]
    key = hashlib.sha256("\n".join(seen).encode()).hexdigest()[:20]
    cache = bonsai_home() / "cache" / "vulkaninfo.json"
    if not fresh:
        kept = json_cache.read(cache, key)
        if isinstance(kept, str):
            return kept
    try:
        done = subprocess.run([exe, "--summary"], capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    json_cache.write(cache, key, done.stdout)  # a read-only home: asked every time, as before
    return done.stdout


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


# -- What a binary's --list-devices depends on -------------------------------------------------
# A build probed where no GPU was visible records no devices (and plans -ngl 0); the probe cache
# (llamacpp/binaries.py) keys on this summary too, so the probe runs again once a GPU, a driver
# or a *_VISIBLE_DEVICES setting appears or changes.
_VISIBILITY_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GGML_VK_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)


def device_fingerprint(system: str | None = None) -> str:
    """A cheap summary (no process, no driver call) of the GPU devices a binary could see now:
    device nodes and the NVIDIA driver's version on Linux, the GPU runtimes' DLLs on Windows,
    and the device-visibility variables everywhere."""
    system = system or platform.system()
    seen = [f"{name}={os.environ[name]}" for name in _VISIBILITY_VARS if name in os.environ]
    if system == "Linux":
        for pattern in ("/dev/nvidia[0-9]*", "/dev/dri/renderD*", "/dev/kfd"):
            seen += sorted(glob.glob(pattern))
        try:
            with open("/proc/driver/nvidia/version") as fh:
                seen.append(fh.readline().strip())
        except OSError:
            pass
    elif system == "Windows":
        system32 = os.path.join(os.environ.get("SYSTEMROOT", r"C:\Windows"), "System32")
        for dll in ("nvcuda.dll", "amdhip64.dll", "amdhip64_6.dll", "vulkan-1.dll"):
            if os.path.isfile(os.path.join(system32, dll)):
                seen.append(dll)
    return "|".join(seen)
