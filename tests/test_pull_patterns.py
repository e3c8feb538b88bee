"""Profiles whose files are patterns: `bonsai pull` lists the repository (the real huggingface_hub
client against the local fake hub), resolves the patterns in preference order, verifies size and
sha256, and records the resolution in the lock; `bonsai start` then works from the lock alone.

The fake repositories hold names made up per test run (a random token in each name), so no name
can come from our code: only the profile's patterns can find them.
"""

from __future__ import annotations

import json
import uuid

import pytest

import tiny_gguf
from bonsai_launch.config.profiles import get_profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import lock as model_lock
from bonsai_launch.models import store as model_store
from bonsai_launch.models.progress import RecordingReporter
from bonsai_launch.models.pull import ensure_profile_files, pull_profile
from cli_runner import run_cli
from fake_hub import GOOD_TOKEN, _write_mmproj

REPO_9B = "prism-ml/Ternary-Bonsai-2-9B-gguf"
REPO_2B = "prism-ml/Ternary-Bonsai-2-2B-gguf"
# A template that, like Bonsai 2's, fails on a reasoning effort it does not take.
TEMPLATE = (
    "{%- if reasoning_effort is defined and reasoning_effort not in ['low', 'medium', 'xhigh'] -%}"
    "{{ raise_exception('unsupported reasoning_effort') }}{%- endif -%}"
    "{%- for m in messages -%}<|{{ m.role }}|>{{ m.content }}{%- endfor -%}"
)

# what `bonsai models` says of a Bonsai 2 file: our build folds it (patch 0010), the fork too
B2 = "bonsai's build (fold: patch 0010, served as Q2_0) or fork ≥ b10828"


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("b2")
    target = tiny_gguf.write_target(d / "t.gguf", chat_template=TEMPLATE).read_bytes()
    other = tiny_gguf.write_target(d / "o.gguf", seed=3, chat_template=TEMPLATE).read_bytes()
    mmproj = _write_mmproj(d / "mm.gguf").read_bytes()
    return {"target": target, "other": other, "mmproj": mmproj}


def made_up(tag: str = "") -> str:
    """A name stem no code can know: the repository's own spelling, different every run."""
    return f"TB2-9B{tag}-{uuid.uuid4().hex[:8]}"


def nine_b(hub, blobs, *, pq2: bool = False, ptq1: bool = True, q8: bool = True, bf16: bool = True):
    """The 9B repository with made-up names: the weights and projectors the patterns look for,
    plus the F16 weights and a README no pattern may catch. Returns {role-ish: name}."""
    repo = hub.add_repo(REPO_9B)
    stem = made_up()
    names = {}
    if pq2:
        names["pq2"] = repo.add(f"{stem}-PQ2_0.gguf", blobs["other"]).name
    if ptq1:
        names["ptq1"] = repo.add(f"{stem}-PTQ1_0.gguf", blobs["target"]).name
    if q8:
        names["q8"] = repo.add(f"{stem}-mmproj-Q8_0.gguf", blobs["mmproj"]).name
    if bf16:
        names["bf16"] = repo.add(f"{stem}-mmproj-BF16.gguf", blobs["mmproj"] + b"\0" * 8).name
    repo.add(f"{stem}-F16.gguf", blobs["target"] + b"\0" * 64)
    repo.add("README.md", b"# model card\n")
    return names


def pull(name: str = "bonsai2-9b", **kw):
    reporter = kw.pop("reporter", None) or RecordingReporter()
    return pull_profile(get_profile(name), layout="fork", reporter=reporter, **kw)


def fetched(hub) -> set[str]:
    return {s.path.rsplit("/", 1)[-1] for s in hub.requests if "/resolve/" in s.path and s.method == "GET"}


def test_pull_resolves_names_written_nowhere_in_our_code_and_records_them(hub, blobs, capsys):
    names = nine_b(hub, blobs)
    code, out, err = run_cli(capsys, "pull", "--family", "bonsai2", "--size", "9B", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [(f["role"], f["name"], f["status"]) for f in data["files"]] == [
        ("model", names["ptq1"], "downloaded"),  # no PQ2_0 here: the second pattern
        ("mmproj", names["q8"], "downloaded"),  # Q8_0 before BF16
    ]
    assert fetched(hub) == {names["ptq1"], names["q8"]}  # never the F16 weights or the other projector
    folder = model_store.folder("bonsai2-9b")
    repo = hub.repos[REPO_9B]
    for name in (names["ptq1"], names["q8"]):
        assert (folder / name).read_bytes() == repo.files[name].content
        assert model_store.state("bonsai2-9b", name).verified

    lock = json.loads(model_lock.lock_path().read_text())["profiles"]["bonsai2-9b"]
    assert lock["repo"] == REPO_9B
    entries = {e["role"]: e for e in lock["files"].values()}
    model = entries["model"]
    assert (model["name"], model["sha256"], model["size"]) == (
        names["ptq1"],
        repo.files[names["ptq1"]].sha256,
        len(blobs["target"]),
    )
    assert (model["commit"], model["revision"], model["wanted"]) == (
        repo.commit,
        "main",
        "*-PQ2_0.gguf, else *-PTQ1_0.gguf",
    )

    # `bonsai models` shows the repository, what the patterns resolved to, and the build each needs
    entry = next(e for e in json.loads(run_cli(capsys, "models", "--json")[1]) if e["profile"] == "bonsai2-9b")
    assert entry["repo"] == REPO_9B and entry["repo_unconfirmed"] is None
    shown = {f["role"]: f for f in entry["files"]}
    assert shown["model"]["name"] == names["ptq1"] and shown["model"]["verified"]
    assert shown["model"]["locked"]["commit"] == repo.commit and shown["model"]["builds"] == B2


def test_preference_order_decides_between_two_matches(hub, blobs, capsys):
    names = nine_b(hub, blobs, pq2=True, ptq1=True)
    code, out, err = run_cli(capsys, "pull", "--profile", "bonsai2-9b", "--json")
    assert code == 0, err
    assert [f["name"] for f in json.loads(out)["files"]] == [names["pq2"], names["q8"]]
    assert fetched(hub) == {names["pq2"], names["q8"]}


def test_a_later_pattern_is_used_when_the_first_matches_nothing(hub, blobs):
    names = nine_b(hub, blobs, q8=False)
    assert [f.name for f in pull().files] == [names["ptq1"], names["bf16"]]


def test_two_files_for_one_pattern_stop_the_pull_naming_both(hub, blobs):
    names = nine_b(hub, blobs)
    twin = hub.repos[REPO_9B].add(f"{made_up('-instruct')}-PTQ1_0.gguf", blobs["other"]).name
    with pytest.raises(ActionFailed) as err:
        pull()
    message = err.value.message
    assert message.startswith(f"2 files in {REPO_9B} at revision main match *-PTQ1_0.gguf (profile bonsai2-9b's model)")
    assert names["ptq1"] in message and twin in message and "does not guess" in message
    assert "BONSAI_PROFILES_DIR" in err.value.fix and "name:" in err.value.fix
    assert hub.body_gets() == [] and not model_lock.lock_path().exists()


def test_no_match_lists_what_the_repository_has(hub, blobs, capsys):
    repo = hub.add_repo(REPO_9B)
    stem = made_up()
    for name in (f"{stem}-Q4_K_M.gguf", f"{stem}-F16.gguf", f"{stem}-mmproj-Q8_0.gguf", "README.md"):
        repo.add(name, blobs["target"])
    code, out, err = run_cli(capsys, "pull", "-p", "bonsai2-9b")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(
        f"error: no file in {REPO_9B} at revision main matches *-PQ2_0.gguf, else *-PTQ1_0.gguf "
        "(profile bonsai2-9b's model); it has: "
    )
    assert f"{stem}-Q4_K_M.gguf" in lines[0] and f"{stem}-F16.gguf" in lines[0] and "README.md" not in lines[0]
    assert "BONSAI_PROFILES_DIR" in lines[0]  # the fix
    assert hub.body_gets() == []


def test_sha256_mismatch_keeps_nothing_and_records_nothing(hub, blobs):
    names = nine_b(hub, blobs)
    hub.repos[REPO_9B].files[names["ptq1"]].corrupt_at = 100
    with pytest.raises(ActionFailed, match="failed its sha256 check") as err:
        pull()
    assert hub.repos[REPO_9B].files[names["ptq1"]].sha256 in err.value.message
    assert not model_store.state("bonsai2-9b", names["ptq1"]).present
    assert model_store.partials("bonsai2-9b", names["ptq1"]) == []
    assert not model_lock.lock_path().exists()  # a resolution is recorded only with verified files


def test_size_is_checked_against_the_listing(hub, blobs):
    names = nine_b(hub, blobs)
    hub.repos[REPO_9B].files[names["ptq1"]].reported_size = len(blobs["target"]) + 10
    with pytest.raises(ActionFailed) as err:
        pull()
    assert err.value.message.startswith(f"{names['ptq1']} failed its size check: the listing says 371,")
    assert "\n" not in str(err.value) and "the download was deleted" in err.value.message
    assert model_store.partials("bonsai2-9b", names["ptq1"]) == []
    assert not model_store.state("bonsai2-9b", names["ptq1"]).present and not model_lock.lock_path().exists()


def test_a_rerun_uses_the_lock_offline_with_the_hub_gone(hub, blobs, monkeypatch):
    from huggingface_hub import constants

    from bonsai_launch.server.inputs import gather_plan

    names = nine_b(hub, blobs)
    pull()
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    paths = ensure_profile_files(get_profile("bonsai2-9b"), layout="fork", want_drafter=False, want_vision=True)
    assert {r: p.name for r, p in paths.items()} == {"model": names["ptq1"], "mmproj": names["q8"]}
    plan = gather_plan({"profile": "bonsai2-9b"}, env={})  # what `bonsai start --dry-run` plans, offline
    assert plan.model == str(paths["model"]) and plan.mmproj == str(paths["mmproj"])
    # the profile's template wrapper (reasoning effort) was written beside the model, and is used
    flag = plan.argv.index("--chat-template-file")
    wrapper = model_store.folder("bonsai2-9b") / (names["ptq1"].removesuffix(".gguf") + ".chat-template.jinja")
    assert plan.argv[flag + 1] == str(wrapper) and wrapper.read_text().endswith(TEMPLATE)


def test_offline_without_a_lock_says_the_file_is_not_resolved(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BonsaiError) as err:
        pull(want_vision=False)
    assert err.value.message.startswith(
        f"offline (HF_HUB_OFFLINE is set) and profile bonsai2-9b's model (*-PQ2_0.gguf, else *-PTQ1_0.gguf in "
        f"{REPO_9B}) is not resolved yet"
    )
    assert "unset HF_HUB_OFFLINE" in err.value.fix and hub.requests == []


def test_start_fetches_a_missing_file_by_the_lock_without_listing_the_repo(hub, blobs):
    names = nine_b(hub, blobs)
    pull()
    commit = hub.repos[REPO_9B].commit
    (model_store.folder("bonsai2-9b") / names["ptq1"]).unlink()
    hub.repos[REPO_9B].add(f"{made_up()}-PQ2_0.gguf", blobs["other"])  # would win a new resolution
    hub.requests.clear()
    paths = ensure_profile_files(get_profile("bonsai2-9b"), layout="fork", want_drafter=False, want_vision=True)
    assert paths["model"].name == names["ptq1"]  # the lock's file, not a new pick
    assert not [s for s in hub.requests if s.path.startswith("/api/")]  # no listing
    assert [s.path for s in hub.requests if "/resolve/" in s.path and s.method == "GET"] == [
        f"/{REPO_9B}/resolve/{commit}/{names['ptq1']}"
    ]


def test_a_pull_resolves_again_and_says_when_the_pick_changed(hub, blobs):
    names = nine_b(hub, blobs)
    pull()
    newer = hub.repos[REPO_9B].add(f"{made_up()}-PQ2_0.gguf", blobs["other"]).name
    result = pull()
    assert result.files[0].name == newer
    assert any(f"now resolves to {newer} (the lock had {names['ptq1']})" in n for n in result.notes)
    locked = model_lock.locked_files(get_profile("bonsai2-9b"))
    assert {r.role: r.name for r in locked.values()}["model"] == newer


def test_missing_unconfirmed_repository_says_it_is_unconfirmed_and_what_exists(hub, blobs, monkeypatch, capsys):
    nine_b(hub, blobs)  # the owner has the 9B repository, not the inferred 2B one
    monkeypatch.setenv("BONSAI_TOKEN", GOOD_TOKEN)  # with a token the hub says 404
    code, out, err = run_cli(capsys, "pull", "-p", "bonsai2-2b")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and out == "" and len(lines) == 1, err
    line = lines[0]
    assert line.startswith(
        f"error: repo {REPO_2B} not found at {hub.url} (HTTP 404); the profile's repository is NOT confirmed"
    )
    assert "looked for model *-PQ2_0.gguf, else *-PTQ1_0.gguf; mmproj *mmproj-Q8_0.gguf" in line
    assert f"prism-ml has: {REPO_9B}" in line
    assert "set repo: in a copy of bonsai2-2b.yaml" in line  # the fix
    assert not model_lock.lock_path().exists()

    monkeypatch.delenv("BONSAI_TOKEN")  # without one, the hub answers 401 for a missing repo
    with pytest.raises(BonsaiError) as no_token:
        pull("bonsai2-2b")
    assert "needs a Hugging Face read token" in no_token.value.message
    assert "NOT confirmed" in no_token.value.message and "BONSAI_TOKEN" in no_token.value.fix


def test_gated_repository_names_the_file_and_the_fix(hub, blobs, monkeypatch):
    names = nine_b(hub, blobs)
    hub.repos[REPO_9B].gated = True
    monkeypatch.setenv("BONSAI_TOKEN", GOOD_TOKEN)
    with pytest.raises(BonsaiError) as err:
        pull()
    assert err.value.message == f"{REPO_9B} is gated: the hub answered 403 (downloading {names['ptq1']})"
    assert f"accept its terms at https://huggingface.co/{REPO_9B}" in err.value.fix


def test_models_marks_unresolved_files_and_unconfirmed_repositories(capsys, monkeypatch):
    entry = next(e for e in json.loads(run_cli(capsys, "models", "--json")[1]) if e["profile"] == "bonsai2-2b")
    assert entry["repo"] == REPO_2B and "inferred" in entry["repo_unconfirmed"]
    assert [(f["role"], f["name"], f["wanted"], f["builds"]) for f in entry["files"]] == [
        ("model", None, "*-PQ2_0.gguf, else *-PTQ1_0.gguf", B2),
        ("mmproj", None, "*mmproj-Q8_0.gguf, else *mmproj-BF16.gguf", "any build"),
    ]
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = run_cli(capsys, "models")
    assert code == 0
    for needle in ("bonsai2-2b", "bonsai2-4b", "bonsai2-9b", "bonsai2.5-27b", "NOT CONFIRMED", "to be resolved"):
        assert needle in out, needle


def test_exact_name_profiles_record_their_files_in_the_lock_too(hub):
    pull_profile(get_profile("bonsai-8b"), reporter=RecordingReporter())
    [entry] = model_lock.locked_files(get_profile("bonsai-8b")).values()
    assert entry.name == "Bonsai-8B-Q1_0.gguf" and entry.wanted == "Bonsai-8B-Q1_0.gguf"


# --- the resolution itself: a pure function over a listing ------------------------------------


def _listing(*names: str):
    from bonsai_launch.models.hub import RemoteFile, RemoteListing

    return RemoteListing(REPO_9B, "main", "c" * 40, {n: RemoteFile(n, 1, "a" * 64) for n in names})


def test_resolution_is_pure_and_case_sensitive():
    from bonsai_launch.models.resolve import resolve_all

    profile = get_profile("bonsai2-9b")
    resolved = resolve_all(
        profile, list(profile.files), _listing("x-PTQ1_0.gguf", "x-pq2_0.gguf", "x-mmproj-BF16.gguf")
    )
    assert [(r.entry.name, r.pattern) for r in resolved] == [
        ("x-PTQ1_0.gguf", "*-PTQ1_0.gguf"),  # 'pq2_0' in lower case is not PQ2_0
        ("x-mmproj-BF16.gguf", "*mmproj-BF16.gguf"),
    ]
    assert [f.name for f in profile.files] == ["", ""]  # the profile itself is left as it was


def test_one_file_for_two_roles_is_refused():
    from bonsai_launch.config.profiles import parse_profile
    from bonsai_launch.models.resolve import resolve_all

    profile = parse_profile(
        {
            "name": "x",
            "family": "f",
            "size": "1B",
            "repo": REPO_9B,
            "files": [{"role": "model", "pattern": "*Q8_0.gguf"}, {"role": "mmproj", "pattern": "*mmproj-Q8_0.gguf"}],
        },
        get_profile("bonsai2-9b").source_file.with_name("x.yaml"),
    )
    with pytest.raises(ActionFailed, match=r"is both profile x's model .* and its mmproj"):
        resolve_all(profile, list(profile.files), _listing("x-mmproj-Q8_0.gguf"))
