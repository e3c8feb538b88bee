"""Speculation on several slots against the real llama-server: the tiny DSpark tiny_pair and the
demo model's ngram-mod with -np 4, four concurrent requests that each draft, and the -ub
refusal before anything is spawned."""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bonsai_launch.core.paths import logs_dir
from bonsai_launch.server import client, instances
from bonsai_launch.server.process import free_port
from bonsai_launch.server.supervisor import PROOF_PROMPT
from start_helpers import bonsai, bonsai_env, gone, json_out, no_server_left, stop_all, with_pair

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def concurrent_completions(url: str, n: int, tokens: int = 16) -> list[dict]:
    """n requests at once, request i pinned to slot i (a tiny model answers so fast that unpinned
    requests could all land, one after the other, on slot 0)."""

    def one(i: int) -> dict:
        return client.completion(url, PROOF_PROMPT, n_predict=tokens, temperature=0.0, cache_prompt=False, id_slot=i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize("pair", ["tiny_pair", "tiny_hybrid_pair"])
@pytest.mark.slow
def test_dspark_pair_drafts_on_four_slots(llama_server, pair, request):
    tiny_pair = request.getfixturevalue(pair)  # the dense pair, and the hybrid (qwen35) one
    data = json_out(
        bonsai(
            [
                "start",
                *with_pair(tiny_pair),
                "--parallel",
                "4",
                "--ctx",
                "4096",
                "--port",
                free_port(),
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    argv = data["plan"]["argv"]
    assert argv[argv.index("-np") + 1] == "4" and argv[argv.index("-ub") + 1] == "512"
    proof = data["speculative_slots"]
    assert proof["live"] and proof["slots"] == 4 and sorted(proof["drafting_slots"]) == [0, 1, 2, 3]
    assert all(s["drafted"] > 0 for s in proof["per_slot"])
    # Four clients at once, as users would send them: every one drafted, on four different slots.
    results = concurrent_completions(data["url"], 4)
    assert all((r.get("timings") or {}).get("draft_n", 0) > 0 for r in results), [r.get("timings") for r in results]
    assert [r["id_slot"] for r in results] == [0, 1, 2, 3]
    log = Path(data["log"]).read_text()
    assert "n_slots = 4" in log and "GGML_ASSERT" not in log


@pytest.mark.slow
def test_ngram_on_a_random_model_is_proven_on_every_slot_by_the_echo_request(llama_server, tiny_pair):
    """A random model does not continue the probe's alphabet, so an n-gram type drafts only on
    the echo request: the several-slots proof sends it too, as the single-request proof does."""
    data = json_out(
        bonsai(
            [
                "start",
                "--model",
                tiny_pair["target"],
                "--speculative",
                "--spec-type",
                "ngram-simple",
                "--parallel",
                "2",
                "--ctx",
                "4096",
                "--port",
                free_port(),
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    proof = data["speculative_slots"]
    assert proof["live"] and sorted(proof["drafting_slots"]) == [0, 1], proof
    assert all(s["drafted"] > 0 and s["error"] is None for s in proof["per_slot"])


def test_run_reports_speculation_on_every_slot(llama_server, tiny_pair):
    done = bonsai(
        [
            "run",
            *with_pair(tiny_pair),
            "--parallel",
            "2",
            "--ctx",
            "4096",
            "-n",
            "8",
            "hello",
        ],
        server=llama_server,
    )
    assert done.returncode == 0, done.stderr
    assert "speculative decoding: live on 2 slots (draft-dspark" in done.stderr
    assert no_server_left(tiny_pair["target"])


def test_ubatch_smaller_than_slots_times_block_is_refused_before_spawning(llama_server, tiny_pair):
    done = bonsai(
        [
            "start",
            *with_pair(tiny_pair),
            "--parallel",
            "4",
            "--ctx",
            "4096",
            "--port",
            free_port(),
            "--",
            "-ub",
            "8",
        ],
        server=llama_server,
    )
    assert done.returncode == 2
    assert "-ub 8 is smaller than speculation needs: 4 slots x (4 draft + 1) = 20" in done.stderr
    assert "raise -ub to at least 20" in done.stderr
    assert not logs_dir().exists() or not any(logs_dir().iterdir()), "llama-server must not have been started"


def test_the_refused_ubatch_really_aborts_llama_server(llama_server, tiny_pair, tmp_path):
    """Why the refusal exists: the same command without bonsai dies on the first batched draft."""
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(llama_server),
                "-m",
                str(tiny_pair["target"]),
                "-md",
                str(tiny_pair["drafter"]),
                "--spec-type",
                "draft-dspark",
                "--spec-draft-n-max",
                "4",
                "-np",
                "4",
                "-c",
                "4096",
                "-ub",
                "8",
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, proc)

        def pinned(slot: int):
            try:
                return client.completion(url, PROOF_PROMPT, n_predict=64, cache_prompt=False, id_slot=slot)
            except Exception as exc:  # the server dies under the request
                return exc

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(pinned, range(4)))
        proc.wait(30)
        assert proc.returncode == -signal.SIGABRT, proc.returncode
        assert "non-causal attention requires n_ubatch >= n_tokens" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "llama-server exited while loading"
        try:
            if client.health(url).ok:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError("llama-server not ready")


@pytest.mark.slow
def test_demo_ngram_mod_is_live_on_four_slots(llama_server, demo_gguf, isolated_home):
    folder = isolated_home / "models" / "demo"
    folder.mkdir(parents=True)
    os.symlink(demo_gguf, folder / demo_gguf.name)
    env = bonsai_env(llama_server, BONSAI_SPECULATIVE="1", BONSAI_PARALLEL="4")
    done = bonsai(
        ["start", "--profile", "demo", "--port", str(free_port()), "--ctx", "16384", "--detach"], env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "speculative decoding: live on 4 slots (ngram-mod" in done.stdout
    (inst,) = instances.running()
    results = concurrent_completions(inst.base_url, 4, tokens=24)
    assert all((r.get("timings") or {}).get("draft_n", 0) > 0 for r in results), [r.get("timings") for r in results]
    assert [r["id_slot"] for r in results] == [0, 1, 2, 3]
    assert bonsai(["stop", "demo"], env=env).returncode == 0
    assert gone(inst.pid)


def test_dry_run_json_gives_the_reasons_for_slots_and_batches(llama_server, tiny_pair):
    data = json_out(
        bonsai(
            [
                "start",
                *with_pair(tiny_pair),
                "--parallel",
                "8",
                "--dry-run",
                "--json",
            ],
            server=llama_server,
        )
    )
    reasons = {r["flag"]: r for r in data["reasons"]}
    # the real binary was probed: its --spec-type takes a list, so one context drafts for every slot
    assert "drafts for every slot in one context" in reasons["-np"]["why"]
    assert reasons["-ub"]["value"] == "512" and "8 slots x (4 draft + 1) = 40" in reasons["-ub"]["why"]
    assert reasons["-c"]["value"] == str(8 * 16384)
    assert data["slots"]["per_slot_ctx"] == 16384 and data["slots"]["batch_need"] == 40
    assert not logs_dir().exists() or not any(logs_dir().iterdir())
