"""`bonsai start` with llama-server arguments, through the real CLI (in-process, --dry-run) and
the real binary's option table (probed from its --help)."""

from __future__ import annotations

import json

import pytest

import tiny_gguf
from cli_runner import run_cli


@pytest.fixture
def model(tmp_path, llama_server, monkeypatch):
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(llama_server))
    return str(tiny_gguf.write_target(tmp_path / "target.gguf"))


@pytest.fixture
def drafter(tmp_path):
    return str(tiny_gguf.write_dspark_drafter(tmp_path / "drafter.gguf", block_size=4))


def dry_json(capsys, *args: str) -> dict:
    code, out, err = run_cli(capsys, "start", "--dry-run", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_typo_stops_with_the_closest_option(capsys, model):
    code, out, err = run_cli(capsys, "start", "--model", model, "--cxt", "4096", "--dry-run")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        (
            "error: unknown option --cxt (did you mean --ctx?) "
            "(see --help for bonsai's options; llama-server's own go after --)"
        )
    ]


def test_unknown_option_after_dashdash_is_refused_before_running(capsys, model):
    code, _, err = run_cli(capsys, "start", "--model", model, "--dry-run", "--", "--ctx-sise", "4096")
    assert code == 2 and "unknown option --ctx-sise (did you mean --ctx-size?)" in err


def test_known_llama_server_options_outside_dashdash_fold_like_after_it(capsys, model):
    # -np used to be read by Click as -n plus `-p 2` (the profile).
    data = dry_json(capsys, "--model", model, "-np", "2", "--threads", "2")
    assert data["slots"]["parallel"] == 2 and data["from_passthrough"] == ["parallel"]
    assert data["argv"].count("-np") == 1 and data["argv"][-2:] == ["--threads", "2"]


def test_port_given_twice_differently_is_refused(capsys, model):
    code, _, err = run_cli(capsys, "start", "--model", model, "--port", "9000", "--dry-run", "--", "--port", "9001")
    assert code == 2 and "--port 9000 and -- --port 9001 disagree (give it once, as --port / BONSAI_PORT)" in err
    data = dry_json(capsys, "--model", model, "--", "--port", "9001")
    assert data["port"] == 9001 and data["url"].endswith(":9001") and data["argv"].count("--port") == 1


def test_small_context_with_speculation(capsys, model, drafter):
    code, out, err = run_cli(
        capsys, "start", "--model", model, "--drafter", drafter, "--speculative", "--dry-run", "--", "-c", "1024"
    )
    assert code == 0, err
    argv = out.split()
    assert argv.count("-c") == 1 and argv[argv.index("-c") + 1] == "1024"
    assert "context 1024 (from --)" in err and "below 16384" in err
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4" and argv[argv.index("-np") + 1] == "1"


def test_remote_host_after_dashdash_is_refused_without_opt_in(capsys, model):
    code, out, err = run_cli(capsys, "start", "--model", model, "--dry-run", "--", "--host", "0.0.0.0")
    assert code == 2 and out == ""
    assert "-- --host='0.0.0.0' is not a loopback address" in err


def test_api_key_after_dashdash_is_hidden_from_dry_run(capsys, model):
    code, out, err = run_cli(capsys, "start", "--model", model, "--dry-run", "--", "--api-key", "sk-secret-1")
    assert code == 0, err
    assert "sk-secret-1" not in out + err
    assert out.startswith("LLAMA_API_KEY='<hidden>' ") and "--api-key" not in out
    assert "API key required (from --)" in err
    data = dry_json(capsys, "--model", model, "--", "--api-key", "sk-secret-1")
    assert "sk-secret-1" not in json.dumps(data) and data["api_key_required"]


def test_model_name_is_the_profile_name(capsys, model):
    data = dry_json(capsys, "--profile", "demo", "--model", model)
    assert data["model_name"] == "demo" and data["argv"][data["argv"].index("--alias") + 1] == "demo"
    assert dry_json(capsys, "--model", model)["model_name"] == "target"


def test_run_and_bench_take_the_same_arguments(capsys, model):
    code, _, err = run_cli(capsys, "run", "--model", model, "--cxt", "4096", "hello")
    assert code == 2 and "unknown option --cxt (did you mean --ctx?)" in err
    code, _, err = run_cli(capsys, "bench", "--url", "http://127.0.0.1:9", "--", "--threads", "2")
    assert code == 2 and "--url measures running servers" in err
