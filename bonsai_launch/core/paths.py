"""Where bonsai keeps its caches, and what its binaries are called on this system.

Everything lives under BONSAI_HOME. Its default: Linux and macOS $XDG_CACHE_HOME/bonsai or
~/.cache/bonsai (where huggingface_hub keeps its cache too); Windows %LOCALAPPDATA%\bonsai,
found by platformdirs (which asks Windows for the folder when the variable is missing).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_home(platform: str | None = None) -> Path:
    """BONSAI_HOME when the variable is not set. `platform` (a sys.platform value) is for tests."""
    if (platform or sys.platform) == "win32":
        from platformdirs.windows import Windows

        # user_data_dir without an author and not roaming: %LOCALAPPDATA%\bonsai. Local, not
        # roaming: builds and models are large and belong to this machine.
        return Path(Windows(appname="bonsai", appauthor=False, roaming=False).user_data_dir)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "bonsai"


def bonsai_home() -> Path:
    value = os.environ.get("BONSAI_HOME", "").strip()
    if value:
        return Path(value).expanduser()
    return default_home()


def exe_name(stem: str, platform: str | None = None) -> str:
    """The file name of a program: `llama-server` here, `llama-server.exe` on Windows."""
    return stem + ".exe" if (platform or sys.platform) == "win32" and not stem.lower().endswith(".exe") else stem


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
    package = Path(__file__).resolve().parent.parent  # bonsai_launch/ (this file is in core/)
    installed = package / "_data"
    if installed.is_dir():
        return installed
    return package.parent


def builtin_profiles_dir() -> Path:
    return package_data_dir() / "profiles"


def vendor_dir() -> Path:
    return package_data_dir() / "vendor" / "llama.cpp"
