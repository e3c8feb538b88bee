"""The pinned fork as a git source, against a local git repository standing in for PrismML's.

The repository holds the fake llama.cpp tree (three C programs, seconds to build) under a
release tag. No real fork is cloned or built here: GitHub cannot be reached from the test
machines, which is itself what the no-network tests use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tiny_gguf
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.core.paths import builds_dir, sources_dir
from bonsai_launch.llamacpp.builds import BuildRequest, build, ensure_server, find_installed, lookup
from bonsai_launch.llamacpp.builds import source as source_module
from bonsai_launch.llamacpp.builds.pin import load_pin
from build_helpers import fake_tree, file_index, help_patch, make_sdist, use_index, use_pin

TAG = "prism-b10743-abcdef0"
GIT = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
NO_NETWORK = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "GIT_TERMINAL_PROMPT": "0"}


@pytest.fixture(autouse=True)
def cpu_machine(monkeypatch):
    monkeypatch.setattr(lookup, "detected_backend", lambda: "cpu")


@pytest.fixture
def fork_repo(tmp_path) -> tuple[Path, str]:
    """A git repository with the fake tree, an annotated release tag, and a later commit on
    the branch (so a build of the tag is not a build of the branch tip). Returns (repo, tag commit)."""
    repo = fake_tree(tmp_path / "fork")
    subprocess.run([*GIT, "init", "-q", "-b", "prism", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-m", "release"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "tag", "-a", TAG, "-m", "release"], check=True)
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (repo / "LATER").write_text("the branch moved on\n")
    subprocess.run([*GIT, "-C", str(repo), "add", "LATER"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-m", "later"], check=True)
    return repo, commit


def fork_pin(
    folder: Path,
    url: str,
    commit: str,
    *,
    tag: str = TAG,
    archive: Path | None = None,
    sha: str = "0" * 64,
    release: int = 10743,
):
    """A pin.toml whose default is a fake sdist and whose [sources.prismml] is the fork fixture."""
    folder.mkdir(parents=True, exist_ok=True)
    name = archive.name if archive else "fake_llama_bin-1.0.tar.gz"
    top = name.removesuffix(".tar.gz")
    (folder / "pin.toml").write_text(
        "[default]\n"
        f'kind = "pypi-sdist"\npackage = "fake-llama-bin"\nversion = "1.0"\nfilename = "{name}"\n'
        f'sha256 = "{sha}"\ntree = "{top}/llama.cpp"\nbuild_number = 4242\n'
        "[sources.prismml]\n"
        f'kind = "git"\nurl = "{url}"\ntag = "{tag}"\ncommit = "{commit}"\nflavour = "fork"\nrelease = {release}\n'
    )
    return load_pin(folder / "pin.toml")


def no_leftovers() -> None:
    """Nothing half-made: no clone, temporary folder or build."""
    leftovers = (
        [p.name for p in sources_dir().iterdir() if p.name not in (".lock", "downloads")]
        if sources_dir().is_dir()
        else []
    )
    assert leftovers == []
    assert not builds_dir().exists() or not any(builds_dir().iterdir())


def test_tag_resolves_and_builds_a_fork_under_its_own_key(tmp_path, fork_repo, monkeypatch):
    repo, commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit))
    result = build(BuildRequest(source="prismml"))
    src = result.manifest["source"]
    assert src["commit"] == commit  # the tag's commit, not the branch tip after it
    assert (src["flavour"], src["release"], src["kind"]) == ("fork", 10743, "git")
    assert result.manifest["key"].startswith("cpu-prismml-")
    assert find_installed("cpu", "fork") == result.server
    assert find_installed("cpu", "mainline") is None  # a fork build never stands in for mainline
    again = build(BuildRequest(source="prismml"))
    assert again.up_to_date and again.server == result.server


def test_a_short_commit_is_checked_as_a_prefix(tmp_path, fork_repo, monkeypatch):
    """Only the short id of a release may be public (prism-b10828-a153697): 7 digits pin it."""
    repo, commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit[:7]))
    result = build(BuildRequest(source="prismml"))
    assert result.manifest["source"]["commit"] == commit  # the full commit the tag resolved to
    assert find_installed("cpu", "fork") == result.server  # ranked as the pinned release
    assert build(BuildRequest(source="prismml")).up_to_date


def test_a_short_commit_that_differs_is_refused(tmp_path, fork_repo, monkeypatch):
    repo, commit = fork_repo
    other = "0123456" if not commit.startswith("0123456") else "6543210"
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), other))
    with pytest.raises(ActionFailed) as err:
        build(BuildRequest(source="prismml"))
    assert f"resolves to commit {commit[:12]}, but the pin says {other} (a prefix" in err.value.message
    no_leftovers()


@pytest.mark.parametrize(
    "commit,release,expected",
    [
        ("a15369", 10743, "has 6 hex digits; a pin needs 7 to 40"),
        ("a15369g", 10743, "is not a hex commit id"),
        ("a" * 41, 10743, "has 41 hex digits"),
        ("a153697", 10828, "tag 'prism-b10743-abcdef0' is release 10743, but release is 10828"),
    ],
)
def test_pin_refuses_a_commit_or_release_that_cannot_be_checked(tmp_path, commit, release, expected):
    with pytest.raises(BonsaiError, match=re.escape(expected)):
        fork_pin(tmp_path, "https://x.invalid/f.git", commit, release=release)


def test_wrong_commit_is_refused_before_the_clone(tmp_path, fork_repo, monkeypatch):
    repo, _commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), "1" * 40))
    calls = []
    real_git = source_module._git
    monkeypatch.setattr(source_module, "_git", lambda *args, **kw: calls.append(args[0]) or real_git(*args, **kw))
    with pytest.raises(ActionFailed, match=f"tag {TAG} resolves to commit .* but the pin says 111111111111: refused"):
        build(BuildRequest(source="prismml"))
    assert calls == ["ls-remote"]  # the remote's answer was enough: nothing was cloned
    no_leftovers()


def test_wrong_commit_is_refused_after_the_clone(tmp_path, fork_repo, monkeypatch):
    """The remote can lie or change between the look-up and the clone: what was cloned is checked."""
    repo, _commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), "2" * 40))
    monkeypatch.setattr(source_module, "check_remote", lambda url, ref, what: "")
    with pytest.raises(ActionFailed, match="but the pin says 222222222222: refused"):
        build(BuildRequest(source="prismml"))
    no_leftovers()


def test_missing_tag_is_refused(tmp_path, fork_repo, monkeypatch):
    repo, commit = fork_repo
    use_pin(
        monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit, tag="prism-b99999-0000000", release=99999)
    )
    with pytest.raises(ActionFailed, match="has no tag or branch 'prism-b99999-0000000'"):
        build(BuildRequest(source="prismml"))
    no_leftovers()


def test_pin_refuses_a_tag_without_its_commit(tmp_path):
    (tmp_path / "pin.toml").write_text(
        '[default]\npackage = "p"\nversion = "1"\nfilename = "p-1.tar.gz"\nsha256 = "ab"\ntree = "p-1/llama.cpp"\n'
        '[sources.prismml]\nkind = "git"\nurl = "https://x.invalid/f.git"\ntag = "prism-b1-a"\n'
    )
    with pytest.raises(BonsaiError, match="without the commit it must resolve to"):
        load_pin(tmp_path / "pin.toml")


@pytest.mark.slow
def test_build_keys_stay_apart_and_patches_stay_on_the_pin(tmp_path, fork_repo, monkeypatch):
    """The pinned sdist (with our patch) and the fork (never patched) build side by side."""
    repo, commit = fork_repo
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    patches = tmp_path / "patches"
    help_patch(patches, new_type="draft-patched")
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit, archive=archive, sha=sha), patches)
    mainline = build(BuildRequest())
    fork = build(BuildRequest(source="prismml"))
    assert mainline.manifest["key"] != fork.manifest["key"] and mainline.key_dir != fork.key_dir
    assert "draft-patched" in mainline.manifest["capabilities"]["spec_types"]
    assert "draft-patched" not in fork.manifest["capabilities"]["spec_types"]
    assert fork.manifest["source"]["patches"] == [] and fork.manifest["patches_hash"] == ""
    assert find_installed("cpu", "mainline") == mainline.server
    assert find_installed("cpu", "fork") == fork.server
    assert ensure_server("cpu") == mainline.server
    assert ensure_server("cpu", flavour="fork") == fork.server

    from bonsai_launch.doctor import gather

    report = {b["key"]: b for b in gather().builds}
    fork_entry, main_entry = report[fork.manifest["key"]], report[mainline.manifest["key"]]
    assert fork_entry["flavour"] == "fork" and "bonsai2-27b" in fork_entry["profiles"]
    # the fixture's mainline series has no patch 0010, so it cannot undo Bonsai 2's fold
    assert main_entry["flavour"] == "mainline" and "bonsai2-27b" not in main_entry["profiles"]
    assert "ternary-27b" in main_entry["profiles"] and "ternary-27b" in fork_entry["profiles"]


def test_start_bonsai2_uses_the_fork_build_and_its_files(tmp_path, fork_repo, monkeypatch):
    """With both builds installed, bonsai2-27b plans on the fork with PQ2_0 and ternary-27b on
    mainline with g64; BONSAI_LAYOUT=fork moves ternary-27b to the fork and its PQ2_0 file."""
    from bonsai_launch.core.paths import profile_models_dir
    from bonsai_launch.llamacpp.choice import choose_server
    from bonsai_launch.server.inputs import gather_plan, select

    repo, commit = fork_repo
    archive, sha = make_sdist(tmp_path / "dist")
    use_index(monkeypatch, file_index(tmp_path / "index", "fake-llama-bin", archive, sha))
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit, archive=archive, sha=sha))
    mainline, fork = build(BuildRequest()), build(BuildRequest(source="prismml"))
    for profile, name in (
        ("bonsai2-27b", "Ternary-Bonsai-2-27B-PQ2_0.gguf"),
        ("ternary-27b", "Ternary-Bonsai-27B-Q2_g64.gguf"),
        ("ternary-27b", "Ternary-Bonsai-27B-PQ2_0.gguf"),
    ):
        profile_models_dir(profile).mkdir(parents=True, exist_ok=True)
        tiny_gguf.write_target(profile_models_dir(profile) / name)

    def plan_for(flags, env=None):
        selection = select(flags, env or {})
        choice = choose_server(selection.settings, selection.flavour, backend="cpu")
        return choice, gather_plan(flags, binary=choice.path, env=env or {})

    # our own build first; the fixture's series has no patch 0010, so Bonsai 2 is refused there
    # with the build to make, and BONSAI_LAYOUT=fork picks the fork
    with pytest.raises(BonsaiError, match="older than our patch 0010 that undoes the fold: run `bonsai build`"):
        plan_for({"profile": "bonsai2-27b"})
    choice, plan = plan_for({"profile": "bonsai2-27b"}, {"BONSAI_LAYOUT": "fork"})
    assert choice.path == fork.server and Path(plan.model).name == "Ternary-Bonsai-2-27B-PQ2_0.gguf"
    assert "--temp" in plan.argv and plan.argv[plan.argv.index("--temp") + 1] == "1.0"
    choice, plan = plan_for({"profile": "ternary-27b"})
    assert choice.path == mainline.server and Path(plan.model).name == "Ternary-Bonsai-27B-Q2_g64.gguf"
    choice, plan = plan_for({"profile": "ternary-27b"}, {"BONSAI_LAYOUT": "fork"})
    assert choice.path == fork.server and Path(plan.model).name == "Ternary-Bonsai-27B-PQ2_0.gguf"


def _cli(
    argv: list[str], home: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_") and k != "PORT"}
    env.update(BONSAI_HOME=str(home), **NO_NETWORK, **(extra_env or {}))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    return done, time.monotonic() - started


def test_build_prismml_without_network_fails_in_seconds_with_one_line(isolated_home):
    """The real vendored pin; the network is cut with a proxy that refuses every connection."""
    done, seconds = _cli(["build", "--source", "prismml"], isolated_home)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "error: cannot reach https://github.com/PrismML-Eng/llama.cpp.git to fetch prism-b10828-a153697"
    )
    assert "nothing was downloaded" in lines[0]
    assert seconds < 15, seconds
    assert not (isolated_home / "sources").exists() and not (isolated_home / "builds").exists()


def test_start_bonsai2_without_a_fork_build_stops_before_any_download(isolated_home):
    done, seconds = _cli(["start", "--profile", "bonsai2-27b"], isolated_home, {"BONSAI_LAYOUT": "fork"})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "needs a PrismML fork build" in lines[0] and "`bonsai build --source prismml`" in lines[0]
    assert seconds < 15, seconds
    assert not (isolated_home / "models").exists() and not (isolated_home / "builds").exists()


def test_doctor_lists_every_build_with_the_profiles_it_runs(isolated_home, tmp_path, fork_repo, monkeypatch, capsys):
    repo, commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit))
    fork = build(BuildRequest(source="prismml"))
    from cli_runner import run_cli

    _code, out, _err = run_cli(capsys, "doctor", "--json")
    builds = json.loads(out)["builds"]
    assert [b["key"] for b in builds] == [fork.manifest["key"]]
    assert builds[0]["kind"] == "PrismML fork build b10743" and "bonsai2-27b" in builds[0]["profiles"]


def test_start_bonsai2_builds_the_pinned_fork_when_it_can_be_fetched(tmp_path, fork_repo, monkeypatch):
    """No fork build yet, the fork reachable (here: the local fixture): `bonsai start` builds it,
    then plans on it. Downloads are left out (the file is already in place)."""
    from bonsai_launch.cli._launch import LaunchOptions
    from bonsai_launch.core.paths import profile_models_dir
    from bonsai_launch.server import prepare

    repo, commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit))
    monkeypatch.setattr(prepare, "fetch_profile_files", lambda *args, **kwargs: None)
    profile_models_dir("bonsai2-27b").mkdir(parents=True)
    tiny_gguf.write_target(profile_models_dir("bonsai2-27b") / "Ternary-Bonsai-2-27B-PQ2_0.gguf")
    assert find_installed("cpu", "fork") is None
    monkeypatch.setenv("BONSAI_LAYOUT", "fork")
    plan, _key = prepare.prepare_plan(LaunchOptions(profile="bonsai2-27b").flags(), None, None, ())
    fork = find_installed("cpu", "fork")
    assert fork is not None and plan.binary == str(fork) and "prismml" in str(fork)
    assert Path(plan.model).name == "Ternary-Bonsai-2-27B-PQ2_0.gguf" and plan.profile == "bonsai2-27b"


@pytest.mark.slow
def test_builds_of_the_previous_pin_stay_usable_and_doctor_says_what_they_are_too_old_for(
    tmp_path, fork_repo, monkeypatch, capsys
):
    """A fork build of the previous pin (b10743) keeps running what it loads (bonsai2-27b); a
    profile that needs b10828 gets the new pin built; `bonsai doctor` names the profiles."""
    from bonsai_launch.doctor import gather
    from bonsai_launch.llamacpp.builds import ensure_server

    repo, commit = fork_repo
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor", repo.as_uri(), commit))
    old = build(BuildRequest(source="prismml"))
    assert old.manifest["source"]["release"] == 10743

    report = gather()
    [problem] = [p for p in report.problems if "older than" in p.what]
    assert problem.what == (
        "the newest PrismML fork build for cpu is b10743, older than the b10828 that "
        "bonsai2-2b, bonsai2-4b, bonsai2-9b, bonsai2.5-27b want"
    )
    assert "`bonsai build --source prismml`" in problem.fix and "stays usable" in problem.fix
    [entry] = report.builds
    assert "bonsai2-27b" in entry["profiles"] and "bonsai2-9b" not in entry["profiles"]
    assert entry["too_old_for"] == ["bonsai2-2b", "bonsai2-4b", "bonsai2-9b", "bonsai2.5-27b"]

    # the pin moves on: b10828 is the fixture branch's later commit, pinned by its short id
    later = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "prism"], capture_output=True, text=True, check=True
    ).stdout.strip()
    new_tag = "prism-b10828-" + later[:7]
    subprocess.run([*GIT, "-C", str(repo), "tag", "-a", new_tag, "-m", "release", later], check=True)
    use_pin(monkeypatch, fork_pin(tmp_path / "vendor2", repo.as_uri(), later[:7], tag=new_tag, release=10828))
    assert find_installed("cpu", "fork") == old.server  # still usable, for what it loads
    assert find_installed("cpu", "fork", min_release=10828) is None
    new = ensure_server("cpu", flavour="fork", min_release=10828)
    assert new != old.server and find_installed("cpu", "fork", min_release=10828) == new
    assert not [p for p in gather().problems if "older than" in p.what]
