"""The reference launcher's newer settings and Bonsai 2, through the real CLI (in-process).

BONSAI_GGUF, BONSAI_MMPROJ (and --mmproj), BONSAI_LLAMA_BIN, PORT, BONSAI_REASONING_EFFORT,
BONSAI_FAMILY=bonsai2, and the bug where --model dropped an explicit family/size's sampling.
Every bad value exits non-zero with one line naming the setting and the value.
"""

from __future__ import annotations

import json

import pytest

import tiny_gguf
from cli_runner import run_cli


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    target = tiny_gguf.write_target(d / "T.gguf")
    drafter = tiny_gguf.write_dspark_drafter(d / "D.gguf", block_size=4)
    legacy = d / "Ternary-Bonsai-27B-Q2_0.gguf"
    legacy.write_bytes(target.read_bytes())
    empty = d / "empty-bin"
    empty.mkdir()
    return {"target": str(target), "drafter": str(drafter), "legacy": str(legacy), "empty": str(empty), "dir": str(d)}


def dry(*argv: str) -> list[str]:
    return ["start", *argv, "--dry-run", "--json"]


# (case id, environment, argv (given the files), text the one-line error must contain)
BAD = [
    (
        "gguf-missing",
        {"BONSAI_GGUF": "/no/such/model.gguf"},
        lambda f: dry(),
        "BONSAI_GGUF='/no/such/model.gguf' is not a file",
    ),
    ("gguf-legacy", {"BONSAI_GGUF": "{legacy}"}, lambda f: dry(), "legacy group-128 Q2_0"),
    ("model-legacy", {}, lambda f: dry("--model", f["legacy"]), "only old prism-v5 fork releases load it"),
    (
        "mmproj-missing",
        {"BONSAI_MMPROJ": "/no/such/mm.gguf"},
        lambda f: dry("--model", f["target"]),
        "BONSAI_MMPROJ='/no/such/mm.gguf' is not a file",
    ),
    (
        "mmproj-flag-missing",
        {},
        lambda f: dry("--model", f["target"], "--mmproj", "/no/mm.gguf"),
        "--mmproj='/no/mm.gguf' is not a file",
    ),
    (
        "mmproj-vision-off",
        {"BONSAI_MMPROJ": "{target}", "BONSAI_VISION": "0"},
        lambda f: dry("--model", f["target"]),
        "BONSAI_MMPROJ is set but BONSAI_VISION is off",
    ),
    (
        "llama-bin-missing",
        {"BONSAI_LLAMA_BIN": "/no/such/bin"},
        lambda f: dry("--model", f["target"]),
        "BONSAI_LLAMA_BIN='/no/such/bin' is not a folder",
    ),
    (
        "llama-bin-empty",
        {"BONSAI_LLAMA_BIN": "{empty}"},
        lambda f: dry("--model", f["target"]),
        "holds no llama-server",
    ),
    (
        "llama-bin-and-server",
        {"BONSAI_LLAMA_BIN": "{empty}", "BONSAI_LLAMA_SERVER": "{target}"},
        lambda f: dry("--model", f["target"]),
        "are both set",
    ),
    ("port-text", {"PORT": "http"}, lambda f: dry("--model", f["target"]), "PORT='http' is not a whole number"),
    ("port-zero", {"PORT": "0"}, lambda f: dry("--model", f["target"]), "PORT='0' is too small"),
    ("port-huge", {"PORT": "70000"}, lambda f: dry("--model", f["target"]), "PORT='70000' is too large"),
    (
        "effort-low",
        {"BONSAI_REASONING_EFFORT": "low", "BONSAI_FAMILY": "bonsai2"},
        lambda f: dry("--model", f["target"]),
        (
            "BONSAI_REASONING_EFFORT='low' is refused (Bonsai 2's chat template thinks about as long as at xhigh "
            "with low; medium is the fastest); allowed: one of medium, xhigh"
        ),
    ),
    (
        "effort-high",
        {"BONSAI_REASONING_EFFORT": "high", "BONSAI_FAMILY": "bonsai2", "BONSAI_MODEL": "9B"},
        lambda f: dry("--model", f["target"]),
        (
            "BONSAI_REASONING_EFFORT='high' is refused (Bonsai 2's chat template answers reasoning_effort \"high\" "
            "with HTTP 500; medium is the fastest that works); allowed: one of medium, xhigh"
        ),
    ),
    (
        "effort-unknown",
        {"BONSAI_REASONING_EFFORT": "max"},
        lambda f: dry("--model", f["target"]),
        "BONSAI_REASONING_EFFORT='max' is not a known value; allowed: one of medium, xhigh",
    ),
    (
        "effort-wrong-profile",
        {"BONSAI_REASONING_EFFORT": "medium"},
        lambda f: dry("--profile", "ternary-8b", "--model", f["target"]),
        "profile ternary-8b's chat template takes no reasoning effort",
    ),
    (
        "bonsai2-size",
        {"BONSAI_FAMILY": "bonsai2", "BONSAI_MODEL": "8B"},
        lambda f: dry("--model", f["target"]),
        (
            "BONSAI_FAMILY=bonsai2 comes only in 27B, 9B, 4B, 2B; BONSAI_MODEL=8B is not one of them "
            "(set BONSAI_MODEL to 27B or 9B or 4B or 2B, or use BONSAI_FAMILY=ternary"
        ),
    ),
    (
        "bonsai2.5-size",
        {"BONSAI_FAMILY": "bonsai2.5", "BONSAI_MODEL": "9B"},
        lambda f: dry("--model", f["target"]),
        (
            "BONSAI_FAMILY=bonsai2.5 comes only in 27B; BONSAI_MODEL=9B is not one of them (set BONSAI_MODEL to 27B, "
            "or use BONSAI_FAMILY=bonsai2 for 9B"
        ),
    ),
    (
        "bonsai2-fork-not-pulled",
        {"BONSAI_LAYOUT": "fork"},
        lambda f: dry("--profile", "bonsai2-27b"),
        "Ternary-Bonsai-2-27B-PQ2_0.gguf is not present",
    ),
    (
        "family-typo",
        {"BONSAI_FAMILY": "bonsai3"},
        lambda f: dry("--model", f["target"]),
        "BONSAI_FAMILY='bonsai3' is not a known value",
    ),
]


@pytest.mark.parametrize("case,env,argv,expected", BAD, ids=[c[0] for c in BAD])
def test_bad_values_exit_nonzero_with_one_line(case, env, argv, expected, files, monkeypatch, capsys):
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**files))
    code, out, err = run_cli(capsys, *argv(files))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert out == ""


def plan(capsys, *argv: str) -> dict:
    code, out, err = run_cli(capsys, *dry(*argv))
    assert code == 0, err
    return json.loads(out)


def sampling(argv: list[str]) -> list[str]:
    i = argv.index("--temp") if "--temp" in argv else len(argv)
    return argv[i : i + 8]


def test_family_and_size_keep_their_sampling_with_model(files, monkeypatch, capsys):
    by_profile = plan(capsys, "--profile", "ternary-8b", "--model", files["target"])
    monkeypatch.setenv("BONSAI_FAMILY", "ternary")
    monkeypatch.setenv("BONSAI_MODEL", "8B")
    by_family = plan(capsys, "--model", files["target"])
    assert by_family["argv"][1:] == by_profile["argv"][1:] and by_family["profile"] == "ternary-8b"
    assert sampling(by_family["argv"]) == ["--temp", "0.5", "--top-p", "0.85", "--top-k", "20", "--min-p", "0"]
    monkeypatch.delenv("BONSAI_FAMILY")
    monkeypatch.delenv("BONSAI_MODEL")
    plain = plan(capsys, "--model", files["target"])  # nothing named the model: none of the default's settings
    assert "--temp" not in plain["argv"] and plain["profile"] is None and plain["mmproj"] is None


def test_bonsai2_family_with_model_shows_the_bonsai2_sampling(files, monkeypatch, capsys):
    monkeypatch.setenv("BONSAI_FAMILY", "bonsai2")
    data = plan(capsys, "--model", files["target"])
    assert data["profile"] == "bonsai2-27b"
    assert sampling(data["argv"]) == ["--temp", "1.0", "--top-p", "0.95", "--top-k", "20", "--min-p", "0.05"]
    assert "--jinja" in data["argv"] and "-fa" in data["argv"]
    # our own build runs Bonsai 2 (patch 0010): no fork build is needed or asked for
    assert not any("bonsai build --source prismml" in w for w in data["warnings"])
    assert data["build"]["flavour"] == "mainline"


def test_bonsai2_speculation_is_draft_free_and_warns_about_community_drafters(files, monkeypatch, capsys):
    monkeypatch.setenv("BONSAI_FAMILY", "bonsai2")
    monkeypatch.setenv("BONSAI_SPECULATIVE", "1")
    data = plan(capsys, "--model", files["target"])
    assert data["speculative"]["type"] == "ngram-mod" and data["speculative"]["drafter"] is None
    assert not any("2%" in w for w in data["warnings"])
    with_drafter = plan(capsys, "--model", files["target"], "--drafter", files["drafter"])
    assert with_drafter["speculative"]["type"] == "draft-dspark"
    assert any("PR #210" in w and "2%" in w for w in with_drafter["warnings"])


def test_reasoning_effort_goes_through_the_chat_template(files, monkeypatch, capsys):
    monkeypatch.setenv("BONSAI_FAMILY", "bonsai2")
    monkeypatch.setenv("BONSAI_REASONING_EFFORT", "Medium")
    argv = plan(capsys, "--model", files["target"])["argv"]
    i = argv.index("--chat-template-kwargs")
    assert json.loads(argv[i + 1]) == {"reasoning_effort": "medium"}
    monkeypatch.delenv("BONSAI_REASONING_EFFORT")
    assert "--chat-template-kwargs" not in plan(capsys, "--model", files["target"])["argv"]


def test_port_is_read_and_bonsai_port_wins(files, monkeypatch, capsys):
    monkeypatch.setenv("PORT", "9091")
    assert plan(capsys, "--model", files["target"])["port"] == 9091
    monkeypatch.setenv("BONSAI_PORT", "9092")
    assert plan(capsys, "--model", files["target"])["port"] == 9092
    assert plan(capsys, "--model", files["target"], "--port", "9093")["port"] == 9093


def test_gguf_and_mmproj_like_model_and_mmproj(files, monkeypatch, capsys, tmp_path):
    other = tiny_gguf.write_target(tmp_path / "other.gguf")
    monkeypatch.setenv("BONSAI_GGUF", files["target"])
    monkeypatch.setenv("BONSAI_MMPROJ", str(other))
    data = plan(capsys)
    assert data["model"] == files["target"] and data["profile"] is None
    assert data["argv"][data["argv"].index("--mmproj") + 1] == str(other)
    assert data["model"] != str(other)
    flagged = plan(capsys, "--model", str(other), "--mmproj", files["target"])  # flags win over the variables
    assert flagged["model"] == str(other) and flagged["mmproj"] == files["target"]


def test_llama_bin_is_probed_like_our_builds(files, monkeypatch, capsys, tmp_path, llama_server):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "llama-server").symlink_to(llama_server)
    monkeypatch.setenv("BONSAI_LLAMA_BIN", str(folder))
    data = plan(capsys, "--model", files["target"])
    assert data["argv"][0] == str(folder / "llama-server")
    assert not any("capabilities not checked" in w for w in data["warnings"])  # it was probed
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    (impostor / "llama-server").symlink_to("/bin/true")  # runs, but is no llama-server
    monkeypatch.setenv("BONSAI_LLAMA_BIN", str(impostor))
    code, _out, err = run_cli(capsys, *dry("--model", files["target"]))
    assert code == 2 and "--help lists no options: it does not look like llama-server" in err


def test_models_lists_bonsai2_with_the_build_each_file_needs(capsys, monkeypatch):
    code, out, _err = run_cli(capsys, "models", "--json")
    entry = next(e for e in json.loads(out) if e["profile"] == "bonsai2-27b")
    assert [(f["name"], f["builds"]) for f in entry["files"]] == [
        ("Ternary-Bonsai-2-27B-PQ2_0.gguf", "bonsai's build (fold: patch 0010, served as Q2_0) or fork ≥ b10743"),
        ("Ternary-Bonsai-2-27B-PTQ1_0.gguf", "bonsai's build (fold: patch 0010, served as Q2_0) or fork ≥ b10743"),
        ("Ternary-Bonsai-2-27B-mmproj-Q8_0.gguf", "any build"),
    ]
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _err = run_cli(capsys, "models")
    assert code == 0 and "bonsai2-27b" in out and "legacy: refused" in out


def test_explicit_settings_that_lose_are_said(files, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("BONSAI_FAMILY", "bonsai2")
    monkeypatch.setenv("BONSAI_MODEL", "27B")
    data = plan(capsys, "--profile", "ternary-8b", "--model", files["target"])
    assert data["profile"] == "ternary-8b"
    assert any("BONSAI_FAMILY=bonsai2 is ignored: profile ternary-8b" in w for w in data["warnings"])
    assert any("BONSAI_MODEL=27B is ignored" in w for w in data["warnings"])
    monkeypatch.delenv("BONSAI_FAMILY")
    monkeypatch.delenv("BONSAI_MODEL")
    other = tiny_gguf.write_target(tmp_path / "other.gguf")
    monkeypatch.setenv("BONSAI_GGUF", str(other))
    data = plan(capsys, "--model", files["target"])
    assert data["model"] == files["target"] and any("BONSAI_GGUF=" in w and "is ignored" in w for w in data["warnings"])


def test_pull_bonsai2_fetches_pq2_and_the_q8_projector_only(hub, tmp_path, capsys):
    """Through the real huggingface_hub client against the fake hub: the fork files by manifest,
    never the PTQ1_0 alternative, the BF16 projector or the F16 weights."""
    from bonsai_launch.models import store as model_store

    target = tiny_gguf.write_target(tmp_path / "b2.gguf").read_bytes()
    repo = hub.add_repo("prism-ml/Ternary-Bonsai-2-27B-gguf")
    from fake_hub import _write_mmproj

    mmproj = _write_mmproj(tmp_path / "mm.gguf").read_bytes()
    for name, data in (
        ("Ternary-Bonsai-2-27B-PQ2_0.gguf", target),
        ("Ternary-Bonsai-2-27B-PTQ1_0.gguf", target + b"\0" * 16),
        ("Ternary-Bonsai-2-27B-mmproj-Q8_0.gguf", mmproj),
        ("Ternary-Bonsai-2-27B-mmproj-BF16.gguf", mmproj + b"\0" * 8),
        ("Ternary-Bonsai-2-27B-F16.gguf", target + b"\0" * 64),
    ):
        repo.add(name, data)
    code, out, err = run_cli(capsys, "pull", "--family", "bonsai2", "--json")
    assert code == 0, err
    assert [f["name"] for f in json.loads(out)["files"]] == [
        "Ternary-Bonsai-2-27B-PQ2_0.gguf",
        "Ternary-Bonsai-2-27B-mmproj-Q8_0.gguf",
    ]
    assert sorted(p.name for p in model_store.folder("bonsai2-27b").glob("*.gguf")) == [
        "Ternary-Bonsai-2-27B-PQ2_0.gguf",
        "Ternary-Bonsai-2-27B-mmproj-Q8_0.gguf",
    ]
