"""Our patch series for llama.cpp (vendor/llama.cpp/patches/*.patch), applied in name order.

Each patch is checked before it is applied, so a patch that no longer fits the pinned tree
fails with its name and the tool's complaint instead of leaving a half-patched tree. The
tree being patched is always a fresh temporary extraction, thrown away on failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.core.paths import vendor_dir


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    sha256: str


def patches_dir() -> Path:
    return vendor_dir() / "patches"


def load_series(folder: Path | None = None) -> tuple[Patch, ...]:
    folder = folder or patches_dir()
    if not folder.is_dir():
        return ()
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".patch", ".diff"))
    return tuple(Patch(p.name, p, hashlib.sha256(p.read_bytes()).hexdigest()) for p in files)


def touching(series: tuple[Patch, ...], prefixes: tuple[str, ...]) -> tuple[Patch, ...]:
    """The patches of `series` that change a file under one of `prefixes` (tree-relative paths,
    as the diffs name them: `+++ b/tools/ui/...`)."""

    def changes(patch: Patch) -> bool:
        for line in patch.path.read_text(errors="replace").splitlines():
            if line.startswith(("+++ ", "--- ")):
                name = line[4:].split("\t")[0].strip()
                name = name[2:] if name.startswith(("a/", "b/")) else name
                if name.startswith(prefixes):
                    return True
        return False

    return tuple(p for p in series if changes(p))


def series_hash(series: tuple[Patch, ...]) -> str:
    """ "" for an empty series, so an unpatched tree keeps its plain name and key."""
    if not series:
        return ""
    text = "".join(f"{p.name}\0{p.sha256}\n" for p in series)
    return hashlib.sha256(text.encode()).hexdigest()


def _tool(tree: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """(check argv, apply argv, env) for git apply, else GNU patch."""
    git = shutil.which("git")
    if git:
        # Stop git from finding a repository above the tree (BONSAI_HOME inside a checkout):
        # outside a repository `git apply` patches plain files relative to the cwd.
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
        return [git, "apply", "--check", "-p1"], [git, "apply", "-p1"], env
    patch = shutil.which("patch")
    if patch:
        return [patch, "-p1", "-N", "-s", "--dry-run", "-i"], [patch, "-p1", "-N", "-s", "-i"], dict(os.environ)
    raise ActionFailed(
        "neither git nor patch is installed, so the patch series cannot be applied",
        "install git (sudo apt install git) or patch",
    )


def apply_series(tree: Path, series: tuple[Patch, ...]) -> None:
    """Apply every patch to `tree`, each checked first; stop at the first that does not fit."""
    if not series:
        return
    check, apply, env = _tool(tree)
    for patch in series:
        for argv, what in ((check, "does not apply cleanly"), (apply, "failed to apply")):
            done = subprocess.run([*argv, str(patch.path)], cwd=tree, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                detail = (done.stderr or done.stdout).strip().splitlines()
                raise ActionFailed(
                    f"patch {patch.name} {what} to {tree}: {detail[0] if detail else 'exit ' + str(done.returncode)}",
                    f"refresh {patch.path} against the pinned source, or remove it",
                )
