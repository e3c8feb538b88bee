"""Which file each build runs, per profile: tables over the built-in profiles (pure, no builds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bonsai_launch.config.profiles import get_profile, load_all, parse_profile
from bonsai_launch.config.settings import resolve
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.flavours import (
    FOLD_PATCH,
    FORK,
    MAINLINE,
    BuildKind,
    builds_text,
    cannot_load,
    choose_file,
    kind_of_manifest,
    release_of_tag,
    runnable_profiles,
    too_old_for,
    wanted_flavour,
    why_no_file,
)

MAIN = BuildKind(MAINLINE)
FORK_PIN = BuildKind(FORK, 10828)  # prism-b10828-a153697, the pin
FORK_PREV = BuildKind(FORK, 10743)  # the previous pin: builds of it stay usable for what they load
FORK_V7 = BuildKind(FORK, 10658)  # the first prism-v7 release
FORK_OLD = BuildKind(FORK, 9596)  # a prism-v5 era release
FORK_UNKNOWN = BuildKind(FORK)  # a fork binary whose release we cannot tell

# (profile, build, role, the file chosen or None)
TABLE = [
    ("ternary-27b", MAIN, "model", "Ternary-Bonsai-27B-Q2_g64.gguf"),
    ("ternary-27b", FORK_PIN, "model", "Ternary-Bonsai-27B-PQ2_0.gguf"),
    ("ternary-27b", FORK_V7, "model", "Ternary-Bonsai-27B-PQ2_0.gguf"),
    ("ternary-27b", FORK_UNKNOWN, "model", "Ternary-Bonsai-27B-PQ2_0.gguf"),
    ("ternary-27b", FORK_OLD, "model", None),  # g64 and PQ2_0 need b10658; the legacy file is refused
    ("ternary-8b", MAIN, "model", "Ternary-Bonsai-8B-Q2_0_g64.gguf"),
    ("ternary-8b", FORK_PIN, "model", "Ternary-Bonsai-8B-PQ2_0.gguf"),
    ("ternary-4b", MAIN, "model", "Ternary-Bonsai-4B-Q2_0_g64.gguf"),
    ("ternary-4b", FORK_PIN, "model", "Ternary-Bonsai-4B-PQ2_0.gguf"),
    ("ternary-1.7b", MAIN, "model", "Ternary-Bonsai-1.7B-Q2_0_g64.gguf"),
    ("ternary-1.7b", FORK_PIN, "model", "Ternary-Bonsai-1.7B-PQ2_0.gguf"),
    ("bonsai2-27b", MAIN, "model", "Ternary-Bonsai-2-27B-PQ2_0.gguf"),  # folded (0010) and repacked
    ("bonsai2-27b", FORK_PIN, "model", "Ternary-Bonsai-2-27B-PQ2_0.gguf"),
    ("bonsai2-27b", FORK_PREV, "model", "Ternary-Bonsai-2-27B-PQ2_0.gguf"),
    ("bonsai2-27b", FORK_UNKNOWN, "model", "Ternary-Bonsai-2-27B-PQ2_0.gguf"),
    ("ternary-27b", FORK_PREV, "model", "Ternary-Bonsai-27B-PQ2_0.gguf"),
    ("bonsai2-27b", FORK_V7, "model", None),  # older than the release known to load Bonsai 2
    ("bonsai2-27b", FORK_PIN, "mmproj", "Ternary-Bonsai-2-27B-mmproj-Q8_0.gguf"),
    ("bonsai2-27b", MAIN, "mmproj", "Ternary-Bonsai-2-27B-mmproj-Q8_0.gguf"),
    ("bonsai2-27b", FORK_PIN, "drafter", None),  # no official Bonsai 2 drafter
    ("bonsai-8b", MAIN, "model", "Bonsai-8B-Q1_0.gguf"),
    ("bonsai-8b", FORK_PIN, "model", "Bonsai-8B-Q1_0.gguf"),
    ("bonsai-27b", FORK_PIN, "mmproj", "Bonsai-27B-mmproj-BF16.gguf"),
    ("ternary-27b", MAIN, "mmproj", "Ternary-Bonsai-27B-mmproj-BF16.gguf"),
    ("demo", MAIN, "model", "gemma-3-270m-q4_k_m.gguf"),
    ("demo", FORK_PIN, "model", "gemma-3-270m-q4_k_m.gguf"),
]


@pytest.mark.parametrize("profile,kind,role,expected", TABLE, ids=[f"{p}-{k.label()}-{r}" for p, k, r, _ in TABLE])
def test_profile_file_build_table(profile, kind, role, expected):
    chosen = choose_file(get_profile(profile), role, kind)
    assert (chosen.name if chosen else None) == expected


def test_legacy_group128_files_are_never_chosen_and_say_why():
    for profile in load_all().values():
        for entry in profile.files:
            if entry.layout != "legacy":
                continue
            # the legacy weights are group-128 Q2_0; the only legacy drafters are the 27B Q4_1 files
            assert (
                (entry.name.endswith("-Q2_0.gguf") and "PQ2" not in entry.name)
                if entry.role == "model"
                else entry.name.endswith("-dspark-Q4_1.gguf")
            )
            for kind in (MAIN, FORK_PIN, FORK_OLD, FORK_UNKNOWN):
                assert cannot_load(entry, kind) and "prism-v5" in cannot_load(entry, kind)
                assert choose_file(profile, entry.role, kind) is not entry
    assert (
        sum(f.layout == "legacy" and f.role == "model" for p in load_all().values() for f in p.files) == 4
    )  # one per ternary size


def test_why_no_file_names_the_fork_build_command():
    fork_only = parse_profile(
        {**BASE, "files": [{"role": "model", "name": "a-PQ2_0.gguf", "builds": "fork"}]}, Path("x.yaml")
    )
    why = why_no_file(fork_only, "model", MAIN)
    assert "bonsai build --source prismml" in why and "a-PQ2_0.gguf" in why
    old = why_no_file(get_profile("ternary-27b"), "model", FORK_OLD)
    assert "b10658 or newer; this build is b9596" in old and "prism-v5" in old


@pytest.mark.parametrize(
    "profile,layout,expected",
    [
        ("ternary-27b", None, MAINLINE),
        ("bonsai-27b", None, MAINLINE),
        ("demo", None, MAINLINE),
        ("bonsai2-27b", None, MAINLINE),  # our build folds Bonsai 2 (0010); the fork is a choice
        ("ternary-27b", "fork", FORK),
        ("bonsai2-27b", "mainline", MAINLINE),
    ],
)
def test_wanted_flavour(profile, layout, expected):
    assert wanted_flavour(get_profile(profile), layout) == expected


def test_default_profile_stays_runnable_on_the_mainline_pin():
    s = resolve(env={})
    default = get_profile(f"{s['family']}-{s['size'].lower()}")
    assert default.name == "ternary-27b" and wanted_flavour(default, s.get("layout")) == MAINLINE
    assert choose_file(default, "model", MAIN) is not None


def test_runnable_profiles_per_build():
    profiles = list(load_all().values())
    everything = {p.name for p in profiles}
    bonsai2 = {p.name for p in profiles if p.family.startswith("bonsai2")}
    newer = {"bonsai2-2b", "bonsai2-4b", "bonsai2-9b", "bonsai2.5-27b"}  # on the fork from b10828
    assert bonsai2 == newer | {"bonsai2-27b"}
    assert set(runnable_profiles(MAIN, profiles)) == everything  # Bonsai 2 too, through patch 0010
    assert set(runnable_profiles(FORK_PIN, profiles)) == everything
    # a build of the previous pin still runs everything it ran, just not what came out after it
    assert set(runnable_profiles(FORK_PREV, profiles)) == everything - newer
    assert set(too_old_for(10743, profiles)) == newer and too_old_for(10828, profiles) == []
    assert too_old_for(None, profiles) == []  # an unknown release is not called too old
    assert "ternary-27b" not in runnable_profiles(FORK_OLD, profiles)


def test_builds_text_and_release_numbers():
    p = get_profile("ternary-27b")
    assert [builds_text(f) for f in p.files if f.role == "model"] == [
        "mainline or fork ≥ b10658",
        "fork ≥ b10658",
        "legacy: refused",
    ]
    assert release_of_tag("prism-b10743-adfffbe") == 10743
    assert release_of_tag("prism-b10828-a153697") == 10828
    assert release_of_tag("prism") is None and release_of_tag("b11434") is None
    # manifests from before flavours are mainline; only a series with 0010 undoes the fold
    assert kind_of_manifest({"source": {"kind": "pin"}}) == BuildKind(MAINLINE, folds=False)
    assert kind_of_manifest({"source": {"patches": [FOLD_PATCH]}}).folds is True
    assert kind_of_manifest({"source": {"flavour": "fork", "release": 10828}}) == BuildKind(FORK, 10828, folds=True)


def test_bonsai2_profile_matches_the_reference():
    p = get_profile("bonsai2-27b")
    assert (p.family, p.size, p.repo) == ("bonsai2", "27B", "prism-ml/Ternary-Bonsai-2-27B-gguf")
    args = " ".join(p.server_args)
    assert "--temp 1.0 --top-p 0.95 --top-k 20 --min-p 0.05 --jinja" in args
    assert [f.name for f in p.files if f.role == "model"] == [
        "Ternary-Bonsai-2-27B-PQ2_0.gguf",
        "Ternary-Bonsai-2-27B-PTQ1_0.gguf",
    ]
    assert p.draft_free_type == "ngram-mod" and not p.has_role("drafter")
    assert "2%" in p.drafter_warning and p.reasoning_efforts == ("medium", "xhigh")
    assert dict(p.reasoning_efforts_refused).keys() == {"high", "low"} and p.reasoning_effort_fallback == "medium"


BASE = {"name": "x", "family": "f", "size": "1B", "repo": "o/r"}


@pytest.mark.parametrize(
    "entry,expected",
    [
        ({"role": "model", "name": "a.gguf", "builds": "fork", "layout": "fork"}, "has both builds and layout"),
        ({"role": "model", "name": "a.gguf", "builds": "sometimes"}, "builds='sometimes' is not known"),
        (
            {"role": "model", "name": "a.gguf", "builds": "mainline", "min_fork_release": 10658},
            "min_fork_release is set",
        ),
        ({"role": "model", "name": "a.gguf", "builds": "fork", "min_fork_release": "new"}, "must be a release number"),
        ({"role": "model", "name": "a.gguf", "builds": "legacy"}, "is legacy but has no note"),
    ],
)
def test_bad_builds_fields_are_refused(entry, expected):
    with pytest.raises(BonsaiError, match=expected):
        parse_profile({**BASE, "files": [entry]}, Path("x.yaml"))


def test_layout_is_still_read_as_the_older_name_of_builds():
    p = parse_profile({**BASE, "files": [{"role": "model", "name": "a.gguf", "layout": "fork"}]}, Path("x.yaml"))
    assert p.files[0].layout == "fork"


def test_own_weights_on_a_build_that_loads_none_of_the_profiles_files_are_warned_about():
    from bonsai_launch.server.inputs import _selection_warnings, select

    ternary = select({"family": "ternary"}, env={})
    assert any(
        "none of profile ternary-27b's weights load on a PrismML fork build b9596" in w
        for w in _selection_warnings(ternary, "own.gguf", FORK_OLD, None)
    )
    bonsai2 = select({"family": "bonsai2"}, env={})
    assert _selection_warnings(bonsai2, "own.gguf", MAIN, None) == []
    assert _selection_warnings(bonsai2, "own.gguf", FORK_PIN, None) == []
    assert _selection_warnings(ternary, "own.gguf", FORK_PIN, None) == []  # ternary files load on the fork too


def test_folded_files_need_patch_0010_on_a_mainline_build():
    entry = choose_file(get_profile("bonsai2-27b"), "model", MAIN)
    assert entry is not None and entry.folded
    assert "older than our patch 0010" in (cannot_load(entry, BuildKind(MAINLINE, folds=False)) or "")
    assert cannot_load(entry, BuildKind(MAINLINE, folds=True)) is None and cannot_load(entry, FORK_PIN) is None
    assert builds_text(entry) == "bonsai's build (fold: patch 0010, served as Q2_0) or fork ≥ b10743"
    with pytest.raises(BonsaiError, match="folded='yes' must be true or false"):
        parse_profile({**BASE, "files": [{"role": "model", "name": "a.gguf", "folded": "yes"}]}, Path("x.yaml"))
