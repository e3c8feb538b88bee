"""Gathering the plan's inputs: settings, profile, model files, hardware, binary.

This is the edge between the user's world (flags, environment, files on disk, the machine)
and the pure plan. It reads headers and probes hardware but starts nothing.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bonsai_launch.errors import BonsaiError
from bonsai_launch.paths import profile_models_dir
from bonsai_launch.profiles import Profile, get_profile, profile_name_for
from bonsai_launch.settings import Settings, resolve


@dataclass(frozen=True)
class Selection:
    """Which profile the user means, and the merged settings."""

    profile: Profile
    settings: Settings


def select(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Selection:
    """Resolve settings in two passes: the profile is chosen first (flags/env only), then its
    own settings join the precedence chain below the user's."""
    env = os.environ if env is None else env
    first = resolve(flags, env)
    if first.is_explicit("profile"):
        profile = get_profile(first["profile"], "--profile" if first.source("profile") == "flag" else "BONSAI_PROFILE")
    else:
        profile = get_profile(profile_name_for(first["family"], first["size"]), "BONSAI_FAMILY/BONSAI_MODEL")
    settings = resolve(flags, env, profile.settings)
    # Record the profile actually chosen, and where that choice came from.
    values = dict(settings.values)
    from bonsai_launch.settings import Resolved

    values["profile"] = Resolved(profile.name, first.source("profile") if first.is_explicit("profile") else "default")
    return Selection(profile, Settings(values))


@dataclass(frozen=True)
class ModelFiles:
    model: Path
    drafter: Path | None
    mmproj: Path | None
    drafter_unavailable: str | None  # why the profile's drafter cannot be used, if it cannot


def local_path(profile: Profile, file_name: str) -> Path:
    return profile_models_dir(profile.name) / file_name


def model_files(selection: Selection, model: str | None, drafter: str | None) -> ModelFiles:
    """The files to launch: explicit paths win, else the profile's files for the layout."""
    profile, s = selection.profile, selection.settings
    layout = s["layout"]
    if model:
        model_path = Path(model).expanduser()
    else:
        entry = profile.file("model", layout)
        if entry is None:
            raise BonsaiError(f"profile {profile.name} has no {layout} weights file",
                              "set BONSAI_LAYOUT to another layout or pass --model PATH")
        model_path = local_path(profile, entry.name)

    drafter_path: Path | None = Path(drafter).expanduser() if drafter else None
    unavailable = None
    if drafter_path is None and profile.has_role("drafter"):
        entry = profile.file("drafter", layout)
        if entry is None:
            others = [f.name for f in profile.files if f.role == "drafter"]
            unavailable = (f"its published drafter {', '.join(others)} is for the PrismML fork only; "
                           "a dflash conversion can be passed with --drafter")
        else:
            drafter_path = local_path(profile, entry.name)

    mmproj_path = None
    entry = profile.file("mmproj", layout)
    if entry is not None and s["vision"]:
        mmproj_path = local_path(profile, entry.name)
    return ModelFiles(model_path, drafter_path, mmproj_path, unavailable)


def option_table(capabilities):
    """llama-server's option table: the probed binary's, else the pinned build's (the one
    `bonsai start` builds when none is built yet)."""
    from bonsai_launch.llama_options import pinned_table

    if capabilities is not None and capabilities.options is not None:
        return capabilities.options
    return pinned_table()


def gather_plan(
    flags: Mapping[str, Any],
    model: str | None = None,
    drafter: str | None = None,
    passthrough: tuple[str, ...] = (),
    binary: Path | None = None,
    env: Mapping[str, str] | None = None,
):
    """Everything `bonsai start` decides before running anything, as a LaunchPlan.

    `binary` is the llama-server to probe; None plans for a binary not built yet (dry run),
    skipping the capability checks, which the real start then makes.
    """
    from bonsai_launch import hardware
    from bonsai_launch.binaries import probe
    from bonsai_launch.gguf_info import inspect_gguf
    from bonsai_launch.passthrough import inherited_env_warnings, parse as parse_passthrough
    from bonsai_launch.plan import PlanInputs, build_plan

    selection = select(flags, env)
    files = model_files(selection, model, drafter)
    if not files.model.is_file():
        raise BonsaiError(f"model file {files.model} is not present",
                          f"run `bonsai pull --profile {selection.profile.name}` or pass --model PATH")
    target = inspect_gguf(files.model)
    drafter_info = None
    if files.drafter is not None and (selection.settings["speculative"] or drafter):
        if not files.drafter.is_file():
            raise BonsaiError(f"drafter file {files.drafter} is not present",
                              f"run `bonsai pull --profile {selection.profile.name}` or pass --drafter PATH")
        drafter_info = inspect_gguf(files.drafter)
    mmproj = files.mmproj if files.mmproj is not None and files.mmproj.is_file() else None
    capabilities = probe(binary) if binary is not None else None
    args = parse_passthrough(passthrough, option_table(capabilities))
    inputs = PlanInputs(
        settings=selection.settings,
        model=target,
        hardware=hardware.detect(),
        binary=str(binary) if binary is not None else "llama-server",
        profile=selection.profile if not model or selection.settings.is_explicit("profile") else None,
        drafter=drafter_info,
        mmproj=mmproj,
        capabilities=capabilities,
        passthrough=args,
        drafter_unavailable=files.drafter_unavailable,
    )
    plan = build_plan(inputs)
    inherited = inherited_env_warnings(os.environ if env is None else env, args.table or option_table(None))
    return dataclasses.replace(plan, warnings=plan.warnings + tuple(inherited)) if inherited else plan
