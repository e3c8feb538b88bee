"""`bonsai tune` and BONSAI_SPECULATIVE=auto against the real llama-server, on small pairs.

The tuned target is a constant-token model (always predicts 7) whose feed-forward weights
(200 MB of f32) do not fit in the CPU's caches: a decode step is bound by reading them, and
verifying a block of drafted tokens reads them once, as one token does. Its 1-layer drafter
costs little. So a drafter that agrees (constant 7, every draft accepted) makes decoding
about twice as fast (measured here: 2.0-2.5x under a load average of 6 on 2 cores), and one
that always disagrees (constant 9, nothing accepted) makes it slower. Tuning must choose the
first and never the second. The start/bench tests use the tiny 2-layer pair: they check the
plumbing, not a speed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tiny_gguf as tg
from bonsai_launch.decisions import store
from bonsai_launch.tune.session import TuneOptions, run_tune
from bonsai_launch.tune.subject import TuneRequest
from start_helpers import bonsai, bonsai_env, json_out, no_server_left, stop_all

pytestmark = pytest.mark.server

THREADS = ("-t", "1")  # see test_bench_e2e.py: one thread keeps a tiny model steady on a busy machine
# Memory-bound shape: E=256 and FF=8192 over 8 layers (about 200 MB), written in about 2 s.
SHAPE = dict(embedding=256, heads=4, heads_kv=2, head_dim=64)


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tune_pair")
    tg.write_target(folder / "target.gguf", constant_token=7, layers=8, ff=8192, **SHAPE)
    drafter_shape = dict(target_embedding=256, heads=4, heads_kv=2, head_dim=64, ff=256)
    tg.write_dspark_drafter(folder / "agrees.gguf", constant_token=7, **drafter_shape)
    tg.write_dspark_drafter(folder / "disagrees.gguf", constant_token=9, **drafter_shape)
    tg.write_target(folder / "tiny.gguf", constant_token=7)
    tg.write_dspark_drafter(folder / "tiny-disagrees.gguf", constant_token=9)
    return folder


def _tune(llama_server: Path, target: Path, drafter: Path, **options) -> object:
    request = TuneRequest({}, str(target), str(drafter), THREADS, llama_server)
    defaults = dict(configs=("plain", "draft-dspark"), budget_s=300, max_tokens=32)
    return run_tune(request, TuneOptions(**{**defaults, **options}))


def _stopped(doc: dict) -> bool:
    for server in doc["servers"]:
        try:
            os.kill(server["pid"], 0)
            return False
        except ProcessLookupError:
            pass
    return True


@pytest.mark.slow  # a whole tuning session
def test_a_drafter_that_loses_is_not_chosen(llama_server, pair_dir):
    outcome = _tune(llama_server, pair_dir / "target.gguf", pair_dir / "disagrees.gguf")
    choice = outcome.decision.choice
    assert not choice.speculative and choice.config == "plain"
    row = next(r for r in outcome.decision.table if r["config"] == "draft-dspark")
    assert row["acceptance_rate"] == 0.0  # it drafted, and the target rejected every draft
    assert row["status"] in ("slower", "screened out after one run", "no gain beyond noise")
    assert _stopped(outcome.doc)
    # stored under this machine, build, model and drafter; the report is on disk
    found = store.lookup(outcome.decision.key)
    assert found.status == "found" and found.decision.choice.config == "plain"
    assert Path(outcome.paths["json"]).is_file() and Path(outcome.paths["chart"]).is_file()
    assert outcome.decision.evidence["runs"]["plain"] >= 1


@pytest.mark.slow  # a whole tuning session
def test_a_constant_drafter_that_wins_is_chosen(llama_server, pair_dir):
    # The gain is several-fold, but the noise rule also needs every one of three paired runs to
    # agree; on a machine shared with other builds one run can be descheduled. Up to three tunings.
    outcomes = []
    for _attempt in range(3):
        outcome = _tune(llama_server, pair_dir / "target.gguf", pair_dir / "agrees.gguf")
        outcomes.append(outcome)
        if outcome.decision.choice.speculative:
            break
    choice = outcomes[-1].decision.choice
    tables = [[(r["config"], r["ratio"], r["status"]) for r in o.decision.table] for o in outcomes]
    assert choice.speculative and choice.spec_type == "draft-dspark", tables
    assert choice.n_max == 4 and choice.ratio > 1 + choice.band  # beyond the noise band
    row = next(r for r in outcomes[-1].decision.table if r["config"] == "draft-dspark")
    assert row["acceptance_rate"] == 1.0 and row["runs"] == 3
    assert _stopped(outcomes[-1].doc)


@pytest.mark.slow
def test_start_auto_tunes_first_then_uses_the_decision(llama_server, pair_dir, tmp_path):
    env = bonsai_env(llama_server)
    target, drafter = pair_dir / "tiny.gguf", pair_dir / "tiny-disagrees.gguf"
    common = ["--model", target, "--drafter", drafter, "--speculative", "auto"]
    try:
        # --no-tune: plain at once, saying why
        done = bonsai(["start", *common, "--no-tune", "--detach", "--json", "--", *THREADS], env=env, timeout=300)
        data = json_out(done)
        assert data["plan"]["tuning"]["status"] == "missing" and data["plan"]["speculative"] is None
        assert "no tuning decision" in done.stderr
        assert bonsai(["stop", "--all"], env=env).returncode == 0

        # no decision: start measures first (every candidate), then runs the choice
        done = bonsai(["start", *common, "--detach", "--json", "--", *THREADS], env=env, timeout=600)
        data = json_out(done)
        assert "tuning first" in done.stderr
        tuning = data["plan"]["tuning"]
        assert tuning["status"] == "found" and tuning["table"]
        assert {r["config"] for r in tuning["table"]} >= {"plain", "draft-dspark", "ngram-mod"}
        choice = tuning["choice"]
        drafter_row = next(r for r in tuning["table"] if r["config"] == "draft-dspark")
        assert choice["config"] != "draft-dspark" and drafter_row["status"] != "chosen: faster beyond noise"
        if choice["speculative"]:
            assert data["plan"]["speculative"]["type"] == choice["spec_type"]
            assert data["speculative"]["live"] is True  # the proof ran on the chosen configuration
        else:
            assert data["plan"]["speculative"] is None
        ps = json_out(bonsai(["ps", "--json"], env=env))
        assert ps[0]["tuning"]["id"] == tuning["id"]
        text = bonsai(["ps"], env={**env, "COLUMNS": "200"}).stdout
        assert "AUTO DECISION" in text and f"(decision {tuning['id']})" in text
        assert bonsai(["stop", "--all"], env=env).returncode == 0

        # the decision exists now: no second measurement; the summary shows the decision table
        done = bonsai(["start", *common, "--detach", "--", *THREADS], env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "tuning first" not in done.stderr
        assert f"BONSAI_SPECULATIVE=auto: decision {tuning['id']}" in done.stdout and "draft-dspark" in done.stdout
    finally:
        bonsai(["stop", "--all"], env=env)
        stop_all()
    assert no_server_left(target)


@pytest.mark.slow
def test_bench_save_feeds_the_store_and_bench_runs_auto(llama_server, pair_dir, tmp_path):
    env = bonsai_env(llama_server)
    target, drafter = pair_dir / "tiny.gguf", pair_dir / "tiny-disagrees.gguf"
    done = bonsai(
        [
            "bench",
            "--model",
            target,
            "--drafter",
            drafter,
            "--configs",
            "plain,speculative",
            "--categories",
            "code-edit",
            "--per-category",
            "1",
            "--temps",
            "0",
            "--repeats",
            "3",
            "--max-tokens",
            "32",
            "--no-tradeoffs",
            "--save",
            "--out",
            tmp_path / "b1",
            "--",
            *THREADS,
        ],
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "stored as the tuning decision for BONSAI_SPECULATIVE=auto: plain" in done.stdout
    [saved] = store.load_all()
    assert saved.source == "bench" and saved.evidence["report"].endswith("bench.json")
    assert saved.prompts == "bench suite (code-edit; 1 per category)"

    # --speculative auto: plain against the stored choice
    done = bonsai(
        [
            "bench",
            "--model",
            target,
            "--drafter",
            drafter,
            "--speculative",
            "auto",
            "--categories",
            "code-edit",
            "--per-category",
            "1",
            "--temps",
            "0",
            "--repeats",
            "1",
            "--max-tokens",
            "16",
            "--no-tradeoffs",
            "--json",
            "--out",
            tmp_path / "b2",
            "--",
            *THREADS,
        ],
        env=env,
        timeout=600,
    )
    doc = json.loads(done.stdout)
    assert [c["name"] for c in doc["configs"]] == ["plain", "auto"]
    assert next(c for c in doc["configs"] if c["name"] == "auto")["label"] == "auto (plain)"

    # with --parallel, auto's servers on 2 slots need a decision tuned on 2 slots: the default
    # launch's decision is not theirs, and no server starts to find that out
    done = bonsai(
        ["bench", "--model", target, "--drafter", drafter, "--speculative", "auto", "--parallel", "2", "--", *THREADS],
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert "configuration auto has no tuning decision to run on 2 slots" in done.stderr, done.stderr
    assert "--parallel 2" in done.stderr


@pytest.mark.slow
def test_the_budget_bounds_the_measurement(llama_server, pair_dir):
    # the memory-bound target: a plain run takes a few seconds, so 6 s cannot hold screening
    # and confirmation of every candidate
    request = TuneRequest({}, str(pair_dir / "target.gguf"), str(pair_dir / "disagrees.gguf"), THREADS, llama_server)
    outcome = run_tune(request, TuneOptions(budget_s=6, max_tokens=32))
    per_run = max(s["startup_s"] or 0 for s in outcome.doc["servers"]) + 30  # one run may finish past the limit
    assert outcome.elapsed_s < 6 + per_run
    statuses = [r["status"] for r in outcome.decision.table]
    assert any(s.startswith("not measured: budget (6 s") for s in statuses), statuses
    assert not outcome.decision.choice.speculative  # nothing confirmed in time: plain
    assert _stopped(outcome.doc)


@pytest.mark.slow
def test_tune_cli_prints_json_and_a_table(llama_server, pair_dir):
    env = bonsai_env(llama_server)
    args = [
        "tune",
        "--model",
        pair_dir / "tiny.gguf",
        "--drafter",
        pair_dir / "tiny-disagrees.gguf",
        "--configs",
        "plain,ngram-mod/n16,draft-dspark",
        "--max-tokens",
        "32",
        "--budget",
        "60",
    ]
    data = json_out(bonsai([*args, "--json", "--", *THREADS], env=env, timeout=300))
    decision = data["decision"]
    assert [r["config"] for r in decision["table"]] == ["plain", "ngram-mod/n16", "draft-dspark"]
    assert decision["choice"]["config"] != "draft-dspark"
    assert Path(data["stored"]).is_file() and Path(data["reports"]["markdown"]).is_file()
    assert decision["key"]["drafter_sha256"] and decision["evidence"]["rule"].startswith("speculation is chosen only")
    ngram = next(
        c for c in json.loads(Path(data["reports"]["json"]).read_text())["configs"] if c["name"] == "ngram-mod/n16"
    )
    assert ngram["argv"][ngram["argv"].index("--spec-ngram-mod-n-max") + 1] == "16"

    done = bonsai([*args, "--", *THREADS], env={**env, "COLUMNS": "200"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tuning decision" in done.stdout and "choice:" in done.stdout
    assert f"BONSAI_SPECULATIVE=auto bonsai start --model {pair_dir / 'tiny.gguf'}" in done.stdout

    done = bonsai(["tune", "--model", pair_dir / "tiny.gguf", "--configs", "plain,turbo"], env=env)
    assert done.returncode == 2 and "'turbo' cannot be measured" in done.stderr


@pytest.mark.slow
def test_tune_parallel_measures_with_as_many_clients_and_show_says_so(llama_server, pair_dir, tmp_path):
    """`--parallel 2`: every run sends the prompts through 2 clients at once on 2 slots; the
    decision records the prompts and clients, and `tune --show` prints them without measuring."""
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "category": "mine", "prompt": f"count {i} to {i + 9}"}) + "\n" for i in range(4)
        )
    )
    env = bonsai_env(llama_server)
    model = ["--model", pair_dir / "tiny.gguf", "--drafter", pair_dir / "tiny-disagrees.gguf"]
    args = ["tune", *model, "--parallel", "2", "--prompts", prompts, "--configs", "plain,draft-dspark"]
    data = json_out(
        bonsai([*args, "--max-tokens", "32", "--budget", "60", "--json", "--", *THREADS], env=env, timeout=300)
    )
    decision = data["decision"]
    assert decision["evidence"]["clients"] == 2 and decision["evidence"]["prompts"] == 4
    assert decision["prompts"] == str(prompts) and "--parallel 2" in decision["key"]["conditions"]
    report = json.loads(Path(data["reports"]["json"]).read_text())
    plain_argv = next(c for c in report["configs"] if c["name"] == "plain")["argv"]
    assert plain_argv[plain_argv.index("-np") + 1] == "2"

    shown = bonsai(["tune", *model, "--parallel", "2", "--show", "--", *THREADS], env={**env, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert f"figures for: 4 prompts ({prompts}), 2 clients at once, 32 tokens each" in shown.stdout, shown.stdout


@pytest.mark.slow  # a whole tuning session
def test_draft_free_candidates_are_screened_by_replay_and_finalists_get_full_repeats(llama_server, demo_gguf):
    """Plain's tokens replayed through each n-gram candidate pick who is measured: the best two
    finalists get three paired runs whatever the budget (it grows for them), each category's best
    three as the default budget allows (how far it goes depends on the machine: a finalist left out
    says why it has fewer), the others none; the decision keeps each candidate's replay flags and
    the fitted verify cost for the keeper. The demo model: its text turns back into the tokens it
    generated (a tiny model's does not)."""
    request = TuneRequest({}, str(demo_gguf), None, (), llama_server)
    names = ("plain", "ngram-simple", "ngram-mod", "ngram-simple+ngram-mod", "ngram-cache")
    outcome = run_tune(request, TuneOptions(configs=names, max_tokens=48))  # the budget scales with the machine
    replay = outcome.decision.evidence["replay"]
    assert set(replay["candidates"]) == set(names[1:]), replay
    assert replay["candidates"]["ngram-simple+ngram-mod"]["args"] == ["--spec-type", "ngram-simple,ngram-mod"]
    assert replay["cost"]["step_ms"] > 0 and replay["prompts"] == 6
    runs = outcome.decision.evidence["runs"]
    finalists = [n for n, c in replay["candidates"].items() if c["finalist"]]
    measured = [n for n in finalists if runs.get(n) == 3]
    status = {row["config"]: row["status"] for row in outcome.decision.table}
    left_out = [n for n in finalists if n not in measured]
    assert runs["plain"] == 3 and len(measured) >= min(2, len(finalists)) >= 1, (runs, finalists)
    # left out before its first run, or dropped between confirmation rounds with fewer than three
    why_short = ("ran out; raise --budget", "screened out after one run", "too few runs")
    assert all(runs.get(n, 0) < 3 and any(w in status[n] for w in why_short) for n in left_out), status
    for row in outcome.decision.table:
        if row["config"] in replay["candidates"] and row["config"] not in finalists:
            assert row["runs"] == 0 and row["status"].startswith("not measured: replayed on the plain run's tokens")
    assert outcome.decision.evidence["answer_lengths"] == "48 tokens each"
