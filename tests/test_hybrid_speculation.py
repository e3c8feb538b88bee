"""Speculation on a hybrid (qwen35) target, the model every Bonsai 27B user runs, against the real server.

A verify on a hybrid target must roll back the delta-net layers' recurrent state when a draft is
rejected; dense targets never exercise that. For each speculative type the Bonsai 27B models are
run with (DSpark, ngram-mod, the model's own MTP layer at n-max 1, 2 and 3) and for each
acceptance level (none, part, all of the drafts), the answers at temperature 0 are token for
token the plain ones: on one slot, for a follow-up request that reuses the cached prefix, and on
2 slots with 2 concurrent requests (which needs vendor/llama.cpp/patches/0004-* on AMX CPUs:
the layer matrices here are Q8_0, an AMX type, as in the real files).

The acceptance levels come from the weights (tests/support/tiny_hybrid.py), not from luck:
- the "pure" counter target says last+1 whatever the context;
- MTP: its layer predicts token+1 for a chosen share of the vocabulary (mtp_accept 0, 0.5, 1);
- DSpark: a constant drafter never agrees with the counter, a constant target agrees with it
  always, a random drafter (its anchor row right, its mask rows wrong) in part;
- ngram-mod: the prompt's repeated text agrees with the counter, contradicts it, or both.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import tiny_gguf
from bonsai_launch.models import tiny_hybrid

pytestmark = pytest.mark.server

THREADS = ["-t", "1"]
N_PREDICT = 40
WEIGHTS = "q8_0"


@dataclass
class Answer:
    tokens: list[int]
    drafted: int
    accepted: int


def _answer(out: dict) -> Answer:
    t = out.get("timings") or {}
    return Answer(out["tokens"], int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0))


def run_session(server: tiny_gguf.TinyServer, prompts: list[list[int]]) -> list[Answer]:
    """Each prompt, then a follow-up that extends prompt + answer (its prefix comes from the cache)."""
    out = []
    for p in prompts:
        first = _answer(server.completion(p, n_predict=N_PREDICT, cache_prompt=True, return_tokens=True))
        follow = p + first.tokens + [(first.tokens[-1] + 5) % 512, (first.tokens[-1] + 6) % 512]
        out += [first, _answer(server.completion(follow, n_predict=N_PREDICT, cache_prompt=True, return_tokens=True))]
    return out


def run_concurrent(server: tiny_gguf.TinyServer, prompts: list[list[int]]) -> list[Answer]:
    def one(i: int) -> Answer:
        out = server.completion(prompts[i], n_predict=N_PREDICT, cache_prompt=False, return_tokens=True, id_slot=i)
        return _answer(out)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, range(len(prompts))))


def check_level(spec: list[Answer], level: str, label: str) -> None:
    drafted, accepted = sum(a.drafted for a in spec), sum(a.accepted for a in spec)
    assert drafted > 0, f"{label}: nothing was drafted, so nothing was tested"
    if level == "none":
        assert accepted == 0, f"{label}: {accepted}/{drafted} accepted, expected none"
    elif level == "all":
        assert accepted == drafted, f"{label}: {accepted}/{drafted} accepted, expected all"
    elif level == "part":
        assert 0 < accepted < drafted, f"{label}: {accepted}/{drafted} accepted, expected part"


def check_lossless(
    llama_server: Path, tmp: Path, target: Path, spec_args: list[str], prompts: list[list[int]], level: str, label: str
) -> None:
    base = ["-m", target, "-c", "2048", *THREADS]
    with tiny_gguf.serve(llama_server, [*base, "-np", "1"], tmp / f"{label}-plain.log") as s:
        plain = run_session(s, prompts)
    with tiny_gguf.serve(llama_server, [*base, "-np", "1", *spec_args], tmp / f"{label}-spec.log") as s:
        spec = run_session(s, prompts)
    assert [a.tokens for a in spec] == [a.tokens for a in plain], f"{label}: speculative answers differ from plain"
    check_level(spec, level, label)
    # 2 slots, 2 concurrent requests: the first answer of each prompt again
    with tiny_gguf.serve(llama_server, [*base, "-np", "2", *spec_args], tmp / f"{label}-two.log") as s:
        two = run_concurrent(s, prompts[:2])
    assert [a.tokens for a in two] == [plain[0].tokens, plain[2].tokens], f"{label}: 2 slots differ from 1 slot"
    assert sum(a.drafted for a in two) > 0, f"{label}: nothing drafted on 2 slots"


PROMPTS = [tiny_hybrid.counter_prompt(10, 16), tiny_hybrid.counter_prompt(300, 20)]


# -- MTP (the model's own multi-token-prediction layer, --spec-type draft-mtp) ------------------


@pytest.mark.parametrize("n_max", [1, 2, 3])
@pytest.mark.parametrize("accept,level", [(0.0, "none"), (0.5, "part"), (1.0, "all")])
@pytest.mark.slow
def test_draft_mtp_is_lossless_at_every_acceptance_level(llama_server, tmp_path, n_max, accept, level):
    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", mtp=True, mtp_accept=accept, weight_type=WEIGHTS)
    spec = ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, level, f"mtp-n{n_max}-{level}")


def test_draft_mtp_on_a_context_dependent_target_rolls_back_mid_block(llama_server, tmp_path):
    # the MTP layer predicts a pure counter, the target is not quite one: rejections at any depth
    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", mode="counter", mtp=True, weight_type=WEIGHTS)
    spec = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, "part", "mtp-counter")


def test_separate_mtp_only_file_drafts_for_the_target(llama_server, tmp_path):
    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", weight_type=WEIGHTS)
    mtp = tiny_hybrid.write_hybrid_target(tmp_path / "mtp.gguf", mtp_only=True, weight_type=WEIGHTS)
    spec = ["-md", mtp, "--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, "all", "mtp-file")


# -- DSpark (a dflash drafter with a Markov head) -----------------------------------------------


def test_dspark_is_lossless_with_part_of_the_drafts_accepted(llama_server, tmp_path):
    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", weight_type=WEIGHTS)
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", target_layers=(1, 3), seed=3, block_size=4)
    spec = ["-md", drafter, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, "part", "dspark-part")


def test_dspark_is_lossless_with_no_draft_accepted(llama_server, tmp_path):
    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", weight_type=WEIGHTS)
    # always drafts token 5; the counter says 5 only after 4, which no prompt or answer reaches
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", target_layers=(1, 3), constant_token=5)
    spec = ["-md", drafter, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, "none", "dspark-none")


def test_dspark_is_lossless_with_every_draft_accepted(llama_server, tmp_path):
    target = tiny_hybrid.write_hybrid_target(
        tmp_path / "t.gguf", mode="constant", constant_token=7, weight_type=WEIGHTS
    )
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", target_layers=(1, 3), constant_token=7)
    spec = ["-md", drafter, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, "all", "dspark-all")


def test_converted_legacy_log_snr_drafter_is_lossless(llama_server, tmp_path):
    """PrismML's published 27B drafters are legacy log-SNR files: converted by `bonsai
    convert-drafter` (target layers 0 and 2 become 1 and 3, a delta-net and the attention input)."""
    from legacy_dspark_gguf import write_legacy_drafter
    from start_helpers import bonsai

    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", weight_type=WEIGHTS)
    legacy = write_legacy_drafter(tmp_path / "legacy-dspark-bf16.gguf", log_snr=True, target_layers=(0, 2))
    out = tmp_path / "converted.gguf"
    done = bonsai(["convert-drafter", legacy, "--target", target, "-o", out, "--quantize", "none"])
    assert done.returncode == 0, done.stderr
    spec = ["-md", out, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
    check_lossless(llama_server, tmp_path, target, spec, PROMPTS, "any", "dspark-log-snr")


# -- ngram-mod (draft-free: drafts from repeated text) ------------------------------------------

# Short lookups and drafts, so it drafts on 40-token answers (its defaults, n-match 24 and n-min
# 48, draft nothing there).
NGRAM = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "2"]
NGRAM += ["--spec-ngram-mod-n-max", "8"]


def _seq(start: int, n: int) -> list[int]:
    return tiny_hybrid.counter_prompt(start, n)


NGRAM_PROMPTS = {
    # the text repeated in the prompt runs on further than both answers: every draft is right
    "all": [_seq(10, 180) + _seq(10, 12), _seq(300, 180) + _seq(300, 12)],
    # the repeated text breaks off where the answer goes on counting: right, then wrong
    "part": [_seq(10, 30) + _seq(400, 8) + _seq(10, 20), _seq(200, 30) + _seq(100, 8) + _seq(200, 20)],
    # the answer's first tokens are in the prompt, followed there by something else
    "none": [_seq(40, 4) + _seq(200, 8) + _seq(10, 30), _seq(340, 4) + _seq(100, 8) + _seq(310, 30)],
}


@pytest.mark.parametrize("level", ["none", "part", "all"])
def test_ngram_mod_is_lossless_at_every_acceptance_level(llama_server, tmp_path, level):
    target = tiny_hybrid.write_hybrid_target(tmp_path / "t.gguf", weight_type=WEIGHTS)
    check_lossless(llama_server, tmp_path, target, NGRAM, NGRAM_PROMPTS[level], level, f"ngram-{level}")
