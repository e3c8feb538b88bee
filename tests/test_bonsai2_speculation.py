"""Speculation on a Hadamard-folded qwen35 target (patch 0010), lossless against plain.

DSpark (whose drafter borrows the target's rotated embedding and folded LM head), ngram-mod,
draft-mtp on a grafted MTP head (its own lookup in the rotated embedding, the target's folded
head), and the two together as Bonsai 2 users without a drafter run them (ngram-mod,draft-mtp,
with the flags bonsai plans), each on 1 slot with a follow-up that reuses the cache and on 2
slots with 2 concurrent requests: the answers at temperature 0 are token for token the plain
ones. The folded target is tests/support/hadamard_fold.py's (F32, block 1024, three sign
widths, grouped value heads).
"""

from __future__ import annotations

import re

import pytest

import hadamard_fold
import tiny_gguf
from start_helpers import bonsai, bonsai_env, json_out
from test_hybrid_speculation import check_lossless

pytestmark = pytest.mark.server

PROMPTS = [[10, 11, 12, 13, 14, 15, 16, 17] * 2, [300, 7, 7, 42, 199, 3, 300, 7, 7, 42, 199, 3]]


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    return hadamard_fold.write_fold_pair(tmp_path_factory.mktemp("fold-mtp"), mtp=True)


@pytest.mark.slow
def test_draft_mtp_on_a_grafted_head_is_lossless(llama_server, folded, tmp_path):
    spec = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    check_lossless(llama_server, tmp_path, folded.folded, spec, PROMPTS, "drafted", "folded-mtp")


def _echo_prompts(llama_server, folded, tmp_path) -> list[list[int]]:
    """The prompts, each followed by the model's own answer to it and the prompt again: text that
    ngram-mod finds repeated, whatever this (non-counting) model says."""
    with tiny_gguf.serve(llama_server, ["-m", folded.folded, "-c", "2048", "-t", "1"], tmp_path / "own.log") as s:
        own = [s.completion(p, n_predict=40, return_tokens=True)["tokens"] for p in PROMPTS]
    return [p + a + p for p, a in zip(PROMPTS, own, strict=True)]


@pytest.mark.slow
def test_ngram_mod_is_lossless(llama_server, folded, tmp_path):
    prompts = _echo_prompts(llama_server, folded, tmp_path)
    spec = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-min", "1"]
    check_lossless(llama_server, tmp_path, folded.folded, spec, prompts, "drafted", "folded-ngram")


# what each of a list's types drafted, from llama-server's statistics (printed at log level 5)
_STATS = re.compile(r"statistics\s+(\S+): .*#gen tokens =\s+(\d+)")


def _generated(log: str) -> dict[str, int]:
    """The last statistics line of each type (they count from the server's start)."""
    return {m.group(1): int(m.group(2)) for m in _STATS.finditer(log)}


@pytest.mark.slow
def test_ngram_mod_with_draft_mtp_as_bonsai_plans_it_is_lossless_and_both_draft(llama_server, folded, tmp_path):
    """BONSAI_SPEC_TYPE=ngram-mod,draft-mtp: the speculation flags of bonsai's own plan, with
    ngram-mod's lookup shortened after -- (its defaults find nothing in 40-token answers)."""
    short = ["--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "16"]
    env = bonsai_env(llama_server, BONSAI_SPECULATIVE="1", BONSAI_SPEC_TYPE="ngram-mod,draft-mtp", BONSAI_SPEC_NMAX="2")
    plan = json_out(bonsai(["start", "--model", folded.folded, "--dry-run", "--json", "--", *short], env=env))
    argv = plan["argv"]
    spec = [w for i, w in enumerate(argv) if w.startswith("--spec") or argv[i - 1].startswith("--spec")]
    assert spec[:4] == ["--spec-type", "ngram-mod,draft-mtp", "--spec-draft-n-max", "2"] and "-md" not in argv
    prompts = _echo_prompts(llama_server, folded, tmp_path)
    check_lossless(llama_server, tmp_path, folded.folded, [*spec, "-lv", "5"], prompts, "drafted", "both")
    for log in ("both-spec.log", "both-two.log"):  # 1 slot, then 2 slots with 2 concurrent requests
        drafted = _generated((tmp_path / log).read_text(errors="replace"))
        assert drafted.get("ngram-mod", 0) > 0 and drafted.get("draft-mtp", 0) > 0, (log, drafted)


@pytest.mark.slow
def test_dspark_sharing_the_folded_embedding_and_head_is_lossless(llama_server, folded, tmp_path):
    drafter = tiny_gguf.write_dspark_drafter(
        tmp_path / "d.gguf", target_embedding=hadamard_fold.SHAPE["embedding"], target_layers=(0, 1), seed=3
    )
    spec = ["-md", drafter, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
    check_lossless(llama_server, tmp_path, folded.folded, spec, PROMPTS, "drafted", "folded-dspark")
