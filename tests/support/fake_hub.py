"""A local stand-in for the Hugging Face Hub, for tests that run the real huggingface_hub client.

It answers the requests huggingface_hub 2.x makes for model repos, like the real hub does:
- GET  /api/models/{repo}[/revision/{rev}][?blobs=true]  -> model info with siblings: the repository's
  listing, each file's name, size and LFS sha256 (what `HfApi.model_info(files_metadata=True)` reads)
- GET  /api/models?author={owner}[&search=..][&limit=N]  -> the owner's repositories (`HfApi.list_models`)
- POST /api/models/{repo}/paths-info/{rev}               -> per-path size and LFS oid
- HEAD/GET /{repo}/resolve/{rev}/{file}                  -> 302 to a CDN-like /_lfs/{sha256} URL, with
  X-Repo-Commit, ETag, X-Linked-Etag (the sha256) and X-Linked-Size
- HEAD/GET /_lfs/{sha256}                                -> the bytes; honours Range (206/416)
- private repos: 401 (X-Error-Code RepoNotFound) without a token, 401 "Invalid credentials in
  Authorization header" with a wrong one; unknown repo/revision/file: 404 with the hub's
  X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound); gated repos: listed, but their
  downloads answer 403 with X-Error-Code GatedRepo (terms not accepted), as the real hub does.

Faults, per file: `corrupt_at` flips one served byte (metadata keeps the true sha256),
`cut_after` drops the connection after that many body bytes on the first GET and then answers
503 `fail_after_cut` times, `reported_size` lies about the size in the metadata (disk-space
tests), `listed=False` keeps the file out of the listing, `resolvable=False` lists it but
answers 404 to its download, `ignore_range` answers 200 with the whole file to a Range request
(as some CDNs do). `gate` (a threading.Event) holds
every body download until set. Every request is recorded in `requests`.
Served from 127.0.0.1 on a free port; point HF_ENDPOINT at `url`.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

GOOD_TOKEN = "hf_fake_hub_read_token"


@dataclass
class FakeFile:
    name: str
    content: bytes
    corrupt_at: int | None = None
    cut_after: int | None = None
    fail_after_cut: int = 1
    reported_size: int | None = None
    listed: bool = True
    resolvable: bool = True
    ignore_range: bool = False
    _cut_done: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def size(self) -> int:
        return self.reported_size if self.reported_size is not None else len(self.content)

    def served(self) -> bytes:
        if self.corrupt_at is None:
            return self.content
        data = bytearray(self.content)
        data[self.corrupt_at] ^= 0xFF
        return bytes(data)


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, FakeFile] = field(default_factory=dict)
    private: bool = False
    commit: str = ""
    gated: bool = False  # downloads refused with 403 GatedRepo: the token's account has not accepted the terms

    def __post_init__(self) -> None:
        if not self.commit:
            self.commit = hashlib.sha1(self.repo_id.encode()).hexdigest()

    def add(self, name: str, content: bytes, **faults: Any) -> FakeFile:
        self.files[name] = FakeFile(name, content, **faults)
        return self.files[name]


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int = 0
    body_bytes: int = 0


class FakeHub:
    def __init__(self, token: str = GOOD_TOKEN) -> None:
        self.token = token
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[Seen] = []
        self.gate = threading.Event()
        self.gate.set()
        self.body_started = threading.Event()  # set when a body download starts (for gate tests)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- setup -------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, private: bool = False) -> FakeRepo:
        self.repos[repo_id] = FakeRepo(repo_id, private=private)
        return self.repos[repo_id]

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.02,), name="fake-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        self.gate.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- what was asked ------------------------------------------------------------------------
    def record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)

    def body_gets(self, file_name: str | None = None) -> list[Seen]:
        """GETs that fetched file bytes (the /_lfs/ downloads), optionally of one file."""
        sha = None
        if file_name is not None:
            sha = next(f.sha256 for r in self.repos.values() for f in r.files.values() if f.name == file_name)
        return [
            s
            for s in self.requests
            if s.method == "GET" and s.path.startswith("/_lfs/") and (sha is None or s.path.split("?")[0].endswith(sha))
        ]

    def find_blob(self, sha: str) -> FakeFile | None:
        for repo in self.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha:
                    return f
        return None


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # --- plumbing ----------------------------------------------------------------------------
    def _seen(self) -> Seen:
        seen = Seen(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"))
        self.hub.record(seen)
        return seen

    def _send(
        self,
        seen: Seen,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        seen.status = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _error(
        self, seen: Seen, status: int, code: str | None, message: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(seen, status, json.dumps({"error": message}).encode(), headers)

    def _repo_or_error(self, seen: Seen, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        auth = self.headers.get("Authorization")
        if repo is not None and repo.private:
            if auth is None:
                self._error(seen, 401, "RepoNotFound", "Invalid username or password.")
                return None
            if auth != f"Bearer {self.hub.token}":
                self._error(seen, 401, None, "Invalid credentials in Authorization header")
                return None
        if repo is None:
            self._error(seen, 401 if auth is None else 404, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _revision_ok(self, seen: Seen, repo: FakeRepo, revision: str) -> bool:
        if revision in ("main", repo.commit):
            return True
        self._error(seen, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return False

    # --- routes ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        seen = self._seen()
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        query = urllib.parse.parse_qs(parsed.query)
        parts = path.strip("/").split("/")
        if self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(length).decode()) if length else {}
            if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "paths-info":
                return self._paths_info(seen, f"{parts[2]}/{parts[3]}", parts[5], form.get("paths", []))
            return self._error(seen, 404, None, "not found")
        if parts[0] == "_lfs" and len(parts) == 2:
            return self._blob(seen, parts[1])
        if parts == ["api", "models"]:
            return self._list_models(seen, query)
        if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
            revision = parts[5] if len(parts) == 6 and parts[4] == "revision" else "main"
            return self._model_info(
                seen,
                f"{parts[2]}/{parts[3]}",
                revision,
                query.get("blobs") == ["True"] or query.get("blobs") == ["true"],
            )
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(seen, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        self._error(seen, 404, None, "not found")

    def _model_info(self, seen: Seen, repo_id: str, revision: str, blobs: bool) -> None:
        repo = self._repo_or_error(seen, repo_id)
        if repo is None or not self._revision_ok(seen, repo, revision):
            return
        siblings = []
        for f in repo.files.values():
            if not f.listed:
                continue
            entry: dict[str, Any] = {"rfilename": f.name}
            if blobs:
                entry.update(
                    size=f.size,
                    blobId=hashlib.sha1(f.content).hexdigest(),
                    lfs={"size": f.size, "sha256": f.sha256, "pointerSize": 134},
                )
            siblings.append(entry)
        body = {
            "_id": "x",
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": repo.commit,
            "private": repo.private,
            "siblings": siblings,
            "tags": ["gguf"],
        }
        self._send(seen, 200, json.dumps(body).encode())

    def _list_models(self, seen: Seen, query: dict[str, list[str]]) -> None:
        author = (query.get("author") or [""])[0]
        search = (query.get("search") or [""])[0].lower()
        authorized = self.headers.get("Authorization") == f"Bearer {self.hub.token}"
        found = [
            {"_id": r.commit[:24], "id": r.repo_id, "modelId": r.repo_id, "private": r.private, "tags": ["gguf"]}
            for r in sorted(self.hub.repos.values(), key=lambda r: r.repo_id)
            if (not author or r.repo_id.split("/")[0] == author)
            and search in r.repo_id.lower()
            and (authorized or not r.private)
        ]
        limit = int((query.get("limit") or ["1000"])[0])
        self._send(seen, 200, json.dumps(found[:limit]).encode())

    def _paths_info(self, seen: Seen, repo_id: str, revision: str, paths: list[str]) -> None:
        repo = self._repo_or_error(seen, repo_id)
        if repo is None or not self._revision_ok(seen, repo, revision):
            return
        out = [
            {
                "type": "file",
                "path": f.name,
                "size": f.size,
                "oid": hashlib.sha1(f.content).hexdigest(),
                "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134},
            }
            for f in repo.files.values()
            if f.name in paths and f.listed
        ]
        self._send(seen, 200, json.dumps(out).encode())

    def _resolve(self, seen: Seen, repo_id: str, revision: str, file_name: str) -> None:
        repo = self._repo_or_error(seen, repo_id)
        if repo is None or not self._revision_ok(seen, repo, revision):
            return
        if repo.gated:
            return self._error(
                seen,
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo.repo_id} to ask for access.",
            )
        f = repo.files.get(file_name)
        if f is None or not f.resolvable:
            return self._error(
                seen,
                404,
                "EntryNotFound",
                f'{file_name} does not exist on "{revision}"',
                {"X-Repo-Commit": repo.commit},
            )
        headers = {
            "Location": f"{self.hub.url}/_lfs/{f.sha256}",
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{hashlib.sha1(f.content).hexdigest()}"',
            "X-Linked-Etag": f'"{f.sha256}"',
            "X-Linked-Size": str(f.size),
            "Accept-Ranges": "bytes",
        }
        self._send(seen, 302, b"", headers, "text/plain")

    def _blob(self, seen: Seen, sha: str) -> None:
        f = self.hub.find_blob(sha)
        if f is None:
            return self._error(seen, 404, None, "blob not found")
        data = f.served()
        total = len(data)
        if self.command == "GET" and f._cut_done and f.fail_after_cut > 0:
            f.fail_after_cut -= 1
            return self._error(seen, 503, None, "Service Unavailable")
        start, end = 0, total - 1
        status = 200
        rng = None if f.ignore_range else self.headers.get("Range")
        if rng:
            spec = rng.removeprefix("bytes=")
            first, _, last = spec.partition("-")
            start = int(first) if first else 0
            end = int(last) if last else total - 1
            if start >= total:
                return self._send(seen, 416, b"", {"Content-Range": f"bytes */{total}"}, "text/plain")
            status = 206
        body = data[start : end + 1]
        headers = {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
        seen.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        self.hub.body_started.set()
        self.hub.gate.wait()
        if f.cut_after is not None and not f._cut_done:
            f._cut_done = True
            keep = max(0, f.cut_after - start)
            self.wfile.write(body[:keep])
            self.wfile.flush()
            seen.body_bytes = keep
            # Drop the connection mid-body, like a network failure.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        step = 64 * 1024
        for i in range(0, len(body), step):
            self.wfile.write(body[i : i + step])
            seen.body_bytes += len(body[i : i + step])


# --- generated repos under the real names ------------------------------------------------------


def tiny_files(folder: Path) -> dict[str, bytes]:
    """Tiny GGUFs for the ternary-27b and bonsai-8b profiles, under their real file names, plus
    the decoys a glob would catch (F16 weights, another projector) that a pull must never fetch."""
    import tiny_gguf

    folder.mkdir(parents=True, exist_ok=True)
    # A target big enough to be cut off halfway with a small download chunk size.
    target = tiny_gguf.write_target(folder / "target.gguf", vocab=2048, name="tiny Ternary-Bonsai-27B")
    fork_target = tiny_gguf.write_target(folder / "fork.gguf", vocab=2048, seed=1, name="tiny Ternary-Bonsai-27B fork")
    drafter = tiny_gguf.write_dspark_drafter(folder / "drafter.gguf", vocab=2048, legacy=True, name="tiny dspark")
    # the bf16 sidecar in PrismML's legacy layout (log-SNR family), made for `target`
    from legacy_dspark_gguf import write_legacy_drafter

    sidecar = write_legacy_drafter(folder / "sidecar.gguf", vocab=2048, target_layers=(0,), name="tiny dspark bf16")
    small = tiny_gguf.write_target(folder / "small.gguf", vocab=256, name="tiny Bonsai-8B")
    mmproj = _write_mmproj(folder / "mmproj.gguf")
    read = lambda p: Path(p).read_bytes()  # noqa: E731
    return {
        "Ternary-Bonsai-27B-Q2_g64.gguf": read(target),
        "Ternary-Bonsai-27B-PQ2_0.gguf": read(fork_target),
        "Ternary-Bonsai-27B-Q2_0.gguf": read(fork_target) + b"\0" * 32,  # legacy group-128: never fetched
        "Ternary-Bonsai-27B-dspark-Q4_1.gguf": read(drafter),
        "Ternary-Bonsai-27B-dspark-bf16.gguf": read(sidecar),
        "Ternary-Bonsai-27B-mmproj-BF16.gguf": read(mmproj),
        "Ternary-Bonsai-27B-mmproj-Q8_0.gguf": read(mmproj) + b"\0" * 64,
        "Ternary-Bonsai-27B-F16.gguf": read(target) + b"\0" * 128,
        "Bonsai-8B-Q1_0.gguf": read(small),
    }


def _write_mmproj(path: Path) -> Path:
    """A small GGUF with the `clip` architecture, as vision projectors have."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.embedding_length", 32)
    writer.add_tensor("mm.0.weight", np.zeros((32, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TERNARY_27B = "prism-ml/Ternary-Bonsai-27B-gguf"
BONSAI_8B = "prism-ml/Bonsai-8B-gguf"


@pytest.fixture(scope="session")
def tiny_repo_files(tmp_path_factory) -> dict[str, bytes]:
    return tiny_files(tmp_path_factory.mktemp("tiny_repo"))


@pytest.fixture
def hub(tiny_repo_files, monkeypatch, tmp_path) -> Any:
    """A running fake hub with the ternary-27b and bonsai-8b repos (public), HF_ENDPOINT pointing
    at it, no token from the outside, and a small download chunk so partial writes reach disk."""
    from huggingface_hub import constants

    fake = FakeHub().start()
    ternary = fake.add_repo(TERNARY_27B)
    for name, data in tiny_repo_files.items():
        if name.startswith("Ternary"):
            ternary.add(name, data)
    fake.add_repo(BONSAI_8B).add("Bonsai-8B-Q1_0.gguf", tiny_repo_files["Bonsai-8B-Q1_0.gguf"])

    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-hf-token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    # huggingface_hub fetches an "agent harness" registry from the import-time endpoint for its
    # user agent; tests must not reach out for it.
    from huggingface_hub.utils import _detect_agent

    monkeypatch.setattr(_detect_agent, "_registry", _detect_agent._EMPTY_REGISTRY)
    monkeypatch.chdir(tmp_path)  # no stray ./.bonsai_token
    yield fake
    fake.stop()
