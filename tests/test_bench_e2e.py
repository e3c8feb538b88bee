"""`bonsai bench` against the real llama-server on the tiny GGUF pair: launch mode, URL mode
and the CLI. A constant target with a constant DSpark drafter accepts every draft, so the
speculative path is live and its output must equal the plain run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_gguf as tg
from bonsai_launch.bench.data import BenchOptions
from bonsai_launch.bench.pipeline import Target, run_bench
from bonsai_launch.bench.schema import validate

pytestmark = pytest.mark.server

# One thread: on a busy shared machine ggml's spinning worker threads slow a tiny model tenfold
# when they outnumber the free cores (seen here: 30 s instead of 4 s for the launch test).
THREADS = ("-t", "1")
SMALL = dict(
    categories=("code", "code-edit"),
    per_category=1,
    temps=(0.0,),
    repeats=3,
    max_tokens=16,
    concurrency=(1, 2),
    turns=2,
    conversations=1,
    tradeoff_tokens=8,
)


@pytest.fixture
def tiny_pair(tmp_path) -> tuple[Path, Path]:
    return (
        tg.write_target(tmp_path / "target.gguf", constant_token=7),
        tg.write_dspark_drafter(tmp_path / "drafter.gguf", constant_token=7),
    )


def _result(doc, config, category="all", temp=0.0):
    return next(
        r for r in doc["results"] if r["config"] == config and r["category"] == category and r["temperature"] == temp
    )


@pytest.mark.slow
def test_launch_mode_measures_plain_against_the_dspark_drafter(llama_server, tiny_pair, tmp_path):
    target, drafter = tiny_pair
    options = BenchOptions(configs=("plain", "speculative"), **SMALL)
    doc, paths = run_bench(
        options,
        Target(model=str(target), drafter=str(drafter), binary=llama_server, passthrough=THREADS),
        tmp_path / "out",
        chart=False,
    )

    assert validate(doc) == []
    assert set(paths) == {"json", "markdown"}
    assert json.loads(Path(paths["json"]).read_text())["schema"] == "bonsai-bench/1"
    spec = next(c for c in doc["configs"] if c["name"] == "speculative")
    assert spec["spec_type"] == "draft-dspark" and "-md" in spec["argv"]
    plain = next(c for c in doc["configs"] if c["name"] == "plain")
    assert "-md" not in plain["argv"]
    # same context on both sides: only the speculative flags differ
    assert plain["ctx"] == spec["ctx"]

    s = _result(doc, "speculative")
    assert s["drafted"] > 0 and s["acceptance_rate"] == 1.0  # the constant pair agrees on every token
    assert s["verify_steps"] > 0 and s["mean_acceptance_length"] > 1
    assert _result(doc, "plain")["drafted"] == 0
    eq = next(c for c in doc["comparisons"] if c["category"] == "all")["output_equality"]
    assert eq["compared"] == 6 and eq["identical"] == 6

    # warm-ups are not measured; every planned request was
    suite = [r for r in doc["requests"] if r["phase"] == "suite"]
    assert len(suite) == 2 * 2 * 3 and not any(r["error"] for r in doc["requests"])
    # a fresh server per group, in alternating order, all stopped afterwards
    order = [(s["config"], s["repeat"]) for s in doc["servers"] if s["purpose"] != "trade-offs"]
    assert order == [
        ("plain", 0),
        ("speculative", 0),
        ("speculative", 1),
        ("plain", 1),
        ("plain", 2),
        ("speculative", 2),
    ]
    assert all(s["peak_rss_bytes"] for s in doc["servers"])
    for s in doc["servers"]:
        with pytest.raises(ProcessLookupError):
            os.kill(s["pid"], 0)

    turns = {(t["config"], t["turn"]) for t in doc["multi_turn"]["turns"]}
    assert turns == {(c, n) for c in ("plain", "speculative") for n in (1, 2)}
    assert {(r["config"], r["level"]) for r in doc["concurrency"]} == {
        (c, n) for c in ("plain", "speculative") for n in (1, 2)
    }
    assert {v["kind"] for v in doc["verdicts"]} <= {"faster", "slower", "noise"}


def test_url_mode_against_running_servers(llama_server, tiny_pair, tmp_path):
    from bonsai_launch.server.process import ServerProcess, free_port

    target, drafter = tiny_pair
    common = [str(llama_server), "-m", str(target), "--host", "127.0.0.1", "-c", "4096", "--metrics", *THREADS]
    servers = []
    try:
        for name, extra in (
            ("plain", []),
            ("spec", ["-md", str(drafter), "--spec-type", "draft-dspark", "--spec-draft-n-max", "4", "-np", "1"]),
        ):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = ServerProcess.spawn(
                common + ["--port", str(port)] + extra, env=None, log_path=tmp_path / f"{name}.log", base_url=url
            )
            servers.append(proc)
            proc.wait_ready(60)
        options = BenchOptions(**{**SMALL, "repeats": 3, "concurrency": (2,)})
        doc, _ = run_bench(
            options,
            Target(url=servers[1].base_url + "/v1", baseline_url=servers[0].base_url),
            tmp_path / "out",
            chart=False,
        )
    finally:
        for proc in servers:
            proc.stop()

    assert validate(doc) == []
    assert doc["mode"] == "url" and doc["baseline"] == "baseline"
    s = _result(doc, "server")
    # drafted/accepted from timings, verify steps from the /metrics counters
    assert s["drafted"] > 0 and s["verify_steps"] > 0 and s["mean_acceptance_length"] > 1
    assert _result(doc, "baseline")["drafted"] == 0
    assert any("URL mode" in n for n in doc["notes"])
    # every repeat tags its prompts, so no repeat hits the previous one's prompt cache
    assert not any(r["error"] for r in doc["requests"])


def test_cli_quick_run_writes_reports_and_prints_json(llama_server, tiny_pair, tmp_path):
    target, drafter = tiny_pair
    env = dict(os.environ, BONSAI_LLAMA_SERVER=str(llama_server))
    out = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bonsai_launch",
            "bench",
            "--model",
            str(target),
            "--drafter",
            str(drafter),
            "--categories",
            "code-edit",
            "--quick",
            "--max-tokens",
            "8",
            "--repeats",
            "1",
            "--no-tradeoffs",
            "--no-chart",
            "--out",
            str(out),
            "--json",
            "--",
            *THREADS,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["options"]["quick"] is True and doc["options"]["max_tokens"] == 8
    assert doc["options"]["per_category"] == 2 and doc["options"]["temps"] == [0.0]  # --quick's subset
    assert {v["kind"] for v in doc["verdicts"]} == {"inconclusive"}  # one repeat proves nothing
    assert (out / "bench.json").is_file() and (out / "bench.md").is_file()
    assert validate(doc) == []


def test_cli_refuses_unknown_configuration(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "bench", "--configs", "plain,turbo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: --configs: 'turbo' is not a known configuration")
    assert "Traceback" not in done.stderr
