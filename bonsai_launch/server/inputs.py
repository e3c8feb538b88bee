"""Gathering the plan's inputs: settings, profile, model files, hardware, binary.

This is the edge between the user's world (flags, environment, files on disk, the machine)
and the pure plan. It reads headers and probes hardware but starts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import Profile, get_profile, load_all, profile_name_for
from bonsai_launch.config.settings import Settings, resolve
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import profile_models_dir
from bonsai_launch.llamacpp.flavours import BuildKind, choose_file, wanted_flavour, why_no_file


@dataclass(frozen=True)
class Selection:
    """Which profile the user means, and the merged settings."""

    profile: Profile
    settings: Settings

    @property
    def flavour(self) -> str:
        """The llama.cpp flavour to run: BONSAI_LAYOUT, else what the profile's weights need."""
        return wanted_flavour(self.profile, self.settings.get("layout"))

    @property
    def names_model(self) -> bool:
        """The user chose the model (profile, family or size), so its sampling applies to --model too."""
        return any(self.settings.is_explicit(k) for k in ("profile", "family", "size"))


def select(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Selection:
    """Resolve settings in two passes: the profile is chosen first (flags/env only), then its
    own settings join the precedence chain below the user's."""
    env = os.environ if env is None else env
    first = resolve(flags, env)
    if first.is_explicit("profile"):
        profile = get_profile(first["profile"], "--profile" if first.source("profile") == "flag" else "BONSAI_PROFILE")
    else:
        profile = get_profile(profile_name_for(first["family"], first["size"]), "BONSAI_FAMILY/BONSAI_MODEL")
    from bonsai_launch.models import lock as model_lock

    profile = model_lock.apply(profile)  # the names `bonsai pull` resolved from the repository
    settings = resolve(flags, env, profile.settings)
    # Record the profile actually chosen, and where that choice came from.
    values = dict(settings.values)
    from bonsai_launch.config.settings import Resolved

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


def explicit_model(selection: Selection, model: str | None) -> tuple[str, str] | None:
    """The user's own weights and where they were named: --model, else BONSAI_GGUF."""
    if model:
        return model, "--model"
    if selection.settings.get("gguf"):
        return selection.settings["gguf"], "BONSAI_GGUF"
    return None


def explicit_mmproj(selection: Selection) -> tuple[str, str] | None:
    """The user's own projector (--mmproj or BONSAI_MMPROJ) and where it was named."""
    s = selection.settings
    if not s.get("mmproj"):
        return None
    return s["mmproj"], "--mmproj" if s.source("mmproj") == "flag" else "BONSAI_MMPROJ"


def _check_known_file(path: Path, origin: str, kind: BuildKind) -> None:
    """A file the catalog knows by name (a legacy group-128 file, a fork-only file on a mainline
    build) is refused with the reason, before llama-server fails on it with a bare type error."""
    from bonsai_launch.llamacpp.flavours import cannot_load
    from bonsai_launch.models import lock as model_lock

    lock = model_lock.read_lock()
    for profile in load_all().values():
        for entry in model_lock.apply(profile, lock).files:  # resolved names too (patterns never match here)
            if entry.name == path.name and (why := cannot_load(entry, kind)):
                raise BonsaiError(
                    f"{origin}={str(path)!r} cannot run on this {kind.label()}: {why}",
                    "use a file this build loads (`bonsai models` lists which build each needs)",
                )


def model_files(
    selection: Selection, model: str | None, drafter: str | None, kind: BuildKind | None = None
) -> ModelFiles:
    """The files to launch: explicit paths win, else the profile's files for the build's kind."""
    profile, s = selection.profile, selection.settings
    kind = kind or BuildKind(selection.flavour)
    layout = kind.flavour
    named = explicit_model(selection, model)
    if named:
        model_path = Path(named[0]).expanduser()
        if named[1] == "BONSAI_GGUF" and not model_path.is_file():
            raise BonsaiError(f"BONSAI_GGUF={named[0]!r} is not a file", "point it at a local .gguf file or unset it")
        _check_known_file(model_path, named[1], kind)
    else:
        entry = choose_file(profile, "model", kind)
        if entry is None:
            raise BonsaiError(
                why_no_file(profile, "model", kind),
                "run it on a build that loads one (`bonsai models` shows which; BONSAI_LAYOUT "
                "picks mainline or fork, BONSAI_LLAMA_SERVER/BONSAI_LLAMA_BIN a binary), or pass --model PATH",
            )
        if not entry.name:
            raise BonsaiError(
                f"profile {profile.name}'s model ({entry.wanted} in {profile.repo}) is not resolved yet: "
                f"the lock has no entry for it",
                f"run `bonsai pull --profile {profile.name}` (it lists the repository once and records the file)",
            )
        model_path = local_path(profile, entry.name)

    # The profile's own drafter and projector go with its weights, or with the user's weights
    # when the user named the model (profile, family or size); never with an unrelated --model.
    profile_applies = not named or selection.names_model
    drafter_path: Path | None = Path(drafter).expanduser() if drafter else None
    unavailable = None
    if drafter_path is None and profile.has_role("drafter") and profile_applies:
        entry = profile.file("drafter", layout)
        if entry is None:
            others = [f.name for f in profile.files if f.role == "drafter"]
            unavailable = (
                f"its published drafter {', '.join(others)} is for the PrismML fork only; "
                "a dflash conversion can be passed with --drafter"
            )
        elif entry.convert:  # a legacy sidecar: what runs is its conversion (drafter_cache.py)
            from bonsai_launch.models.drafters.cache import profile_output

            drafter_path = profile_output(profile, entry)
        elif not entry.name:
            unavailable = f"its drafter ({entry.wanted}) is not resolved yet: `bonsai pull --profile {profile.name} --speculative`"
        else:
            drafter_path = local_path(profile, entry.name)

    mmproj_path = None
    named_mmproj = explicit_mmproj(selection)
    if named_mmproj:
        mmproj_path = Path(named_mmproj[0]).expanduser()
        if not mmproj_path.is_file():
            raise BonsaiError(
                f"{named_mmproj[1]}={named_mmproj[0]!r} is not a file",
                "point it at a local vision projector .gguf file or unset it",
            )
        if not s["vision"]:
            raise BonsaiError(f"{named_mmproj[1]} is set but BONSAI_VISION is off", "unset one of them")
    else:
        entry = choose_file(profile, "mmproj", kind) if profile_applies else None
        if entry is not None and entry.name and s["vision"]:
            mmproj_path = local_path(profile, entry.name)
    return ModelFiles(model_path, drafter_path, mmproj_path, unavailable)


def auto_decision(selection: Selection, files: ModelFiles, binary: Path | None, model: str | None, args):
    """BONSAI_SPECULATIVE=auto for this launch: (the selection with concrete speculative
    settings, the decision's info). The one lookup `start` and `config` share: the decision for
    these files, this binary and these server settings (`args`, the parsed passthrough)."""
    from bonsai_launch.decisions.auto import apply_auto
    from bonsai_launch.decisions.identity import server_conditions
    from bonsai_launch.server.passthrough import fold_settings

    subject = selection.profile.name if not explicit_model(selection, model) or selection.names_model else None
    conditions = server_conditions(fold_settings(selection.settings, args), args)
    return apply_auto(selection, files, binary, subject, conditions)


def option_table(capabilities):
    """llama-server's option table: the probed binary's, else the pinned build's (the one
    `bonsai start` builds when none is built yet)."""
    from bonsai_launch.llamacpp.options import pinned_table

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
    *,
    repack: bool = False,
):
    """Everything `bonsai start` decides before running anything, as a LaunchPlan.

    `binary` is the llama-server to probe; None plans for a binary not built yet (dry run),
    skipping the capability checks, which the real start then makes. `repack`: make the Q2_0
    repack of a PQ2_0/PTQ1_0 file now when it is missing (what a launch does; a dry run says it would).
    """
    from bonsai_launch.core import hardware
    from bonsai_launch.llamacpp.binaries import probe
    from bonsai_launch.llamacpp.choice import kind_of_binary
    from bonsai_launch.models.gguf import inspect_gguf
    from bonsai_launch.server.passthrough import inherited_env_warnings
    from bonsai_launch.server.passthrough import parse as parse_passthrough
    from bonsai_launch.server.plan import PlanInputs, build_plan

    selection = select(flags, env)
    # One of our builds knows its kind; any other binary is taken to be what the profile needs.
    known = kind_of_binary(binary) if binary is not None else None
    foreign = binary is not None and known is None  # a binary bonsai did not build: its manifest is absent
    kind = known or BuildKind(selection.flavour)
    files = model_files(selection, model, drafter, kind)
    if not files.model.is_file():
        raise BonsaiError(
            f"model file {files.model} is not present",
            f"run `bonsai pull --profile {selection.profile.name}` or pass --model PATH",
        )
    capabilities = probe(binary) if binary is not None else None
    self_test = _self_test_verdict(binary)
    args = parse_passthrough(passthrough, option_table(capabilities))
    tuning = None
    if selection.settings["speculative"] == "auto":
        # the measured decision for these files and server settings, or plain
        selection, tuning = auto_decision(selection, files, binary, model, args)
    from bonsai_launch.server.model_codec import path_on, serveable

    machine = hardware.detect()
    source = inspect_gguf(files.model)
    weights = path_on(source, kind, capabilities, machine)  # the path is decided; the repack happens here
    target, codec_note = serveable(source, kind, weights, foreign=foreign, repack=repack)
    _refuse_failed_kernels(self_test, target.tensor_types, files.model)
    drafter_info = None
    if files.drafter is not None and (selection.settings["speculative"] or drafter):
        if not files.drafter.is_file():
            raise BonsaiError(
                f"drafter file {files.drafter} is not present",
                f"run `bonsai pull --profile {selection.profile.name} --speculative` or pass --drafter PATH",
            )
        drafter_info = inspect_gguf(files.drafter)
        # No build bonsai makes loads the legacy layout (the fork dropped it with prism-v7)
        if drafter_info.drafter is not None and drafter_info.drafter.kind == "legacy-dspark":
            from bonsai_launch.models.drafters.cache import refusal_for_legacy

            raise refusal_for_legacy(files.drafter, files.model)  # never handed to llama-server as it is
    mmproj_file = files.mmproj if files.mmproj is not None and files.mmproj.is_file() else None
    wrapper, wanted = _template_wrapper(
        None if explicit_model(selection, model) else selection.profile, files.model, repack
    )
    notes = _selection_warnings(selection, model, kind, binary) + ([codec_note] if codec_note else [])
    notes += inherited_env_warnings(os.environ if env is None else env, args.table or option_table(None))
    inputs = PlanInputs(
        settings=selection.settings,
        model=target,
        hardware=machine,
        binary=str(binary) if binary is not None else "llama-server",
        # An explicit family/size/profile keeps its sampling for the user's own weights too.
        profile=selection.profile if not explicit_model(selection, model) or selection.names_model else None,
        drafter=drafter_info,
        mmproj=mmproj_file,
        capabilities=capabilities,
        passthrough=args,
        drafter_unavailable=files.drafter_unavailable,
        chat_template=wrapper,
        chat_template_missing=bool(wanted) and wrapper is None,
        chat_template_guards=wanted,
        self_test=self_test,
        weights=weights,
        notes=tuple(notes),
        tuning=tuning,
    )
    return build_plan(inputs)


def _template_wrapper(profile, model: Path, write: bool) -> tuple[Path | None, tuple[str, ...]]:
    """The guard in front of the model's chat template (models/chat_template.py), when its profile's
    reasoning efforts or its template's refusal of late system messages call for one: (the wrapper
    if written, what it guards). A launch (`write`) writes it; a dry run only looks."""
    from bonsai_launch.models import chat_template

    template = chat_template.read_template(model)
    wanted = chat_template.guards(template, profile)
    if not wanted:
        return None, ()
    if write:
        return chat_template.ensure_wrapper(profile, model), wanted
    if profile is not None:
        path = chat_template.wrapper_path(profile, model)
    else:
        path = chat_template.own_wrapper_path(model, template or "")
    return (path if path.is_file() else None), wanted


def _self_test_verdict(binary: Path | None) -> dict[str, Any] | None:
    """The build self-test's verdict for `binary`; a GPU build whose GPU check failed stops here
    (`auto` never picks it: its failure is remembered like a failed compile, fallback.py)."""
    from bonsai_launch.llamacpp.builds import selftest_record

    record = selftest_record.for_server(binary)
    why = selftest_record.failed(record, selftest_record.GPU)
    if record is not None and why is not None:
        raise BonsaiError(
            f"the {record.get('backend')} build's self-test failed its GPU check: {why} (log: {record.get('log')})",
            "use the CPU build (--backend cpu, or leave the backend to auto), or rerun `bonsai doctor --self-test`",
        )
    return record


def _refuse_failed_kernels(record: dict[str, Any] | None, tensor_types: Mapping[str, int], model: Path) -> None:
    from bonsai_launch.llamacpp.builds import selftest_record

    refused = {t: why for t, why in selftest_record.refused_types(record).items() if t in tensor_types}
    if refused:
        raise BonsaiError(
            f"{model.name} has {', '.join(refused)} weights, and {next(iter(refused.values()))}",
            "report the log at https://github.com/ (bonsai issues) and use a build whose self-test passes "
            "(`bonsai build --force`, then `bonsai doctor --self-test`)",
        )


def _selection_warnings(selection: Selection, model: str | None, kind: BuildKind, binary: Path | None) -> list[str]:
    """Explicit settings that lost to another, and doubts about the build: said, never silent."""
    from bonsai_launch.llamacpp.choice import kind_of_binary

    s, profile, notes = selection.settings, selection.profile, []
    if s.is_explicit("profile"):
        for key, env in (("family", "BONSAI_FAMILY"), ("size", "BONSAI_MODEL")):
            wanted = profile.family if key == "family" else profile.size
            if s.is_explicit(key) and str(s[key]).lower() != wanted.lower():
                notes.append(
                    f"{env}={s[key]} is ignored: profile {profile.name} ({profile.family} {profile.size}) "
                    "was chosen by --profile/BONSAI_PROFILE"
                )
    if model and s.get("gguf") and Path(model).expanduser() != Path(s["gguf"]).expanduser():
        notes.append(f"BONSAI_GGUF={s['gguf']} is ignored: --model {model} wins")
    if explicit_model(selection, model) and selection.names_model and choose_file(profile, "model", kind) is None:
        # The user's own weights, for a model none of whose files this build loads (Bonsai 2 on mainline).
        notes.append(
            f"none of profile {profile.name}'s weights load on a {kind.label()} ({binary or 'not built yet'}); "
            "your file may not load either"
        )
    if binary is not None and kind_of_binary(binary) is None and kind.flavour == "fork" and not s.is_explicit("layout"):
        notes.append(
            f"{binary} was not built by bonsai: taken to be a PrismML fork build, which profile "
            f"{profile.name} needs (set BONSAI_LAYOUT=fork to say so and silence this)"
        )
    return notes
