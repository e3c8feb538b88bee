"""`bonsai pull` against a local fake hub, through the real huggingface_hub client.

The fake hub (tests/support/fake_hub.py) serves tiny generated GGUFs under the real repo and file
names; HF_ENDPOINT points at it. Each test states the failure it provokes and checks the
message a user would see.
"""

from __future__ import annotations

import json
import threading

import pytest

from bonsai_launch.config.profiles import get_profile
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.models import store as model_store
from bonsai_launch.models.progress import RecordingReporter
from bonsai_launch.models.pull import ensure_profile_files, pull_profile, wanted_files
from cli_runner import run_cli as bonsai
from fake_hub import BONSAI_8B, GOOD_TOKEN, TERNARY_27B

# the fork's drafter is the bf16 sidecar too (the Q4_1 file loads on no current build): pulled
# only for speculation, see test_drafter_profiles.py
FORK_FILES = ["Ternary-Bonsai-27B-PQ2_0.gguf", "Ternary-Bonsai-27B-mmproj-BF16.gguf"]
MAINLINE_MODEL = "Ternary-Bonsai-27B-Q2_g64.gguf"
MMPROJ = "Ternary-Bonsai-27B-mmproj-BF16.gguf"


def ternary(layout: str = "mainline", **kw):
    reporter = kw.pop("reporter", None) or RecordingReporter()
    return pull_profile(get_profile("ternary-27b"), layout=layout, reporter=reporter, **kw), reporter


def test_pull_fetches_exactly_the_profile_files_and_records_them(hub):
    result, _ = ternary("fork")
    assert [f.name for f in result.files] == FORK_FILES
    assert [f.status for f in result.files] == ["downloaded"] * 2
    folder = model_store.folder("ternary-27b")
    for f in result.files:
        assert (folder / f.name).read_bytes() == hub.repos[TERNARY_27B].files[f.name].content
        assert model_store.state("ternary-27b", f.name).verified
    assert result.commit == hub.repos[TERNARY_27B].commit
    # by manifest, never by pattern: the F16 weights, the other projector, the other layout's weights
    fetched = {s.path.rsplit("/", 1)[-1] for s in hub.requests if "/resolve/" in s.path}
    assert fetched == set(FORK_FILES)
    assert not (folder / ".partial").exists()

    again, _ = ternary("fork")
    assert [f.status for f in again.files] == ["already verified"] * 2
    assert len(hub.body_gets()) == 2  # nothing downloaded the second time


def test_mainline_pull_skips_the_sidecar_drafter_without_speculation_and_says_so(hub):
    result, _ = ternary("mainline")
    assert [f.name for f in result.files] == [MAINLINE_MODEL, MMPROJ]
    assert any("fetched only for speculative decoding" in n and "--speculative" in n for n in result.notes)
    files, _ = wanted_files(get_profile("ternary-27b"), "fork", want_drafter=False, want_vision=False)
    assert [f.name for f in files] == ["Ternary-Bonsai-27B-PQ2_0.gguf"]


def test_cut_off_download_resumes_with_a_range_request(hub):
    blob = hub.repos[TERNARY_27B].files[MAINLINE_MODEL]
    half = (len(blob.content) // 2) // (16 * 1024) * (16 * 1024)
    blob.cut_after, blob.fail_after_cut = half, 1

    with pytest.raises(ActionFailed) as cut:
        ternary("mainline", want_vision=False)
    assert f"stopped at {model_store.human(half)}" in cut.value.message
    assert "partial download is kept" in cut.value.message
    [partial] = model_store.partials("ternary-27b", MAINLINE_MODEL)
    assert partial.stat().st_size == half
    assert not model_store.state("ternary-27b", MAINLINE_MODEL).present
    # huggingface_hub itself retried once with a Range header; the hub answered 503
    first_run = hub.body_gets(MAINLINE_MODEL)
    assert [s.range for s in first_run] == [None, f"bytes={half}-"]

    result, reporter = ternary("mainline", want_vision=False)
    second = hub.body_gets(MAINLINE_MODEL)[len(first_run) :]
    assert [(s.range, s.status) for s in second] == [(f"bytes={half}-", 206)]
    assert second[0].body_bytes == len(blob.content) - half  # not restarted from zero
    [model] = result.files
    assert (model.status, model.resumed_from, model.downloaded_bytes) == ("resumed", half, len(blob.content) - half)
    assert model.path.read_bytes() == blob.content
    assert model_store.state("ternary-27b", MAINLINE_MODEL).verified
    assert any(n.startswith("resuming") for n in reporter.notes)
    assert model_store.partials("ternary-27b", MAINLINE_MODEL) == []


def test_resume_when_the_server_ignores_range_starts_over_cleanly(hub):
    blob = hub.repos[TERNARY_27B].files[MAINLINE_MODEL]
    half = (len(blob.content) // 2) // (16 * 1024) * (16 * 1024)
    blob.cut_after = half
    with pytest.raises(ActionFailed):
        ternary("mainline", want_vision=False)
    blob.ignore_range = True  # 200 and the whole file: huggingface_hub rewinds our partial file
    result, _ = ternary("mainline", want_vision=False)
    assert hub.body_gets(MAINLINE_MODEL)[-1].status == 200
    assert result.files[0].path.read_bytes() == blob.content  # and the running sha256 was reset
    assert (result.files[0].status, result.files[0].resumed_from) == ("downloaded", 0)


def test_unwritable_models_dir(hub, monkeypatch, tmp_path):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a folder")
    monkeypatch.setenv("BONSAI_MODELS_DIR", str(in_the_way))
    with pytest.raises(ActionFailed, match="cannot write the models of ternary-27b to") as err:
        ternary("mainline")
    assert "BONSAI_MODELS_DIR" in err.value.fix


def test_corrupted_byte_is_caught_and_not_kept(hub):
    blob = hub.repos[TERNARY_27B].files[MAINLINE_MODEL]
    blob.corrupt_at = 12345
    with pytest.raises(ActionFailed, match="failed its sha256 check") as bad:
        ternary("mainline", want_vision=False)
    assert blob.sha256 in bad.value.message and "the download was deleted" in bad.value.message
    state = model_store.state("ternary-27b", MAINLINE_MODEL)
    assert not state.present and not state.verified and state.partial_bytes == 0
    assert MAINLINE_MODEL not in model_store.read_records("ternary-27b")

    blob.corrupt_at = None
    result, _ = ternary("mainline", want_vision=False)
    assert result.files[0].status == "downloaded"
    assert hub.body_gets(MAINLINE_MODEL)[-1].range is None  # the bad bytes were not resumed from


def test_private_repo_without_a_token_says_how_to_set_one(hub):
    hub.repos[TERNARY_27B].private = True
    with pytest.raises(BonsaiError) as err:
        ternary("mainline")
    assert "prism-ml/Ternary-Bonsai-27B-gguf needs a Hugging Face read token" in err.value.message
    assert "HTTP" not in err.value.fix and "BONSAI_TOKEN" in err.value.fix and ".bonsai_token" in err.value.fix
    assert not model_store.folder("ternary-27b").exists()


def test_private_repo_with_a_wrong_token_names_where_it_came_from(hub, monkeypatch):
    hub.repos[TERNARY_27B].private = True
    monkeypatch.setenv("BONSAI_TOKEN", "hf_wrong")
    with pytest.raises(BonsaiError, match="refused the token from BONSAI_TOKEN"):
        ternary("mainline")


@pytest.mark.parametrize("where", ["env", "cwd", "home", "hf_token"])
def test_private_repo_with_a_token(hub, monkeypatch, tmp_path, isolated_home, where):
    hub.repos[TERNARY_27B].private = True
    if where == "env":
        monkeypatch.setenv("BONSAI_TOKEN", GOOD_TOKEN)
    elif where == "cwd":
        (tmp_path / ".bonsai_token").write_text(GOOD_TOKEN + "\n")
    elif where == "home":
        (isolated_home / ".bonsai_token").write_text(GOOD_TOKEN)
    else:
        monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    result, _ = ternary("mainline")
    assert all(f.verified for f in result.files)
    assert {s.authorization for s in hub.requests if s.path.startswith("/api/models/")} == {f"Bearer {GOOD_TOKEN}"}


def test_file_missing_from_the_repo_is_a_404_naming_it(hub):
    del hub.repos[TERNARY_27B].files[MMPROJ]
    with pytest.raises(ActionFailed) as err:
        ternary("mainline")
    # what exists, closest first: the other projector, the one a typo in the profile would mean
    assert err.value.message.startswith(
        f"{MMPROJ} is not in {TERNARY_27B} at revision main (HTTP 404); "
        "closest there: Ternary-Bonsai-27B-mmproj-Q8_0.gguf, "
    )
    assert hub.body_gets() == []  # refused before downloading anything


def test_file_listed_but_not_downloadable_is_a_404_from_the_client(hub):
    hub.repos[TERNARY_27B].files[MMPROJ].resolvable = False
    with pytest.raises(ActionFailed, match=rf"{MMPROJ} is not in {TERNARY_27B} \(HTTP 404"):
        ternary("mainline")


def test_unknown_revision(hub):
    with pytest.raises(BonsaiError, match="--revision='v9' is not a branch, tag or commit"):
        ternary("mainline", revision="v9")


def test_not_enough_disk_space_refuses_with_the_numbers(hub):
    hub.repos[TERNARY_27B].files[MAINLINE_MODEL].reported_size = 10**15
    with pytest.raises(ActionFailed) as err:
        ternary("mainline")
    assert "not enough disk space in" in err.value.message
    assert "1000.0 TB" in err.value.message and "is free" in err.value.message
    assert "BONSAI_MODELS_DIR" in err.value.fix
    assert hub.body_gets() == []


def test_two_concurrent_pulls_of_one_profile_download_once(hub):
    hub.gate.clear()  # hold the first pull inside its first download
    first_reporter, second_reporter = RecordingReporter(), RecordingReporter()
    results: dict[str, object] = {}

    def run(name, reporter):
        try:
            results[name] = ternary("fork", reporter=reporter)[0]
        except Exception as exc:  # pragma: no cover - reported below
            results[name] = exc

    first = threading.Thread(target=run, args=("first", first_reporter))
    first.start()
    assert hub.body_started.wait(10)
    second = threading.Thread(target=run, args=("second", second_reporter))
    second.start()
    for _ in range(200):
        if second_reporter.notes:
            break
        threading.Event().wait(0.02)
    assert second_reporter.notes and second_reporter.notes[0].startswith("waiting: another bonsai command is writing")
    hub.gate.set()
    first.join(20)
    second.join(20)
    assert [f.status for f in results["first"].files] == ["downloaded"] * 2
    assert [f.status for f in results["second"].files] == ["already verified"] * 2
    assert len(hub.body_gets()) == 2


def test_offline_uses_the_local_copy_without_any_request(hub, monkeypatch):
    from huggingface_hub import constants

    ternary("mainline")
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    result, _ = ternary("mainline")
    assert result.offline and [f.status for f in result.files] == ["already verified"] * 2
    assert hub.requests == []


def test_offline_without_a_local_copy_names_the_file_and_the_fix(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BonsaiError) as err:
        ternary("mainline", want_vision=False)
    assert err.value.message.startswith(f"offline (HF_HUB_OFFLINE is set) and {MAINLINE_MODEL} is not in ")
    assert "unset HF_HUB_OFFLINE" in err.value.fix
    assert hub.requests == []


def test_unreachable_hub(hub, monkeypatch):
    from tiny_gguf import free_port

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ActionFailed, match=r"cannot reach the Hugging Face Hub at http://127\.0\.0\.1:"):
        ternary("mainline")


def test_unreachable_hub_with_verified_files_carries_on(hub, monkeypatch):
    from tiny_gguf import free_port

    ternary("mainline")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    result, _ = ternary("mainline")
    assert [f.status for f in result.files] == ["already verified"] * 2
    assert any("cannot reach" in n and "verified earlier" in n for n in result.notes)


def test_hand_placed_file_is_hashed_once_and_a_wrong_one_replaced(hub):
    blob = hub.repos[TERNARY_27B].files[MAINLINE_MODEL]
    folder = model_store.folder("ternary-27b")
    folder.mkdir(parents=True)
    (folder / MAINLINE_MODEL).write_bytes(blob.content)
    result, _ = ternary("mainline", want_vision=False)
    assert result.files[0].status == "verified" and hub.body_gets() == []

    (folder / MAINLINE_MODEL).write_bytes(b"\0" * len(blob.content))  # same size, other bytes
    result, _ = ternary("mainline", want_vision=False)
    assert result.files[0].status == "updated"
    assert (folder / MAINLINE_MODEL).read_bytes() == blob.content


def test_drafter_that_does_not_fit_its_target_names_the_file_to_replace(hub, tmp_path):
    from legacy_dspark_gguf import write_legacy_drafter

    wrong = write_legacy_drafter(tmp_path / "wrong.gguf", vocab=2048, embedding=32, target_layers=(0,))
    hub.repos[TERNARY_27B].files["Ternary-Bonsai-27B-dspark-bf16.gguf"].content = wrong.read_bytes()
    with pytest.raises(ActionFailed) as err:
        ternary("fork", want_drafter=True)
    assert (
        "the drafter Ternary-Bonsai-27B-dspark-bf16.gguf does not fit the target Ternary-Bonsai-27B-PQ2_0.gguf"
        in err.value.message
    )
    assert "embedding size 32" in err.value.message
    assert err.value.fix.startswith(
        f"replace {model_store.folder('ternary-27b') / 'Ternary-Bonsai-27B-dspark-bf16.gguf'}"
    )


def test_ensure_profile_files_pulls_once_then_needs_no_network(hub, monkeypatch, llama_server):
    from tiny_gguf import free_port

    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(llama_server))  # its llama-quantize shrinks the drafter
    profile = get_profile("ternary-27b")
    paths = ensure_profile_files(profile, layout="fork", want_drafter=True, want_vision=False)
    assert set(paths) == {"model", "drafter"} and all(p.is_file() for p in paths.values())
    assert paths["drafter"].name == "Ternary-Bonsai-27B-dspark-dflash-Q4_0.gguf"
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert ensure_profile_files(profile, layout="fork", want_drafter=True, want_vision=False) == paths


def test_ensure_profile_files_reports_a_missing_token_as_an_error(hub):
    hub.repos[TERNARY_27B].private = True
    with pytest.raises(BonsaiError, match="needs a Hugging Face read token"):
        ensure_profile_files(get_profile("ternary-27b"), layout="mainline", want_drafter=False, want_vision=False)


# --- the commands, through the console-script entry point (error handler included) -------------


def test_cli_pull_models_and_rm(hub, capsys):
    code, out, _ = bonsai(capsys, "pull", "--family", "bonsai", "--size", "8B", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["profile"] == "bonsai-8b" and data["files"][0]["status"] == "downloaded"

    models = json.loads(bonsai(capsys, "models", "--json")[1])
    entry = next(e for e in models if e["profile"] == "bonsai-8b")
    [f] = entry["files"]
    assert f["present"] and f["verified"] and f["size"] == len(hub.repos[BONSAI_8B].files[f["name"]].content)
    other = next(e for e in models if e["profile"] == "ternary-27b")
    assert not any(f["present"] or f["verified"] for f in other["files"])

    code, out, _ = bonsai(capsys, "pull", "-p", "bonsai-8b")
    assert code == 0 and "already verified" in out

    code, _, err = bonsai(capsys, "rm", "bonsai-8b")
    assert code == 2 and err.startswith("error: refusing to delete") and "(add --yes)" in err
    code, out, _ = bonsai(capsys, "rm", "bonsai-8b", "--yes", "--json")
    assert code == 0 and json.loads(out)["freed_bytes"] > 0
    assert not model_store.folder("bonsai-8b").exists()


def test_cli_errors_are_one_line(hub, capsys):
    hub.repos[TERNARY_27B].private = True
    code, out, err = bonsai(capsys, "pull", "-p", "ternary-27b")
    assert code == 2 and out == ""
    assert err.startswith("error: prism-ml/Ternary-Bonsai-27B-gguf needs a Hugging Face read token")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_rm_refuses_while_a_pull_holds_the_lock(hub, capsys):
    ternary("mainline", want_vision=False)
    with model_store.profile_lock("ternary-27b"):
        code, _, err = bonsai(capsys, "rm", "ternary-27b", "--yes")
    assert code == 2 and "another bonsai command is writing profile ternary-27b" in err
    assert model_store.folder("ternary-27b").exists()


def test_models_marks_a_changed_file_as_not_verified(hub, capsys):
    result, _ = ternary("mainline", want_vision=False)
    path = result.files[0].path
    path.write_bytes(path.read_bytes()[:-1] + b"\1")
    models = json.loads(bonsai(capsys, "models", "--json")[1])
    entry = next(e for e in models if e["profile"] == "ternary-27b")
    model = next(f for f in entry["files"] if f["name"] == MAINLINE_MODEL)
    assert model["present"] and not model["verified"]
