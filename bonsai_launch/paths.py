"""Where bonsai keeps its caches. Everything lives under BONSAI_HOME (default ~/.cache/bonsai)."""

from __future__ import annotations

import os
from pathlib import Path


def bonsai_home() -> Path:
    value = os.environ.get("BONSAI_HOME", "").strip()
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "bonsai"


def sources_dir() -> Path:
    return bonsai_home() / "sources"


def builds_dir() -> Path:
    return bonsai_home() / "builds"


def models_dir() -> Path:
    value = os.environ.get("BONSAI_MODELS_DIR", "").strip()
    return Path(value).expanduser() if value else bonsai_home() / "models"


def profile_models_dir(profile_name: str) -> Path:
    """One readable folder per profile: models/<profile>/<file as named in the repo>."""
    return models_dir() / profile_name


def logs_dir() -> Path:
    return bonsai_home() / "logs"


def run_dir() -> Path:
    """Pid and state files of detached servers."""
    return bonsai_home() / "run"


def package_data_dir() -> Path:
    """Data shipped with the package: profiles/ and vendor/llama.cpp/.

    A wheel carries them under bonsai_launch/_data; an editable install or a source checkout
    finds them at the repository root.
    """
    here = Path(__file__).resolve().parent
    installed = here / "_data"
    if installed.is_dir():
        return installed
    return here.parent


def builtin_profiles_dir() -> Path:
    return package_data_dir() / "profiles"


def vendor_dir() -> Path:
    return package_data_dir() / "vendor" / "llama.cpp"
