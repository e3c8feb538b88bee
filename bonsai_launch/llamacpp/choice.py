"""Choosing the llama-server binary for a launch: the user's own, or a build of the right flavour.

The user's binary comes from BONSAI_LLAMA_SERVER (a file) or BONSAI_LLAMA_BIN (a folder holding
llama-server, the reference launcher's setting). Otherwise `bonsai build`'s installed build for
the detected backend is used, of the flavour the profile needs: mainline, or PrismML's fork for
weights only the fork loads (Bonsai 2). A profile that needs the fork, with no fork build and no
way to fetch the fork, stops here, before anything is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.config.settings import Settings
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.flavours import FORK, FORK_BUILD_COMMAND, BuildKind, kind_of_manifest

EXE_NAMES = ("llama-server", "llama-server.exe")


@dataclass(frozen=True)
class ServerChoice:
    path: Path | None  # None: nothing fits yet (`bonsai start` builds it)
    kind: BuildKind
    origin: str  # where it came from, for messages: BONSAI_LLAMA_SERVER, BONSAI_LLAMA_BIN, or "bonsai build"
    assumed: bool = False  # a binary we did not build: its flavour is taken from the profile, not known


def explicit_binary(settings: Settings) -> tuple[Path, str] | None:
    """The user's llama-server and the setting that named it, or None. Both settings at once
    are refused: one of them would be ignored."""
    server, folder = settings.get("llama_server"), settings.get("llama_bin")
    if server and folder:
        raise BonsaiError(
            f"BONSAI_LLAMA_SERVER={server!r} and BONSAI_LLAMA_BIN={folder!r} are both set",
            "set only one: BONSAI_LLAMA_SERVER names the binary, BONSAI_LLAMA_BIN its folder",
        )
    if server:
        from bonsai_launch.llamacpp.binaries import explicit_server

        return explicit_server(server), "BONSAI_LLAMA_SERVER"  # a file; on Windows `.exe` may be left out
    if folder:
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise BonsaiError(
                f"BONSAI_LLAMA_BIN={folder!r} is not a folder",
                "point it at the folder holding llama-server, or unset it",
            )
        for name in EXE_NAMES:
            if (path / name).is_file():
                return path / name, "BONSAI_LLAMA_BIN"
        raise BonsaiError(
            f"BONSAI_LLAMA_BIN={folder!r} holds no llama-server",
            "point it at the folder holding llama-server (e.g. llama.cpp/build/bin), or unset it",
        )
    return None


def kind_of_binary(binary: Path) -> BuildKind | None:
    """The kind of one of our builds (its manifest sits beside bin/), or None for a foreign binary."""
    from bonsai_launch.llamacpp.builds.install import read_manifest

    manifest = read_manifest(binary.resolve().parent.parent)
    if manifest is None:
        return None
    return kind_of_manifest(manifest)


def choose_server(
    settings: Settings, flavour: str, backend: str = "auto", min_release: int | None = None
) -> ServerChoice:
    """The binary to launch for a profile that needs `flavour` (and, on the fork, at least
    release `min_release`); path None when none is built."""
    explicit = explicit_binary(settings)
    if explicit is not None:
        path, origin = explicit
        known = kind_of_binary(path)
        if known is not None:
            return ServerChoice(path, known, origin)
        return ServerChoice(path, BuildKind(flavour), origin, assumed=True)
    from bonsai_launch.llamacpp.builds.lookup import find_installed

    installed = find_installed(backend, flavour, min_release)
    kind = kind_of_binary(installed) if installed is not None else None
    return ServerChoice(
        installed, kind or BuildKind(flavour, _pinned_fork_release() if flavour == FORK else None), "bonsai build"
    )


def _pinned_fork_release() -> int | None:
    from bonsai_launch.llamacpp.builds.lookup import fork_sources

    forks = fork_sources()
    return forks[0].release if forks else None


def require_fork_source(profile_name: str, min_release: int | None = None) -> None:
    """Before any download: a profile that needs a fork build, when none is built, goes on only
    if the pinned fork can be fetched now (it is then built by `bonsai start`). Otherwise one
    line naming the command that makes the build."""
    from bonsai_launch.llamacpp.builds.lookup import fork_sources
    from bonsai_launch.llamacpp.builds.source import RemoteUnreachable, check_remote

    forks = fork_sources()
    if not forks:
        raise BonsaiError(
            f"profile {profile_name} needs a PrismML fork build, and vendor/llama.cpp/pin.toml names no fork",
            "reinstall bonsai-launch, or set BONSAI_LLAMA_BIN to a fork build's folder",
        )
    fork = forks[0]
    try:
        check_remote(fork.url, fork.ref, f"`{FORK_BUILD_COMMAND}`")
    except RemoteUnreachable as exc:
        from bonsai_launch.llamacpp.builds.lookup import find_installed

        older = min_release is not None and find_installed("auto", FORK) is not None
        none = f"the fork builds here are older than b{min_release}" if older else "none is built"
        raise BonsaiError(
            f"profile {profile_name} needs a PrismML fork build of llama.cpp, {none}, and the fork "
            f"({fork.ref}) cannot be fetched here ({exc.reason}); nothing was downloaded",
            f"run `{FORK_BUILD_COMMAND}` where GitHub is reachable, or set BONSAI_LLAMA_BIN to the "
            "folder of a fork build's llama-server",
            exit_code=1,
        ) from None
