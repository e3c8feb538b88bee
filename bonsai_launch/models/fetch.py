"""Fetching one profile's files from the Hugging Face Hub: resolved from the repository's listing
(exact names or patterns, resolve.py) or from the lock (lock.py), sizes and sha256 checked,
resumed after an interruption, never half-written under the final name; results per file.

`check_remote=False` (what `bonsai start` asks for) never lists the repository when the lock
covers every wanted file: verified files are used as they are, a missing one is fetched by its
recorded name at its recorded commit. A pull (`check_remote=True`) lists, resolves again, and
records what it resolved."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import hub as hub_client
from bonsai_launch.models import lock as model_lock
from bonsai_launch.models import store as model_store
from bonsai_launch.models.progress import Reporter, tqdm_factory
from bonsai_launch.models.resolve import Resolved, resolve_all
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


def from_hub(
    profile: Profile, files: list[ModelFile], revision: str | None, check_remote: bool, reporter: Reporter
) -> PullResult:
    assert profile.repo
    repo, name = profile.repo, profile.name
    folder = model_store.folder(name)
    records = model_store.read_records(name)
    locked = model_lock.locked_files(profile)
    files = [model_lock.applied(f, locked) for f in files]  # pattern entries get the lock's names
    states = {f.name: model_store.state(name, f.name, records) for f in files if f.name}
    result = PullResult(name, f"hf:{repo}", folder, [], revision=revision)
    unresolved = [f for f in files if not f.name]

    def kept(f: ModelFile, status: str = "already verified") -> FileResult:
        s = states[f.name]
        return FileResult(f.role, f.name, s.path, s.size, s.record.sha256 if s.record else None, status)

    def all_verified() -> bool:
        return not unresolved and all(s.verified for s in states.values())

    if not check_remote and revision is None and all_verified():
        result.files = [kept(f) for f in files]
        return result

    if hub_client.offline():
        return _offline(profile, files, states, result)

    token = hub_client.find_token()
    if not check_remote and revision is None and all(f.key in locked for f in files):
        # What the lock recorded, fetched as recorded: the repository is not listed again.
        listing = model_lock.listing(profile, [locked[f.key] for f in files])
        plan_of = [Resolved(f, listing.files[f.name], None) for f in files]
    else:
        try:
            listing = _list(profile, files, revision, token)
        except hub_client.HubUnreachable as err:
            if revision is None and all_verified():
                result.notes.append(f"{err.message}; using the copies verified earlier")
                result.files = [kept(f) for f in files]
                return result
            raise
        plan_of = resolve_all(profile, files, listing)
        result.notes += _changes(plan_of, locked)
    result.commit = listing.commit
    result.revision = listing.revision

    plan: list[tuple[ModelFile, hub_client.RemoteFile, str, str]] = []  # (entry, remote, sha256, status)
    for r in plan_of:
        f, remote = r.entry, r.remote
        sha = _expected_sha(profile, f, remote)
        s = states.get(f.name) or model_store.state(name, f.name, records)
        states[f.name] = s
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
                model_store.record_verified(name, f.name, sha, f"hf:{repo}@{remote.commit or listing.commit}")
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
        order = {r.entry.name: i for i, r in enumerate(plan_of)}
        result.files.sort(key=lambda r: order[r.name])
    if not listing.from_lock:
        model_lock.record(
            profile, listing, [(r.entry, r.remote, _expected_sha(profile, r.entry, r.remote)) for r in plan_of]
        )
    return result


def _offline(profile: Profile, files: list[ModelFile], states: dict, result: PullResult) -> PullResult:
    """HF_HUB_OFFLINE: what is here (or was resolved by the lock) is used; nothing is asked."""
    result.offline = True
    cmd = f"`bonsai pull --profile {profile.name}`"
    unresolved = [f for f in files if not f.name]
    if unresolved:
        f = unresolved[0]
        raise BonsaiError(
            f"offline (HF_HUB_OFFLINE is set) and profile {profile.name}'s {f.role} ({f.wanted} in {profile.repo}) "
            f"is not resolved yet: the lock {model_lock.lock_path()} has no entry for it",
            f"unset HF_HUB_OFFLINE and run {cmd} once: it resolves the file and records it",
        )
    missing = [f.name for f in files if not states[f.name].present]
    if missing:
        raise BonsaiError(
            f"offline (HF_HUB_OFFLINE is set) and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not in {result.folder}",
            f"unset HF_HUB_OFFLINE and run {cmd}, or copy the file there",
        )
    for f in files:
        s = states[f.name]
        if s.verified:
            result.files.append(
                FileResult(f.role, f.name, s.path, s.size, s.record.sha256 if s.record else None, "already verified")
            )
        else:
            result.files.append(FileResult(f.role, f.name, s.path, s.size, None, "unverified (offline)"))
            result.notes.append(f"{f.name} was not verified (offline: no checksum from the hub); using it as is")
    return result


def _looked_for(files: list[ModelFile]) -> str:
    return "; ".join(f"{f.role} {f.wanted}" for f in files)


def _list(profile: Profile, files: list[ModelFile], revision: str | None, token: hub_client.Token):
    """The repository's listing; a missing, gated or refused repository in one line that says
    what was looked for, whether the repository name is confirmed, and what the owner has."""
    assert profile.repo
    try:
        return hub_client.list_files(profile.repo, revision=revision, token=token, profile=profile.name)
    except hub_client.RepoMissing as err:
        detail = f"looked for {_looked_for(files)}"
        if profile.repo_unconfirmed:
            detail = f"the profile's repository is NOT confirmed ({profile.repo_unconfirmed}); {detail}"
        similar = hub_client.similar_repos(profile.repo, token)
        owner = profile.repo.split("/", 1)[0]
        detail += f"; {owner} has: {', '.join(similar)}" if similar else ""
        fix = err.fix or ""
        if profile.repo_unconfirmed:
            fix = (
                f"when the repository has another name, set repo: in a copy of {profile.source_file.name} in a "
                f"folder named by BONSAI_PROFILES_DIR; {fix}"
            )
        raise type(err)(f"{err.message}; {detail}", fix, exit_code=err.exit_code) from None
    except hub_client.HubUnreachable:
        raise
    except BonsaiError as err:
        err.message += f" (looked for {_looked_for(files)})"
        raise


def _changes(resolved: list[Resolved], locked: dict[str, model_lock.LockedFile]) -> list[str]:
    """Notes for patterns that now pick another file than the lock recorded."""
    notes = []
    for r in resolved:
        before = locked.get(r.entry.key)
        if r.pattern and before is not None and before.name != r.entry.name:
            notes.append(
                f"{r.entry.role} {r.entry.wanted} now resolves to {r.entry.name} (the lock had {before.name}); "
                "the lock is updated"
            )
    return notes


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
                    remote.commit or listing.commit,
                    f.name,
                    out,
                    expected_size=remote.size,
                    token=token,
                    progress=tqdm_factory(reporter, f.name, bars),
                )
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
                    # huggingface_hub's own size check: the server sent other than the listing's size
                    got = out.size
                    out.close()
                    part.unlink(missing_ok=True)
                    raise _bad_download(
                        profile, f, f"size check: the listing says {remote.size:,} bytes", got
                    ) from None
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
        raise _bad_download(profile, f, f"sha256 check: expected {sha}, got {digest}", got)
    path = model_store.install(part, name, f.name)
    model_store.record_verified(name, f.name, sha, f"hf:{listing.repo}@{remote.commit or listing.commit}")
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


def _bad_download(profile: Profile, f: ModelFile, check: str, got: int) -> ActionFailed:
    return ActionFailed(
        f"{f.name} failed its {check} ({got:,} bytes arrived); the download was deleted",
        f"run `bonsai pull --profile {profile.name}` again; if it fails again, the hub's copy or the "
        "network is corrupting it",
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
    commit = remote.commit or listing.commit
    err = hub_client.translate(exc, repo=listing.repo, token=token, revision=commit, file=f.name, profile=profile.name)
    if err is not None and listing.from_lock and "HTTP 404" in err.message:
        err.fix = (
            f"the lock {model_lock.lock_path()} records {f.name} at commit {commit[:10]}, which the repository no "
            f"longer serves: run `bonsai pull --profile {profile.name}` to resolve it again"
        )
    if isinstance(err, hub_client.HubUnreachable):
        return ActionFailed(
            f"the download of {f.name} broke off {where}: {exc or type(exc).__name__}",
            f"{again}: it resumes from there",
        )
    said = (str(exc).strip().splitlines() or [""])[0]  # one line: the library's first
    if err is None and isinstance(exc, OSError):
        return ActionFailed(f"the download of {f.name} failed {where}: {said}", f"{again}: it resumes from there")
    if err is None:
        return ActionFailed(f"the download of {f.name} failed {where}: {type(exc).__name__}: {said}", again)
    if isinstance(err, ActionFailed) and done:
        err.message += f" (stopped {where}; the partial download is kept)"
    elif not isinstance(err, ActionFailed):  # refused: a token, or the terms of a gated repository
        err.message += f" (downloading {f.name})"
    return err
