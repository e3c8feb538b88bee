"""Streaming a file to disk with a progress bar, checking its sha256 as it arrives.

The bytes go to a temporary name beside the destination and are renamed into place only
when the hash matches, so a wrong or partial download never sits under the final name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from bonsai_launch.core.errors import ActionFailed

_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _progress(console):
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def _chunks(url: str, cert: str | None):
    """(total size or None, iterator of byte chunks) for an http(s) or file URL."""
    if url.startswith("file:"):
        path = Path(url2pathname(urlparse(url).path))
        fh = open(path, "rb")  # noqa: SIM115 - opened now, so a missing file fails here; local() closes it

        def local():
            with fh:
                yield from iter(lambda: fh.read(_CHUNK), b"")

        return path.stat().st_size, local()
    import httpx

    client = httpx.Client(follow_redirects=True, timeout=httpx.Timeout(60, connect=30), verify=cert or True)
    request = client.build_request("GET", url)
    resp = client.send(request, stream=True)
    if resp.status_code != 200:
        resp.close()
        client.close()
        raise ActionFailed(f"download of {url} failed: HTTP {resp.status_code}", "try again later or check the index")
    length = resp.headers.get("content-length")

    def remote():
        try:
            yield from resp.iter_bytes(_CHUNK)
        finally:
            resp.close()
            client.close()

    return (int(length) if length else None), remote()


def download(
    url: str, dest: Path, sha256: str, *, console=None, label: str | None = None, cert: str | None = None
) -> Path:
    """Fetch `url` to `dest`, refusing (and deleting) anything whose sha256 differs."""
    if console is None:
        from bonsai_launch.core.console import console as make_console

        console = make_console(stderr=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        total, chunks = _chunks(url, cert)
        with open(part, "wb") as out, _progress(console) as progress:
            task = progress.add_task(label or f"download {dest.name}", total=total)
            for chunk in chunks:
                out.write(chunk)
                digest.update(chunk)
                progress.advance(task, len(chunk))
        got = digest.hexdigest()
        if got != sha256.lower():
            raise ActionFailed(
                f"{dest.name} from {url} has sha256 {got}, expected {sha256}: refused",
                "the index serves a different file than the pin names; check the index or the pin",
            )
        os.replace(part, dest)
    except OSError as exc:
        raise ActionFailed(f"download of {url} failed ({exc})", "check the network or disk space, then retry") from None
    except Exception as exc:
        import httpx

        if isinstance(exc, httpx.HTTPError):
            raise ActionFailed(f"download of {url} failed ({exc})", "check the network, then retry") from None
        raise
    finally:
        part.unlink(missing_ok=True)
    return dest
