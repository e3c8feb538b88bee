"""Patch 0010: the Hadamard fold of Bonsai 2 files, run by our llama-server on files we write.

A tiny qwen35 target in the plain basis (F32) and the same model folded by PrismML's published
rules (tests/support/hadamard_fold.py: block 1024, sign widths 1024/2048/3072, ssm_out's value
heads permuted) must give the same greedy tokens and next-token log-probabilities within float
rounding; the folded weights read without the fold must not. Keys that do not fit fail the load
with one line. Runs with an F32 KV cache and flash attention off, so that both twins take the
same float path (F16 rounding of K/V and of FA's Q would move logits by ~1e-3, not the fold).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))

import hadamard_fold
import tiny_gguf

PROMPTS = hadamard_fold.PROMPTS
EXACT_PATH = ["-fa", "off", "-ctk", "f32", "-ctv", "f32", "-t", "2"]
LOGPROB_TOLERANCE = 2e-3  # measured: 1e-4 between the twins; an unfolded read is off by tens


@pytest.fixture(scope="module")
def fold_pair(tmp_path_factory) -> hadamard_fold.FoldPair:
    return hadamard_fold.write_fold_pair(tmp_path_factory.mktemp("fold"))


Answers = list[tuple[list[int], list[list[tuple[int, float]]]]]


def _answers(binary: Path, model: Path, log: Path) -> Answers:
    with tiny_gguf.serve(binary, ["-m", model, "-c", "256", *EXACT_PATH], log) as srv:
        return ask(srv.post)


def ask(post: Callable[[str, dict], dict]) -> Answers:
    """Per prompt: 12 greedy tokens, and the top-5 (id, log-probability) of the first step;
    `post(path, body)` asks a running server."""
    out = []
    for prompt in PROMPTS:
        greedy = post("/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0, "n_probs": 1})
        dist = post(
            "/completion",
            {
                "prompt": prompt,
                "n_predict": 1,
                "temperature": 1.0,
                "top_k": 0,
                "top_p": 1.0,
                "min_p": 0.0,
                "n_probs": 5,
            },
        )
        tokens = [step["id"] for step in greedy["completion_probabilities"]]
        top = [[(t["id"], t["logprob"]) for t in step["top_logprobs"]] for step in dist["completion_probabilities"]]
        out.append((tokens, top))
    return out


def same_answers(want: Answers, got: Answers) -> bool:
    """Every prompt's greedy tokens equal, and its first step's top-5 within float rounding."""
    return all(w[0] == g[0] and _close(w[1][0], g[1][0]) for w, g in zip(want, got, strict=True))


def no_answer_alike(want: Answers, got: Answers) -> bool:
    """No prompt's greedy tokens nor its first step's distribution alike: a wrong read, not rounding."""
    return all(w[0] != g[0] and not _close(w[1][0], g[1][0]) for w, g in zip(want, got, strict=True))


def _close(a, b) -> bool:
    return [i for i, _ in a] == [i for i, _ in b] and all(
        abs(x - y) <= LOGPROB_TOLERANCE for (_, x), (_, y) in zip(a, b, strict=True)
    )


@pytest.mark.slow
def test_the_folded_twin_answers_like_the_plain_one(llama_server, fold_pair, tmp_path):
    plain = _answers(llama_server, fold_pair.plain, tmp_path / "plain.log")
    folded = _answers(llama_server, fold_pair.folded, tmp_path / "folded.log")
    for (p_tokens, p_top), (f_tokens, f_top) in zip(plain, folded, strict=True):
        assert f_tokens == p_tokens
        assert _close(p_top[0], f_top[0]), (p_top, f_top)


@pytest.mark.slow
def test_the_folded_weights_read_without_the_fold_do_not_match(llama_server, fold_pair, tmp_path):
    """The test above can fail: what a build that ignores prism.hadamard.* reads is far off."""
    plain = _answers(llama_server, fold_pair.plain, tmp_path / "plain.log")
    unfolded = _answers(llama_server, fold_pair.unfolded, tmp_path / "unfolded.log")
    differing = sum(p[0] != u[0] for p, u in zip(plain, unfolded, strict=True))
    assert differing == len(PROMPTS)
    assert not any(_close(p[1][0], u[1][0]) for p, u in zip(plain, unfolded, strict=True))


@pytest.mark.slow
def test_without_the_permutation_ssm_out_is_wrong(llama_server, fold_pair, tmp_path):
    """gdn_v_grouped matters: the same file saying the value heads are not grouped answers differently."""
    ungrouped = fold_pair.variant(tmp_path / "ungrouped.gguf", grouped=False)
    plain = _answers(llama_server, fold_pair.plain, tmp_path / "plain.log")
    wrong = _answers(llama_server, ungrouped, tmp_path / "ungrouped.log")
    assert not all(_close(p[1][0], u[1][0]) for p, u in zip(plain, wrong, strict=True))


@pytest.mark.slow
def test_version_2_folds_the_tied_lm_head_through_token_embd(llama_server, fold_pair, tmp_path):
    """Version 2: no output.weight, the LM head is the rotated token_embd and takes the transform."""
    untied = [t for t in fold_pair.folded_tensors if t[0] != "output.weight"]
    names = [n for n in fold_pair.names if n != "output.weight"]
    plain_tensors = [t for t in fold_pair.plain_tensors if t[0] != "output.weight"]
    plain = hadamard_fold.tiny_hybrid.write_parts(tmp_path / "tied-plain.gguf", fold_pair.kv, plain_tensors)
    keys = hadamard_fold.fold_kv(fold_pair.signs, names, version=2, tied_output=True)
    folded = hadamard_fold.tiny_hybrid.write_parts(tmp_path / "tied-folded.gguf", fold_pair.kv + keys, untied)
    want = _answers(llama_server, plain, tmp_path / "tied-plain.log")
    got = _answers(llama_server, folded, tmp_path / "tied-folded.log")
    for (p_tokens, p_top), (f_tokens, f_top) in zip(want, got, strict=True):
        assert f_tokens == p_tokens and _close(p_top[0], f_top[0]), (p_top, f_top)
    # the same file as version 1 would read the rotated embedding as a plain LM head: refused
    v1 = hadamard_fold.tiny_hybrid.write_parts(
        tmp_path / "tied-v1.gguf", fold_pair.kv + hadamard_fold.fold_kv(fold_pair.signs, names), untied
    )
    with (
        pytest.raises(tiny_gguf.ServerExited) as exited,
        tiny_gguf.serve(llama_server, ["-m", v1], tmp_path / "v1.log"),
    ):
        pass
    assert "the LM head would read the rotated token_embd without its transform" in exited.value.log


def _extra_width(fold_pair) -> dict:
    return {**fold_pair.signs, 4096: hadamard_fold.signs_for([4096], 1)[4096]}


BAD_KEYS = {
    "transform": ({"transform": "random-rotation"}, "transform 'random-rotation' is unknown"),
    "axis": ({"axis": "output-first-dimension"}, "axis 'output-first-dimension' is unknown"),
    "block": ({"block_size": 1000}, "block_size 1000 is not a power of two"),
    "unused-width": ({"signs": _extra_width}, "sign width 4096 matches no folded weight's input"),
    "missing-weight": (
        {"weight_names": ["blk.0.ffn_up.weight", "blk.9.ffn_up.weight"]},
        "weight_names lists 'blk.9.ffn_up.weight', which the file does not have",
    ),
    "plain-read": (
        {"weight_names": ["blk.0.ffn_up.weight", "blk.0.ssm_conv1d.weight"]},
        "weight_names lists 'blk.0.ssm_conv1d.weight', which this build's graph cannot transform",
    ),
    "version": ({"version": 3}, "version 3 is not one this build knows"),
}


@pytest.mark.parametrize("case", sorted(BAD_KEYS))
@pytest.mark.slow
def test_keys_that_do_not_fit_fail_the_load_in_one_line(llama_server, fold_pair, tmp_path, case):
    override, message = BAD_KEYS[case]
    override = {k: (v(fold_pair) if callable(v) else v) for k, v in override.items()}
    model = fold_pair.variant(tmp_path / f"{case}.gguf", **override)
    with (
        pytest.raises(tiny_gguf.ServerExited) as exited,
        tiny_gguf.serve(llama_server, ["-m", model, "-c", "256"], tmp_path / f"{case}.log"),
    ):
        pass
    assert exited.value.returncode not in (None, 0) and exited.value.returncode > 0  # an exit, not a signal (abort)
    assert f"Hadamard-folded file (prism.hadamard.*): {message}" in exited.value.log
