"""The 27B profiles' drafter: the bf16 sidecar, pulled only for speculation, converted once,
shown by `bonsai models`, run by `bonsai start`; and `--drafter LEGACY.gguf`.

Pulls go through the real huggingface_hub client against tests/support/fake_hub.py; conversion uses
the real llama-quantize next to the real llama-server (built by `bonsai build`); the live
checks run the real llama-server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiny_gguf
from bonsai_launch.config.profiles import get_profile
from bonsai_launch.models import store as model_store
from bonsai_launch.models.drafters import cache as drafter_cache
from bonsai_launch.models.drafters import provenance
from bonsai_launch.models.drafters.provenance import read_provenance
from bonsai_launch.models.pull import ensure_profile_files
from cli_runner import run_cli
from fake_hub import TERNARY_27B
from legacy_dspark_gguf import write_legacy_drafter
from start_helpers import bonsai, json_out, stop_all

SIDECAR = "Ternary-Bonsai-27B-dspark-bf16.gguf"
CONVERTED = "Ternary-Bonsai-27B-dspark-dflash-Q4_0.gguf"
MODEL = "Ternary-Bonsai-27B-Q2_g64.gguf"


@pytest.fixture
def with_build(llama_server, monkeypatch):
    """The real build (llama-server and llama-quantize side by side) for conversions."""
    if not (llama_server.parent / "llama-quantize").is_file():
        pytest.fail(f"no llama-quantize next to {llama_server}: run `bonsai build`")
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(llama_server))
    return llama_server


def _models(capsys) -> dict:
    code, out, err = run_cli(capsys, "models", "--json")
    assert code == 0, err
    return {e["profile"]: e for e in json.loads(out)}


def test_profiles_name_the_sidecar_and_mark_the_q4_1_file_legacy():
    for name, prefix in (("ternary-27b", "Ternary-Bonsai-27B"), ("bonsai-27b", "Bonsai-27B")):
        profile = get_profile(name)
        mainline = profile.file("drafter", "mainline")
        assert mainline.name == f"{prefix}-dspark-bf16.gguf" and mainline.convert == "dspark"
        assert profile.file("drafter", "fork") == mainline  # prism-v7 forks need the conversion too
        q41 = next(f for f in profile.files if f.name == f"{prefix}-dspark-Q4_1.gguf")
        assert q41.layout == "legacy" and "type 42" in q41.note
        assert drafter_cache.profile_output(profile, mainline).name == f"{prefix}-dspark-dflash-Q4_0.gguf"


def test_pull_without_speculation_leaves_the_sidecar_alone(hub, capsys):
    code, out, err = run_cli(capsys, "pull", "--profile", "ternary-27b", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [f["name"] for f in data["files"]] == [MODEL, "Ternary-Bonsai-27B-mmproj-BF16.gguf"]
    assert any("--speculative" in n for n in data["notes"])
    assert hub.body_gets(SIDECAR) == []
    assert _models(capsys)["ternary-27b"]["drafter_state"]["state"] == "absent"


def test_pull_with_speculation_converts_once_and_start_uses_it(hub, capsys, with_build):
    code, out, err = run_cli(capsys, "pull", "--profile", "ternary-27b", "--speculative", "--no-vision", "--json")
    assert code == 0, err
    data = json.loads(out)
    by_role = {f["role"]: f for f in data["files"]}
    assert by_role["drafter source"]["name"] == SIDECAR and by_role["drafter source"]["status"] == "downloaded"
    assert by_role["drafter"]["name"] == CONVERTED and by_role["drafter"]["status"] == "converted"
    folder = model_store.folder("ternary-27b")
    prov = read_provenance(folder / CONVERTED)
    assert prov.source_sha256 == hub.repos[TERNARY_27B].files[SIDECAR].sha256 and prov.quantization == "Q4_0"
    assert _models(capsys)["ternary-27b"]["drafter_state"]["state"] == "current"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted([MODEL, SIDECAR, CONVERTED])

    # a second pull converts nothing and downloads nothing
    mtime = (folder / CONVERTED).stat().st_mtime_ns
    code, out, err = run_cli(capsys, "pull", "--profile", "ternary-27b", "--speculative", "--no-vision", "--json")
    assert code == 0, err
    assert {f["role"]: f["status"] for f in json.loads(out)["files"]}["drafter"] == "already converted"
    assert (folder / CONVERTED).stat().st_mtime_ns == mtime and len(hub.body_gets(SIDECAR)) == 1

    # start's path: the converted file, without the network
    hub.stop()
    paths = ensure_profile_files(get_profile("ternary-27b"), layout="mainline", want_drafter=True, want_vision=False)
    assert paths["drafter"] == folder / CONVERTED
    code, out, err = run_cli(capsys, "start", "--profile", "ternary-27b", "--speculative", "--dry-run", "--json")
    assert code == 0, err
    argv = json.loads(out)["argv"]
    assert argv[argv.index("-md") + 1] == str(folder / CONVERTED)
    assert SIDECAR not in " ".join(argv)


def test_stale_conversion_is_shown_and_redone(hub, capsys, with_build, monkeypatch):
    assert run_cli(capsys, "pull", "--profile", "ternary-27b", "--speculative", "--no-vision")[0] == 0
    monkeypatch.setattr(provenance, "CONVERTER_VERSION", "999")
    state = _models(capsys)["ternary-27b"]["drafter_state"]
    assert state["state"] == "converted" and "converter version 1" in state["reasons"][0]
    code, out, err = run_cli(capsys, "pull", "--profile", "ternary-27b", "--speculative", "--no-vision", "--json")
    assert code == 0, err
    assert {f["role"]: f["status"] for f in json.loads(out)["files"]}["drafter"] == "converted"
    assert _models(capsys)["ternary-27b"]["drafter_state"]["state"] == "current"


# --- --drafter LEGACY.gguf -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    return {
        "target": tiny_gguf.write_target(d / "T.gguf", layers=4, constant_token=7),
        "legacy": write_legacy_drafter(d / "L.gguf", log_snr=False, constant_token=7),
        "legacy_snr": write_legacy_drafter(d / "LS.gguf", log_snr=True, constant_token=7),
    }


def test_dry_run_refuses_a_legacy_drafter_with_the_exact_command(pair, capsys):
    code, _out, err = run_cli(
        capsys, "start", "--model", str(pair["target"]), "--drafter", str(pair["legacy"]), "--speculative", "--dry-run"
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert f"bonsai convert-drafter {pair['legacy']} --target {pair['target']} -o " in lines[0]


def _start_live(args, server, **env):
    from bonsai_launch.server.process import free_port
    from start_helpers import bonsai_env

    done = bonsai(
        ["start", *map(str, args), "--port", str(free_port()), "--ctx", "2048", "--detach", "--json"],
        env=bonsai_env(server, BONSAI_SPECULATIVE="1", **env),
        timeout=240,
    )
    try:
        return json_out(done), done
    finally:
        stop_all()


@pytest.mark.slow
def test_legacy_drafter_is_converted_into_the_cache_and_goes_live(pair, with_build, isolated_home):
    data, done = _start_live(["--model", pair["target"], "--drafter", pair["legacy"]], with_build)
    spec = data["speculative"]
    assert spec["live"] and spec["type"] == "draft-dspark" and spec["n_max"] == 4 and spec["drafted"] > 0
    [cached] = (isolated_home / "cache" / "drafters").glob("*.gguf")
    argv = data["plan"]["argv"]
    assert cached.name.startswith("L-dspark-dflash-Q4_0-") and argv[argv.index("-md") + 1] == str(cached)
    assert "converted the legacy drafter" in done.stderr
    mtime = cached.stat().st_mtime_ns
    data, done = _start_live(["--model", pair["target"], "--drafter", pair["legacy"]], with_build)
    assert data["speculative"]["live"] and cached.stat().st_mtime_ns == mtime  # reused, not redone
    assert "converted the legacy drafter" not in done.stderr


@pytest.mark.slow
def test_done_when_log_snr_drafter_converted_and_live(pair, with_build, tmp_path):
    """Issue 9's Done-when, with generated files only, on the build with the log-SNR patch."""
    out = tmp_path / "D.gguf"
    done = bonsai(["convert-drafter", pair["legacy_snr"], "--target", pair["target"], "-o", out], server=with_build)
    assert done.returncode == 0, done.stderr
    assert read_provenance(out).quantization == "Q4_0"
    from bonsai_launch.server.process import free_port
    from start_helpers import bonsai_env

    done = bonsai(
        ["start", "--model", pair["target"], "--drafter", out, "--port", str(free_port()), "--ctx", "2048", "--detach"],
        env=bonsai_env(with_build, BONSAI_SPECULATIVE="1"),
        timeout=240,
    )
    try:
        assert done.returncode == 0, done.stderr + done.stdout
        assert "speculative decoding: live (draft-dspark, n-max 4, " in done.stdout + done.stderr
    finally:
        stop_all()
    data, _ = _start_live(["--model", pair["target"], "--drafter", pair["legacy_snr"]], with_build)
    assert data["speculative"]["live"] and data["speculative"]["n_max"] == 4


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"role": "drafter", "name": "D.gguf", "convert": "magic"}, "convert='magic' is not known"),
        ({"role": "mmproj", "name": "M.gguf", "convert": "dspark"}, "only a drafter"),
    ],
)
def test_profile_convert_field_is_checked(entry, words):
    from bonsai_launch.config.profiles import parse_profile
    from bonsai_launch.core.errors import BonsaiError

    data = {
        "name": "p",
        "family": "x",
        "size": "1B",
        "description": "d",
        "repo": "a/b",
        "files": [{"role": "model", "name": "M0.gguf"}, entry],
    }
    with pytest.raises(BonsaiError) as err:
        parse_profile(data, Path("p.yaml"))
    assert words in str(err.value)


def test_models_says_downloaded_when_only_the_sidecar_is_there(tiny_repo_files, capsys):
    folder = model_store.folder("ternary-27b")
    folder.mkdir(parents=True)
    (folder / SIDECAR).write_bytes(tiny_repo_files[SIDECAR])
    assert _models(capsys)["ternary-27b"]["drafter_state"]["state"] == "downloaded"
