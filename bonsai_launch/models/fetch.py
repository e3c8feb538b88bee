"""Fetching one profile's files from the Hugging Face Hub: exact names, sizes and sha256 checked,
resumed after an interruption, never half-written under the final name; results per file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import hub as hub_client
from bonsai_launch.models import store as model_store
from bonsai_launch.models.progress import Reporter, tqdm_factory
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
