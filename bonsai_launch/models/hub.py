"""Talking to the Hugging Face Hub through `huggingface_hub`: metadata, tokens, resumable downloads.

Why not `hf_hub_download`: in huggingface_hub 2.x it downloads into a process-unique temporary
file and deletes it when the download fails, so an interrupted 16 GB pull starts again from
zero. We use the library's own pieces instead: `HfApi.model_info(files_metadata=True)` for the
commit, sizes and LFS sha256 of every file in one request, `hf_hub_url` for the download URL
pinned to that commit, and `http_get(resume_size=...)`, which sends the Range header, retries
transient network errors and maps HTTP errors to the library's exceptions. The bytes go to a
partial file we keep, hashed as they are written.

HF_ENDPOINT and HF_HUB_OFFLINE are read when a pull runs (huggingface_hub reads them once, at
import), and the endpoint is passed to the library explicitly, so both work however the
process was started.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed, BonsaiError

TOKEN_FILE = ".bonsai_token"
TOKEN_FIX = (
    "set BONSAI_TOKEN=hf_..., or save the token in a .bonsai_token file (in this folder or in "
    "BONSAI_HOME), or set HF_TOKEN / run `hf auth login`; create one at https://huggingface.co/settings/tokens"
)


def endpoint() -> str:
    from huggingface_hub import constants

    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or constants.ENDPOINT


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), as the environment says now."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    return bool(constants.is_offline_mode())


class HubUnreachable(ActionFailed):
    """The network, not the hub, failed: a pull with verified local files can carry on without it."""


class RepoMissing(BonsaiError):
    """The hub says the repository does not exist (404), or will not say whether it does without a
    token (401, as it answers for a private repository and for a missing one alike)."""


@dataclass(frozen=True)
class Token:
    """The token to send (None: let huggingface_hub use HF_TOKEN or its login) and where it came from."""

    value: str | None
    source: str | None  # "BONSAI_TOKEN", a .bonsai_token path, or None

    def describe(self) -> str | None:
        """Where the token that was actually sent came from, for error messages."""
        if self.source:
            return self.source
        if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
            return "HF_TOKEN"
        try:
            from huggingface_hub import get_token

            return "your huggingface_hub login (hf auth login)" if get_token() else None
        except Exception:  # an OIDC or refresh failure: report it as no token
            return None


def find_token(cwd: Path | None = None) -> Token:
    """BONSAI_TOKEN, then ./.bonsai_token, then $BONSAI_HOME/.bonsai_token, then huggingface_hub's own."""
    from bonsai_launch.core.paths import bonsai_home

    value = os.environ.get("BONSAI_TOKEN", "").strip()
    if value:
        return Token(value, "BONSAI_TOKEN")
    for candidate in (Path(cwd or Path.cwd()) / TOKEN_FILE, bonsai_home() / TOKEN_FILE):
        try:
            text = candidate.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text:
            return Token(text.split()[0], str(candidate))
    return Token(None, None)


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS sha256; None for a small file kept in git
    commit: str = ""  # the commit it is fetched at, when not the listing's (a file from the lock)


@dataclass(frozen=True)
class RemoteListing:
    repo: str
    revision: str
    commit: str
    files: dict[str, RemoteFile]
    from_lock: bool = False  # made from the lock (lock.py), not asked of the hub


def _refused(repo: str, code: int, token: Token, gated: bool) -> BonsaiError:
    sent = token.describe()
    if gated:
        return BonsaiError(
            f"{repo} is gated: the hub answered {code}",
            f"accept its terms at https://huggingface.co/{repo} with the account of your token; {TOKEN_FIX}",
        )
    if sent is None:
        return RepoMissing(
            f"{repo} needs a Hugging Face read token: the hub answered {code} to a request without one "
            "(the repo is private, or does not exist)",
            TOKEN_FIX,
        )
    return BonsaiError(
        f"the hub refused the token from {sent} for {repo} (HTTP {code})",
        f"check that the token is valid and can read {repo}; replace it in {sent}",
    )


def translate(
    exc: BaseException,
    *,
    repo: str,
    token: Token,
    revision: str | None = None,
    file: str | None = None,
    profile: str | None = None,
) -> BonsaiError | None:
    """A huggingface_hub / network exception as one user-facing error (None: not ours to explain)."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RevisionNotFoundError,
    )

    what = file or repo
    cmd = f"`bonsai pull --profile {profile}`" if profile else "`bonsai pull`"
    again = f"run {cmd} again"
    if isinstance(exc, OfflineModeIsEnabled):
        return BonsaiError(
            f"offline (HF_HUB_OFFLINE is set): cannot fetch {what}",
            "unset HF_HUB_OFFLINE to download, or copy the file into the models folder",
        )
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        code = exc.response.status_code
        if code in (401, 403) or isinstance(exc, GatedRepoError):
            return _refused(repo, code, token, isinstance(exc, GatedRepoError))
        if isinstance(exc, RevisionNotFoundError):
            return BonsaiError(
                f"--revision={revision!r} is not a branch, tag or commit of {repo}",
                "pass an existing revision, or leave --revision out for main",
            )
        if isinstance(exc, RemoteEntryNotFoundError) or (code == 404 and file):
            return ActionFailed(
                f"{file} is not in {repo} (HTTP 404 at revision {revision or 'main'})",
                "the profile names a file the repo does not have: fix the profile or pass --revision",
            )
        if code == 404:
            return RepoMissing(
                f"repo {repo} not found at {endpoint()} (HTTP 404)",
                "check the profile's repo field, and HF_ENDPOINT if you set it",
                exit_code=1,
            )
        said = (getattr(exc, "server_message", None) or "").strip().splitlines()
        return ActionFailed(
            f"the hub answered HTTP {code} for {what}" + (f": {said[0]}" if said else ""),
            f"try again later; {cmd} resumes the download",
        )
    if isinstance(exc, httpx2.TransportError):
        return HubUnreachable(
            f"cannot reach the Hugging Face Hub at {endpoint()} for {what}: {exc or type(exc).__name__}",
            f"check the network and {again}, or set HF_HUB_OFFLINE=1 to use only local files",
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return ActionFailed(
            f"the disk filled up while writing {what}",
            f"free space, then {again}: the partial download is kept and resumes",
        )
    return None


def list_files(repo: str, *, revision: str | None, token: Token, profile: str | None = None) -> RemoteListing:
    """Commit, size and sha256 of every file of the repo at `revision`, in one request."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint(), token=token.value, library_name="bonsai")
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True, token=token.value)
    except Exception as exc:
        err = translate(exc, repo=repo, token=token, revision=revision, profile=profile)
        if err is None:
            raise
        raise err from None
    files = {}
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        size = lfs.size if lfs is not None else sibling.size
        files[sibling.rfilename] = RemoteFile(
            sibling.rfilename, int(size or 0), lfs.sha256 if lfs is not None else None
        )
    if not info.sha:
        raise ActionFailed(
            f"{endpoint()} did not say which commit {repo} is at",
            "check HF_ENDPOINT: it must point at a Hugging Face Hub",
        )
    return RemoteListing(repo, revision or "main", info.sha, files)


def similar_repos(repo: str, token: Token, shown: int = 4) -> list[str]:
    """The owner's repositories most like `repo` (for a 404's message); [] when the hub cannot
    say. One request for the owner's list; never raises."""
    import difflib

    from huggingface_hub import HfApi

    owner = repo.split("/", 1)[0]
    try:
        api = HfApi(endpoint=endpoint(), token=token.value, library_name="bonsai")
        ids = [m.id for m in api.list_models(author=owner, limit=500)]
    except Exception:  # the message is complete without it
        return []
    ranked = sorted(ids, key=lambda i: (-difflib.SequenceMatcher(None, repo.lower(), i.lower()).ratio(), i))
    return [i for i in ranked if i != repo][:shown]


def download(
    repo: str,
    commit: str,
    name: str,
    out: Any,
    *,
    expected_size: int,
    token: Token,
    progress: Callable[..., Any] | None,
) -> None:
    """Append the rest of `name` (from out.tell()) to `out`, a HashingFile opened at its end.

    `progress` is a tqdm-like factory for huggingface_hub (see download_progress.py). Errors
    propagate as the library raises them; the caller translates them and keeps the partial.
    """
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, name, revision=commit, endpoint=endpoint())
    headers = build_hf_headers(token=token.value, library_name="bonsai")
    http_get(
        url,
        out,
        resume_size=out.tell(),
        headers=headers,
        expected_size=expected_size,
        displayed_filename=name,
        tqdm_class=progress,  # type: ignore[arg-type]  # a factory huggingface_hub calls like tqdm's class
    )
