"""Bad input through the real CLI: a non-zero exit and one line naming the problem.

Each case runs `bonsai` in-process (the console-script entry point, error handler included)
so the suite stays fast; test_scripts.py and test_start_server.py run the installed command.
"""

from __future__ import annotations

import pytest

import tiny_gguf
from cli_runner import run_cli


def bonsai(argv, capsys):
    return run_cli(capsys, *argv)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    files = {
        "target": tiny_gguf.write_target(d / "T.gguf"),
        "drafter": tiny_gguf.write_dspark_drafter(d / "D.gguf", block_size=4),
        "wide": tiny_gguf.write_dspark_drafter(d / "wide.gguf", target_embedding=128),
        "othervocab": tiny_gguf.write_dspark_drafter(d / "othervocab.gguf", vocab=640),
        "noblock": tiny_gguf.write_dspark_drafter(d / "noblock.gguf", omit_block_size=True),
        "legacy": tiny_gguf.write_dspark_drafter(d / "legacy.gguf", legacy=True),
        "notgguf": tiny_gguf.write_not_gguf(d / "page.gguf"),
    }
    trunc = d / "trunc.gguf"
    trunc.write_bytes(files["target"].read_bytes())
    files["truncated"] = tiny_gguf.truncate(trunc, trunc.stat().st_size // 2)
    return {k: str(v) for k, v in files.items()}


def dry(ggufs, *extra, drafter="drafter"):
    args = ["start", "--profile", "ternary-27b", "--model", ggufs["target"], "--dry-run"]
    if drafter:
        args += ["--drafter", ggufs[drafter]]
    return args + list(extra)


# (case id, environment, argv builder, text the one-line error must contain)
CASES = [
    ("bool-word", {"BONSAI_SPECULATIVE": "maybe"}, lambda g: dry(g), "BONSAI_SPECULATIVE='maybe' is not a boolean"),
    ("bool-number", {"BONSAI_KV4": "2"}, lambda g: dry(g), "BONSAI_KV4='2' is not a boolean"),
    ("remote-bool", {"BONSAI_ALLOW_REMOTE": "sure"}, lambda g: dry(g), "BONSAI_ALLOW_REMOTE='sure'"),
    ("ctx-text", {"BONSAI_CTX": "abc"}, lambda g: dry(g), "BONSAI_CTX='abc' is not a whole number"),
    ("ctx-negative", {"BONSAI_CTX": "-5"}, lambda g: dry(g), "BONSAI_CTX='-5' is too small"),
    ("ctx-huge", {"BONSAI_CTX": "99999999999"}, lambda g: dry(g), "BONSAI_CTX='99999999999' is too large"),
    ("ctx-float", {"BONSAI_CTX": "8192.5"}, lambda g: dry(g), "BONSAI_CTX='8192.5' is not a whole number"),
    ("ngl-negative", {"BONSAI_NGL": "-1"}, lambda g: dry(g), "BONSAI_NGL='-1' is too small"),
    ("port-zero", {"BONSAI_PORT": "0"}, lambda g: dry(g), "BONSAI_PORT='0' is too small"),
    ("port-text", {"BONSAI_PORT": "http"}, lambda g: dry(g), "BONSAI_PORT='http'"),
    ("port-flag", {}, lambda g: dry(g, "--port", "70000"), "--port=70000 is too large"),
    ("nmax-zero", {"BONSAI_SPEC_NMAX": "0"}, lambda g: dry(g), "BONSAI_SPEC_NMAX='0' is too small"),
    ("image-tokens", {"BONSAI_IMAGE_MAX_TOKENS": "none"}, lambda g: dry(g), "BONSAI_IMAGE_MAX_TOKENS='none'"),
    ("family", {"BONSAI_FAMILY": "quaternary"}, lambda g: dry(g), "BONSAI_FAMILY='quaternary' is not a known value"),
    ("size", {"BONSAI_MODEL": "70B"}, lambda g: ["config"], "BONSAI_MODEL='70B' is not a known value"),
    ("layout", {"BONSAI_LAYOUT": "weird"}, lambda g: ["config"], "BONSAI_LAYOUT='weird'"),
    ("spec-type", {"BONSAI_SPEC_TYPE": "turbo"}, lambda g: dry(g), "BONSAI_SPEC_TYPE='turbo' is not a known value"),
    (
        "profile-flag",
        {},
        lambda g: ["start", "--profile", "nope", "--dry-run"],
        "--profile='nope' is not a known profile",
    ),
    ("profile-env", {"BONSAI_PROFILE": "nope"}, lambda g: ["config"], "BONSAI_PROFILE='nope' is not a known profile"),
    (
        "profiles-dir",
        {"BONSAI_PROFILES_DIR": "/no/such/dir"},
        lambda g: ["models"],
        "BONSAI_PROFILES_DIR='/no/such/dir' is not a folder",
    ),
    (
        "nmax-mismatch",
        {"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_NMAX": "6"},
        lambda g: dry(g),
        "BONSAI_SPEC_NMAX=6 differs from the drafter's block size 4",
    ),
    ("truncated-model", {}, lambda g: dry(g)[:4] + [g["truncated"], "--dry-run"], "trunc.gguf is truncated"),
    ("not-gguf", {}, lambda g: ["inspect", g["notgguf"]], "page.gguf is not a GGUF file"),
    (
        "missing-model",
        {},
        lambda g: ["start", "--model", "/no/such/model.gguf", "--dry-run"],
        "model file /no/such/model.gguf is not present",
    ),
    (
        "wrong-embedding",
        {"BONSAI_SPECULATIVE": "1"},
        lambda g: dry(g, drafter="wide"),
        "wide.gguf has embedding size 128 but T.gguf has 64",
    ),
    ("vocab-mismatch", {"BONSAI_SPECULATIVE": "1"}, lambda g: dry(g, drafter="othervocab"), "not the same vocabulary"),
    ("no-block-size", {"BONSAI_SPECULATIVE": "1"}, lambda g: dry(g, drafter="noblock"), "has no block size"),
    ("legacy-drafter", {"BONSAI_SPECULATIVE": "1"}, lambda g: dry(g, drafter="legacy"), "legacy 'dspark' drafter"),
    ("pair-check", {}, lambda g: ["inspect", g["wide"], "--target", g["target"]], "wide.gguf does not fit"),
    ("remote-host", {"BONSAI_HOST": "0.0.0.0"}, lambda g: dry(g), "BONSAI_HOST='0.0.0.0' is not a loopback address"),
    (
        "no-drafter-no-ngram",
        {"BONSAI_SPECULATIVE": "1"},
        lambda g: ["start", "--profile", "bonsai-8b", "--model", g["target"], "--dry-run"],
        "has no usable drafter and no draft-free mode",
    ),
    ("format", {}, lambda g: dry(g, "--format", "cmd"), "--format='cmd' is not known"),
    ("small-ubatch", {"BONSAI_SPECULATIVE": "1"}, lambda g: dry(g, "--", "-ub", "2"), "-ub 2 is smaller"),
]


@pytest.mark.parametrize("case,env,argv,expected", CASES, ids=[c[0] for c in CASES])
@pytest.mark.slow
def test_bad_input_exits_nonzero_with_one_line(case, env, argv, expected, ggufs, monkeypatch, capsys):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, out, err = bonsai(argv(ggufs), capsys)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in err + out


def test_at_least_twenty_distinct_bad_inputs():
    assert len({c[0] for c in CASES}) >= 20


def test_user_errors_exit_with_code_2(ggufs, monkeypatch, capsys):
    monkeypatch.setenv("BONSAI_CTX", "abc")
    assert bonsai(dry(ggufs), capsys)[0] == 2


def test_good_dry_run_prints_the_reference_flags(ggufs, monkeypatch, capsys):
    monkeypatch.setenv("BONSAI_SPECULATIVE", "1")
    code, out, err = bonsai(dry(ggufs), capsys)
    assert code == 0, err
    for piece in (
        "--spec-type draft-dspark",
        "--spec-draft-n-max 4",
        "-np 1",
        "-ngld 0",
        f"-md {ggufs['drafter']}",
        "-fa on",
        "--temp 0.7",
        "--top-p 0.95",
        "--top-k 20",
        "--jinja",
    ):
        assert piece in out, piece
    ctx = int(out.split(" -c ")[1].split()[0])
    assert ctx >= 16384, "speculation needs at least 16384 tokens of context"


def test_dry_run_json_has_argv_and_reasons(ggufs, monkeypatch, capsys):
    import json

    monkeypatch.setenv("BONSAI_SPECULATIVE", "true")
    code, out, _ = bonsai(dry(ggufs, "--json"), capsys)
    data = json.loads(out)
    assert code == 0 and isinstance(data["argv"], list)
    reasons = {r["flag"]: r["why"] for r in data["reasons"]}
    assert "block size" in reasons["--spec-draft-n-max"]
    assert data["speculative"]["n_max"] == 4


def test_dry_run_powershell(ggufs, capsys):
    code, out, _ = bonsai(dry(ggufs, "--format", "powershell"), capsys)
    assert code == 0 and out.startswith("& ")
