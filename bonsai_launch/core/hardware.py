"""What this machine has: CPU cores, RAM, NVIDIA GPUs, Apple Silicon.

A missing library or driver means "not present", never a crash: every probe is wrapped.
"""

from __future__ import annotations

import os
import platform
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


def _nvidia_gpus(notes: list[str]) -> tuple[GPU, ...]:
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


def detect() -> Hardware:
    import psutil

    notes: list[str] = []
    system = platform.system()
    machine = platform.machine().lower()
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    logical = psutil.cpu_count(logical=True) or physical
    return Hardware(
        os=system,
        arch=machine,
        physical_cores=physical,
        logical_cores=logical,
        ram_bytes=int(psutil.virtual_memory().total),
        gpus=_nvidia_gpus(notes),
        metal=system == "Darwin" and machine in ("arm64", "aarch64"),
        notes=tuple(notes),
    )
