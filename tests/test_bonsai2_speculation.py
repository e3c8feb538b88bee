"""Speculation on a Hadamard-folded qwen35 target (patch 0010), lossless against plain.

DSpark (whose drafter borrows the target's rotated embedding and folded LM head), ngram-mod, and
draft-mtp on a grafted MTP head (its own lookup in the rotated embedding, the target's folded
head), each on 1 slot with a follow-up that reuses the cache and on 2 slots with 2 concurrent
requests: the answers at temperature 0 are token for token the plain ones. The folded target is
tests/support/hadamard_fold.py's (F32, block 1024, three sign widths, grouped value heads).
"""

from __future__ import annotations

import pytest

import hadamard_fold
import tiny_gguf
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


@pytest.mark.slow
def test_ngram_mod_is_lossless(llama_server, folded, tmp_path):
    """The prompts hold the model's own answer to their start, then the start again: text that
    ngram-mod finds repeated, whatever this (non-counting) model says."""
    with tiny_gguf.serve(llama_server, ["-m", folded.folded, "-c", "2048", "-t", "1"], tmp_path / "own.log") as s:
        own = [s.completion(p, n_predict=40, return_tokens=True)["tokens"] for p in PROMPTS]
    prompts = [p + a + p for p, a in zip(PROMPTS, own, strict=True)]
    spec = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-min", "1"]
    check_lossless(llama_server, tmp_path, folded.folded, spec, prompts, "drafted", "folded-ngram")


@pytest.mark.slow
def test_dspark_sharing_the_folded_embedding_and_head_is_lossless(llama_server, folded, tmp_path):
    drafter = tiny_gguf.write_dspark_drafter(
        tmp_path / "d.gguf", target_embedding=hadamard_fold.SHAPE["embedding"], target_layers=(0, 1), seed=3
    )
    spec = ["-md", drafter, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
    check_lossless(llama_server, tmp_path, folded.folded, spec, PROMPTS, "drafted", "folded-dspark")
