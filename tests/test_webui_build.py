"""The chat page's npm build (llamacpp/builds/webui.py) with the real npm on small UI trees the
test writes: built once and then cached by key, a failure that leaves no page but a reason (and is
not retried for minutes on every build, only with --force), no npm at all, and a source without
tools/ui. The real page from the pinned source is built by `bonsai build` and tested in a browser
(tests/test_chat_page.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import real_parts
from bonsai_launch.llamacpp.builds import webui

LOCK = {"name": "ui", "version": "1.0.0", "lockfileVersion": 3, "requires": True, "packages": {"": {"name": "ui"}}}


@pytest.fixture(autouse=True)
def npm_present():
    if shutil.which("npm") is None:
        real_parts.missing("no npm on PATH", "apt-get install nodejs npm (or pip install -e '.[ui]')")


def ui_tree(root: Path, build_script: str) -> Path:
    """A llama.cpp-shaped source whose tools/ui has no dependencies and the given build script."""
    ui = root / "tools" / "ui"
    ui.mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "scripts" / "ui-assets.cmake").write_text("# stands in for b11434's script\n")
    (ui / "package.json").write_text(json.dumps({"name": "ui", "version": "1.0.0", "scripts": {"build": build_script}}))
    (ui / "package-lock.json").write_text(json.dumps(LOCK))
    return root


WRITES_PAGE = (
    "node -e \"const f=require('fs'),p=require('path'),o=process.env.LLAMA_UI_OUT_DIR;"
    "f.mkdirSync(o,{recursive:true});f.writeFileSync(p.join(o,'index.html'),'<html>'+process.env.LLAMA_BUILD_NUMBER);"
    "f.appendFileSync(p.join(process.env.COUNT),'x')\""
)


def test_built_once_then_cached_by_key(tmp_path, monkeypatch):
    count = tmp_path / "runs"
    monkeypatch.setenv("COUNT", str(count))
    src = ui_tree(tmp_path / "src", WRITES_PAGE)
    first = webui.provide(src, "sha-of-the-pin", "patches", 11434)
    assert first.page and first.dist is not None, first
    assert (first.dist / "index.html").read_text() == "<html>b11434"
    assert not (webui.ui_root() / first.key / "src").exists()  # node_modules and the copy are gone
    again = webui.provide(src, "sha-of-the-pin", "patches", 11434)
    assert again.page and again.key == first.key and again.seconds == 0
    assert count.read_text() == "x"  # npm ran once
    other = webui.provide(src, "sha-of-another-pin", "patches", 11434)
    assert other.page and other.key != first.key and count.read_text() == "xx"
    assert not (src / "tools" / "ui" / "node_modules").exists()  # the shared source is left as it was


def test_a_failing_npm_build_leaves_no_page_and_a_reason(tmp_path, monkeypatch):
    count = tmp_path / "runs"
    monkeypatch.setenv("COUNT", str(count))
    src = ui_tree(tmp_path / "src", f"{WRITES_PAGE} && exit 3")
    failed = webui.provide(src, "pin", "patches", 1)
    assert not failed.page and "npm run build failed (exit 3" in failed.reason, failed
    assert failed.log is not None and failed.log.is_file()
    again = webui.provide(src, "pin", "patches", 1)  # remembered: no second attempt
    assert not again.page and again.reason == failed.reason and count.read_text() == "x"
    webui.provide(src, "pin", "patches", 1, retry=True)  # bonsai build --force tries again
    assert count.read_text() == "xx"


def test_without_npm_or_without_tools_ui_there_is_no_page(tmp_path, monkeypatch):
    src = ui_tree(tmp_path / "src", WRITES_PAGE)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("sys.executable", str(tmp_path / "empty" / "python"))
    none = webui.provide(src, "pin", "patches", 1)
    assert not none.page and none.reason == "no npm was found to build the chat page"
    monkeypatch.setenv("BONSAI_BUILD_UI", "0")
    assert webui.provide(src, "pin", "patches", 1).reason == "BONSAI_BUILD_UI is off"
    bare = tmp_path / "bare"
    bare.mkdir()
    assert webui.provide(bare, "pin", "patches", 1).key == ""


def test_start_prints_the_page_or_how_to_get_it(llama_server, tmp_path):
    """`bonsai start` on the suite's build (which has the page) prints its address; on a server
    told to serve none (llama-server's --no-webui), one line that says so."""
    import tiny_gguf
    from bonsai_launch.server.process import free_port
    from start_helpers import bonsai, stop_all

    target = tiny_gguf.write_target(tmp_path / "target.gguf")
    try:
        port = free_port()
        done = bonsai(["start", "--model", target, "--port", port, "--ctx", "512", "--detach"], server=llama_server)
        assert done.returncode == 0, done.stderr
        assert f"  chat page        http://127.0.0.1:{port}/\n" in done.stdout, done.stdout
        stop_all()
        port = free_port()
        args = ["start", "--model", target, "--port", port, "--ctx", "512", "--detach", "--", "--no-webui"]
        done = bonsai(args, server=llama_server)
        assert done.returncode == 0, done.stderr
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("  chat page")]
        assert "none" in line and "--no-webui" in line, line  # the build has the page: says what hides it
    finally:
        stop_all()
