"""Speculation does not change the output at temperature 0, tested where it CAN fail.

The constant pair accepts every draft, so it never exercises the rejection path. Here the
targets have random weights whose greedy output depends on the prompt, the drafters disagree
with them often, and every case asserts that acceptance is strictly between 0 and 100 %:
drafts were both accepted and rejected, and the text is still token-for-token the plain one.
The bench's temperature-0 equality check is fed prompt-dependent outputs, real and doctored.
"""

from __future__ import annotations

import random

import pytest

import bench_options
import tiny_gguf
from bonsai_launch.bench.measure import RequestResult
from bonsai_launch.bench.verdicts import equality
from bonsai_launch.models import tiny_hybrid

THREADS = ["-t", "1"]  # ggml's spinning threads slow tiny models badly on a busy 2-core machine
N_PREDICT = 64


def _prompts(seed: int, n: int = 3, length: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(length)] for _ in range(n)]


def _run(server, prompts: list[list[int]]) -> list[dict]:
    return [server.completion(p, n_predict=N_PREDICT, cache_prompt=False, return_tokens=True) for p in prompts]


def _assert_lossless_with_rejections(plain: list[dict], spec: list[dict], label: str) -> None:
    drafted = sum(int(r["timings"].get("draft_n") or 0) for r in spec)
    accepted = sum(int(r["timings"].get("draft_n_accepted") or 0) for r in spec)
    assert 0 < accepted < drafted, f"{label}: acceptance must be strictly between 0 and 100% ({accepted}/{drafted})"
    for i, (p, s) in enumerate(zip(plain, spec, strict=True)):
        assert len(p["tokens"]) == N_PREDICT
        assert s["tokens"] == p["tokens"], f"{label}: prompt {i} differs from the plain run"
    assert len({tuple(p["tokens"]) for p in plain}) == len(plain), "outputs must depend on the prompt"


@pytest.mark.server
@pytest.mark.parametrize("target_seed", [5, 11])
def test_random_dspark_pair_is_lossless_at_block_sizes_4_and_7(llama_server, tmp_path, target_seed):
    # layer_scale 1.0: the layers, not the embedding, decide the next token, so the greedy
    # output varies with the prompt and a random drafter is often wrong
    target = tiny_gguf.write_target(tmp_path / "target.gguf", seed=target_seed, layer_scale=1.0)
    prompts = _prompts(target_seed)
    with tiny_gguf.serve(llama_server, ["-m", target, "-c", "2048", "-np", "1", *THREADS], tmp_path / "plain.log") as s:
        plain = _run(s, prompts)
    for block in (4, 7):
        drafter = tiny_gguf.write_dspark_drafter(tmp_path / f"drafter{block}.gguf", seed=7, block_size=block)
        args = [
            "-m",
            target,
            "-md",
            drafter,
            "--spec-type",
            "draft-dspark",
            "--spec-draft-n-max",
            str(block),
            "-c",
            "2048",
            "-np",
            "1",
            *THREADS,
        ]
        with tiny_gguf.serve(llama_server, args, tmp_path / f"spec{block}.log") as s:
            spec = _run(s, prompts)
        _assert_lossless_with_rejections(plain, spec, f"target seed {target_seed}, DSpark block {block}")


@pytest.mark.server
@pytest.mark.parametrize("target_seed,hybrid", [(0, False), (5, False), (0, True)])
def test_random_target_with_ngram_mod_is_lossless(llama_server, tmp_path, target_seed, hybrid):
    # n-gram types draft from repeated text: each prompt is P O P O P, O being the model's own
    # answer to P, so drafts are proposed and only some of them match what the model says next.
    # hybrid: the qwen35 counter target (tiny_hybrid.py), whose rejected drafts roll back a
    # recurrent state (tests/test_hybrid_speculation.py has every type and acceptance level)
    if hybrid:
        target = tiny_hybrid.write_hybrid_target(tmp_path / "target.gguf", mode="counter", weight_type="q8_0")
    else:
        target = tiny_gguf.write_target(tmp_path / "target.gguf", seed=target_seed)
    base = _prompts(100 + target_seed)
    with tiny_gguf.serve(llama_server, ["-m", target, "-c", "2048", "-np", "1", *THREADS], tmp_path / "plain.log") as s:
        answers = [s.completion(p, n_predict=32, cache_prompt=False, return_tokens=True)["tokens"] for p in base]
        prompts = [p + o + p + o + p for p, o in zip(base, answers, strict=True)]
        plain = _run(s, prompts)
    args = ["-m", target, "--spec-type", "ngram-mod", "-c", "2048", "-np", "1", *THREADS]
    with tiny_gguf.serve(llama_server, args, tmp_path / "spec.log") as s:
        spec = _run(s, prompts)
    _assert_lossless_with_rejections(plain, spec, f"target seed {target_seed}, ngram-mod")


# -- the bench's equality check -----------------------------------------------------------------


def _results(config: str, texts: dict[str, str], repeat: int = 0) -> list[RequestResult]:
    return [
        RequestResult(
            config, pid, "code", 0.0, repeat, text=text, pieces=[text[i : i + 3] for i in range(0, len(text), 3)]
        )
        for pid, text in texts.items()
    ]


def test_equality_check_compares_prompt_by_prompt():
    answers = {"p1": "def add(a, b):\n    return a + b\n", "p2": "SELECT * FROM t;", "p3": "fn main() {}"}
    same = equality(_results("plain", answers) + _results("spec", answers), "spec", "plain", "all")
    assert same["compared"] == 3 and same["identical"] == 3 and same["first_diff_char"] is None

    # the same texts under the wrong prompts are all different
    shuffled = dict(zip(answers, [answers["p2"], answers["p3"], answers["p1"]], strict=True))
    wrong = equality(_results("plain", answers) + _results("spec", shuffled), "spec", "plain", "all")
    assert wrong["identical"] == 0

    # one answer diverging at character 22 is found, with where
    diverged = {**answers, "p1": "def add(a, b):\n    return b + a\n"}
    one = equality(_results("plain", answers) + _results("spec", diverged), "spec", "plain", "all")
    assert one["identical"] == 2
    assert one["first_diff_char"]["median"] == answers["p1"].index("a + b")
    assert one["baseline_self_consistent"] is True


@pytest.mark.server
def test_bench_equality_on_a_random_pair_is_real(llama_server, tmp_path):
    """Launch-mode bench on a random pair: the answers differ from prompt to prompt, drafts are
    rejected, and the equality check still reports every answer identical to plain."""
    from bonsai_launch.bench.pipeline import Target, run_bench

    target = tiny_gguf.write_target(tmp_path / "target.gguf", seed=5, layer_scale=1.0)
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "drafter.gguf", seed=7, block_size=7)
    options = bench_options.one_pass()
    doc, _ = run_bench(
        options,
        Target(model=str(target), drafter=str(drafter), binary=llama_server, passthrough=tuple(THREADS)),
        tmp_path / "out",
        chart=False,
    )
    suite = [r for r in doc["requests"] if r["phase"] == "suite"]
    plain_texts = {r["prompt_id"]: r["text"] for r in suite if r["config"] == "plain"}
    assert len(set(plain_texts.values())) == len(plain_texts) == 4  # prompt-dependent answers
    spec = next(r for r in doc["results"] if r["config"] == "speculative" and r["category"] == "all")
    assert 0 < spec["acceptance_rate"] < 1
    eq = next(c for c in doc["comparisons"] if c["category"] == "all")["output_equality"]
    assert eq["compared"] == 4 and eq["identical"] == 4
    proof = next(s for s in doc["servers"] if s["config"] == "speculative")["spec_proof"]
    assert proof["live"] and proof["drafted"] > 0


def test_url_mode_notes_a_server_that_never_drafted():
    from bonsai_launch.bench.data import not_drafting_note

    plain = [RequestResult("server", f"p{i}", "code", 0.0, 0, drafted=0) for i in range(3)]
    assert "server drafted no tokens in any of its 3 requests" in not_drafting_note(plain, "server")
    drafting = plain + [RequestResult("server", "p9", "code", 0.0, 0, drafted=4, accepted=2)]
    assert not_drafting_note(drafting, "server") is None
    unknown = [RequestResult("server", "p1", "code", 0.0, 0)]  # no draft counts at all: cannot tell
    assert not_drafting_note(unknown, "server") is None
