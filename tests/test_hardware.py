"""Hardware detection never crashes: a missing library or driver means "not present"."""

from __future__ import annotations

import builtins
import os
import sys

from bonsai_launch.core import hardware


def test_detect_on_this_machine():
    hw = hardware.detect()
    assert hw.physical_cores >= 1 and hw.ram_bytes > 0
    assert hw.to_json()["ram_gb"] > 0


def test_cores_and_memory_without_psutil_agree_with_psutil(monkeypatch):
    """Linux reads sysfs and sysconf (psutil's import is ~20 ms of every start); the figures
    must be psutil's own, and psutil must not be imported for them."""
    import psutil

    want = (psutil.cpu_count(logical=False), psutil.cpu_count(logical=True), psutil.virtual_memory().total)
    monkeypatch.delitem(sys.modules, "psutil")
    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        assert name != "psutil", "hardware.detect imported psutil on Linux"
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    assert hardware._cores_and_ram("Linux") == want


def test_nvml_without_driver_means_no_gpu(monkeypatch):
    import pynvml

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert hardware.detect().gpus == ()


def test_missing_nvml_library_is_a_note_not_a_crash(monkeypatch):
    monkeypatch.setattr(hardware, "_nvidia_driver_may_be_loaded", lambda: True)
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    hw = hardware.detect()
    assert hw.gpus == () and any("nvidia-ml-py" in n for n in hw.notes)


def test_gpu_listing_through_nvml(monkeypatch):
    import pynvml

    class Mem:
        total, free = 24 * 2**30, 20 * 2**30

    monkeypatch.setattr(hardware, "_nvidia_driver_may_be_loaded", lambda: True)
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: Mem)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA H200")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda h: (9, 0))
    (gpu,) = hardware.detect().gpus
    assert gpu.name == "NVIDIA H200" and gpu.compute_capability == "9.0" and gpu.free_bytes == 20 * 2**30


def test_without_an_nvidia_driver_nvml_is_not_imported(monkeypatch):
    monkeypatch.setattr(hardware, "_nvidia_driver_may_be_loaded", lambda: False)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    assert hardware.detect().gpus == () and "pynvml" not in sys.modules


_SUMMARY = """Devices:
========
GPU0:
	deviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
	deviceName         = Some GPU
"""


def test_vulkaninfo_is_asked_once_until_a_driver_changes(tmp_path, monkeypatch):
    """`auto` asks for the Vulkan devices on every launch; vulkaninfo loads every driver."""
    calls = tmp_path / "calls"
    exe = tmp_path / "bin" / "vulkaninfo"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\necho x >> {calls}\ncat <<'EOF'\n{_SUMMARY}EOF\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    ran = lambda: len(calls.read_text().splitlines()) if calls.exists() else 0  # noqa: E731
    first = hardware.vulkan_devices("Linux")
    assert first.gpus[0].name == "Some GPU" and ran() == 1
    assert hardware.vulkan_devices("Linux") == first and ran() == 1  # remembered
    assert hardware.vulkan_devices("Linux", fresh=True) == first and ran() == 2  # doctor asks anew
    monkeypatch.setenv("VK_ICD_FILENAMES", str(tmp_path / "other_icd.json"))  # another driver
    hardware.vulkan_devices("Linux")
    assert ran() == 3
