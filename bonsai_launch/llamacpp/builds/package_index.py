"""Finding a file on the package indexes the user's pip is configured for.

We read the index URLs the way pip would see them (`pip config list`, which includes the
PIP_* environment, plus PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS read directly in
case pip is not importable) and ask each index's simple API (PEP 691 JSON, else PEP 503 HTML)
for the project page. An index that does not have the file (a local mirror holding other
packages, say) is skipped, not an error. We never run the sdist's setup.py: only its URL and
sha256 are needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse
from urllib.request import url2pathname

from bonsai_launch.core.errors import ActionFailed

DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"


@dataclass(frozen=True)
class IndexSettings:
    indexes: tuple[str, ...]  # the main index first, then the extra ones
    find_links: tuple[str, ...] = ()
    cert: str | None = None


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    found_on: str  # the index or find-links location that listed it


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_config() -> dict[str, str]:
    """`pip config list` as {key: value}; keys look like `global.index-url` or `:env:.cert`."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    values: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, sep, raw = line.partition("=")
        if sep:
            values[key.strip()] = raw.strip().strip("'\"")
    return values


def _pick(config: dict[str, str], env: dict[str, str], option: str) -> str | None:
    """pip's precedence: environment, then the download/install section, then global."""
    env_name = "PIP_" + option.upper().replace("-", "_")
    if env.get(env_name):
        return env[env_name]
    for section in (":env:", "download", "install", "global"):
        value = config.get(f"{section}.{option}")
        if value:
            return value
    return None


def index_settings(env: dict[str, str] | None = None, config: dict[str, str] | None = None) -> IndexSettings:
    env = dict(os.environ if env is None else env)
    config = _pip_config() if config is None else config
    if (_pick(config, env, "no-index") or "").lower() in ("1", "true", "yes", "on"):
        indexes: list[str] = []
    else:
        indexes = [_pick(config, env, "index-url") or DEFAULT_INDEX]
        indexes += (_pick(config, env, "extra-index-url") or "").split()
    find_links = tuple((_pick(config, env, "find-links") or "").split())
    return IndexSettings(tuple(dict.fromkeys(indexes)), find_links, _pick(config, env, "cert"))


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_project_page(body: str, content_type: str, page_url: str) -> list[IndexFile]:
    """Files listed on a simple-API project page, JSON (PEP 691) or HTML (PEP 503)."""
    files = []
    if "json" in content_type:
        data = json.loads(body)
        for f in data.get("files", ()):
            url = urljoin(page_url, f["url"])
            files.append(IndexFile(f["filename"], url, (f.get("hashes") or {}).get("sha256"), page_url))
        return files
    parser = _Anchors()
    parser.feed(body)
    for href, text in parser.links:
        url, _, fragment = urljoin(page_url, href).partition("#")
        name = unquote(urlparse(url).path.rsplit("/", 1)[-1]) or text
        sha = fragment.split("=", 1)[1].lower() if fragment.startswith("sha256=") else None
        files.append(IndexFile(name, url, sha, page_url))
    return files


def _read_local(url: str) -> tuple[str, str] | None:
    """A file:// project page: its index.html, or a plain folder listed as files."""
    path = Path(url2pathname(urlparse(url).path))
    if path.is_dir():
        page = path / "index.html"
        if page.is_file():
            return page.read_text(errors="replace"), "text/html"
        links = "".join(f'<a href="{p.name}">{p.name}</a>' for p in sorted(path.iterdir()) if p.is_file())
        return links, "text/html"
    if path.is_file():
        return path.read_text(errors="replace"), "text/html"
    return None


def _fetch(url: str, cert: str | None, problems: list[str]) -> tuple[str, str] | None:
    """(body, content type) of a page, or None when the index does not have it (the reason
    goes to `problems`, so a network failure is not reported as a missing file)."""
    if url.startswith("file:"):
        page = _read_local(url)
        if page is None:
            problems.append(f"{url}: no such folder")
        return page
    import httpx

    try:
        with httpx.Client(follow_redirects=True, timeout=30, verify=cert or True) as client:
            resp = client.get(url, headers={"Accept": _ACCEPT})
    except httpx.HTTPError as exc:
        problems.append(f"{url}: {type(exc).__name__} {exc}")
        return None
    if resp.status_code != 200:
        problems.append(f"{url}: HTTP {resp.status_code}")
        return None
    return resp.text, resp.headers.get("content-type", "text/html")


def find_file(package: str, filename: str, settings: IndexSettings | None = None) -> IndexFile:
    """Where to download `filename` of `package`; the first index that lists it wins."""
    settings = settings or index_settings()
    tried: list[str] = []
    problems: list[str] = []
    for index in settings.indexes:
        page_url = index.rstrip("/") + "/" + normalize(package) + "/"
        tried.append(index)
        page = _fetch(page_url, settings.cert, problems)
        if page is None:
            continue
        for f in parse_project_page(page[0], page[1], page_url):
            if f.filename == filename:
                return f
    for location in settings.find_links:
        tried.append(location)
        if "://" not in location:
            candidate = Path(location).expanduser() / filename
            if candidate.is_file():
                return IndexFile(filename, candidate.resolve().as_uri(), None, location)
            continue
        page = _fetch(location, settings.cert, problems)
        if page is None:
            continue
        for f in parse_project_page(page[0], page[1], location):
            if f.filename == filename:
                return f
    network = [p for p in problems if "Error" in p or "HTTP 5" in p]
    detail = f"; {'; '.join(network)}" if network else ""
    raise ActionFailed(
        f"{filename} was not found on any configured package index (tried: {', '.join(tried) or 'none'}){detail}",
        "check the network and `pip config list` / PIP_INDEX_URL, or build from a folder with "
        "`bonsai build --source PATH`",
    )
