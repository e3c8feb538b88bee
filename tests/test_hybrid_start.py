"""`bonsai start` on a hybrid (qwen35) target with an MTP layer, as the community runs Bonsai 2.

BONSAI_SPECULATIVE=1 on a file carrying a usable MTP layer and no drafter runs draft-mtp at
n-max 1 and proves it live; an MTP-only file works as --drafter; files draft-mtp cannot run
are refused in one line before llama-server starts (it would exit, or abort); a DSpark drafter
tapping the MTP block (which the trunk never runs) is refused before spawning."""

from __future__ import annotations

import pytest

import tiny_gguf
from bonsai_launch.models import tiny_hybrid
from bonsai_launch.server import instances
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, bonsai_env, json_out, stop_all

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    return {
        "mtp": tiny_hybrid.write_hybrid_target(d / "hybrid-mtp.gguf", mtp=True, weight_type="q8_0"),
        "plain": tiny_hybrid.write_hybrid_target(d / "hybrid.gguf", weight_type="q8_0"),
        "mtp_only": tiny_hybrid.write_hybrid_target(d / "hybrid-MTP-only.gguf", mtp_only=True, weight_type="q8_0"),
        "two": tiny_hybrid.write_hybrid_target(d / "hybrid-two-mtp.gguf", mtp=True, nextn=2),
        "tap_mtp": tiny_gguf.write_dspark_drafter(d / "tap-mtp.gguf", target_layers=(1, 4)),
    }


def start(server, *args: str, **env: str):
    return bonsai(
        ["start", *args, "--port", free_port(), "--ctx", "2048", "--detach"],
        env=bonsai_env(server, BONSAI_SPECULATIVE="1", **env),
    )


def test_speculative_on_a_model_with_an_mtp_layer_runs_draft_mtp_n_max_1(llama_server, files):
    done = start(llama_server, "--model", files["mtp"])
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout + done.stderr
    assert "speculative decoding: live (draft-mtp, n-max 1, acceptance 100.0%" in out, out


@pytest.mark.parametrize("n_max", [2, 3])
@pytest.mark.slow
def test_draft_mtp_n_max_is_a_setting_and_the_proof_names_it(llama_server, files, n_max):
    data = json_out(start(llama_server, "--model", files["mtp"], "--json", BONSAI_SPEC_NMAX=str(n_max)))
    spec = data["speculative"]
    assert spec["type"] == "draft-mtp" and spec["n_max"] == n_max and spec["live"] and spec["drafted"] > 0
    argv = data["plan"]["argv"]
    assert argv[argv.index("--spec-draft-n-max") + 1] == str(n_max) and "-md" not in argv


def test_two_slots_draft_with_mtp_on_each(llama_server, files):
    data = json_out(start(llama_server, "--model", files["mtp"], "--parallel", "2", "--json"))
    proof = data["speculative_slots"]
    assert proof["live"] and sorted(proof["drafting_slots"]) == [0, 1], proof


def test_mtp_only_file_as_the_drafter(llama_server, files):
    data = json_out(
        start(
            llama_server,
            "--model",
            files["plain"],
            "--drafter",
            files["mtp_only"],
            "--json",
            BONSAI_SPEC_TYPE="draft-mtp",
        )
    )
    spec = data["speculative"]
    assert spec["type"] == "draft-mtp" and spec["live"] and spec["drafted"] > 0
    argv = data["plan"]["argv"]
    assert argv[argv.index("-md") + 1] == str(files["mtp_only"])


@pytest.mark.parametrize(
    "model,expected",
    [
        ("plain", "hybrid.gguf has no MTP layers (qwen35.nextn_predict_layers is absent)"),
        ("two", "hybrid-two-mtp.gguf declares 2 MTP layers; llama-server's draft-mtp runs exactly one on qwen35"),
    ],
)
def test_draft_mtp_on_a_file_it_cannot_run_is_refused_in_one_line(llama_server, files, model, expected):
    done = start(llama_server, "--model", files[model], BONSAI_SPEC_TYPE="draft-mtp")
    assert done.returncode == 2, done.stderr  # bad input
    assert expected in done.stderr and instances.running() == []


def test_drafter_tapping_the_mtp_block_is_refused_before_spawning(llama_server, files):
    done = start(llama_server, "--model", files["mtp"], "--drafter", files["tap_mtp"])
    assert done.returncode == 2 and instances.running() == []
    assert "reads target layers [4] but hybrid-mtp.gguf has 4 layers (and 1 MTP layer it does not run)" in done.stderr
