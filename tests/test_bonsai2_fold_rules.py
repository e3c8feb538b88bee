"""Patch 0010 against every fold the format allows (issue 48), beyond the 27B's block 1024.

The published rules (shared/reference/bonsai2-format.md, 2026-12-05): one power-of-two block
size read from the file, 64 to 2048, that divides every folded width; a tied LM head (version
2); ssm_out's value heads grouped for any number of key heads (nk) and repeats (rep); anything
else refused at load in one line. Each case is a file the suite writes twice, plain and folded
(tests/support/hadamard_fold.py): the folded one must answer like its plain twin (the same
greedy tokens, the first step's top-5 log-probabilities within float rounding), and the folded
weights read without the fold must not. The small files fold one kind of weight only
(write_partial_fold: milliseconds to write); the Bonsai 2 4B's and 9B's widths (SHAPE_4B,
SHAPE_9B: ~340 MB each, written once per session) are served through `bonsai start --model`,
as a user serves a downloaded file.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

import hadamard_fold
import tiny_gguf
from start_helpers import bonsai, json_out, stop_all
from test_bonsai2_fold import EXACT_PATH, Answers, _answers, ask, no_answer_alike, same_answers

pytestmark = [pytest.mark.server, pytest.mark.slow]

BLOCKS = (64, 128, 256, 512, 1024, 2048)
FFN = 3 * 2048  # ffn_down's input: a multiple of every block, and not a power of two
SCALE = 0.2  # the layers weigh in the answer (the smallest top-2 gap of these prompts: 0.009)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fold-rules")


_PLAIN: dict[Path, Answers] = {}  # the plain twin every block folds is the same file: asked once


@pytest.mark.parametrize("block", BLOCKS)
def test_every_power_of_two_block_from_64_to_2048_folds(llama_server, folder, block, tmp_path):
    pair = hadamard_fold.write_partial_fold(folder, ("ffn_down",), block=block, ff=FFN, layer_scale=SCALE)
    if pair.plain not in _PLAIN:
        _PLAIN[pair.plain] = _answers(llama_server, pair.plain, tmp_path / "plain.log")
    plain = _PLAIN[pair.plain]
    assert same_answers(plain, _answers(llama_server, pair.folded, tmp_path / "folded.log"))
    # the test can fail: the same rotated weights read plainly answer otherwise
    assert not same_answers(plain, _answers(llama_server, pair.unfolded, tmp_path / "unfolded.log"))


def _refusal(llama_server, model: Path, log: Path) -> str:
    with pytest.raises(tiny_gguf.ServerExited) as exited, tiny_gguf.serve(llama_server, ["-m", model], log):
        pass
    assert exited.value.returncode is not None and exited.value.returncode > 0  # an exit, not an abort
    return exited.value.log


def test_a_block_that_does_not_divide_a_folded_width_is_refused(llama_server, folder, tmp_path):
    pair = hadamard_fold.write_partial_fold(folder, ("ffn_down",), block=1024, ff=3 * 1024, layer_scale=SCALE)
    log = _refusal(llama_server, pair.variant(tmp_path / "b2048.gguf", block_size=2048), tmp_path / "b2048.log")
    line = next(x for x in log.splitlines() if "Hadamard-folded file (prism.hadamard.*): sign width 3072 " in x)
    assert "is not a positive multiple of block_size 2048" in line


# The format's blocks are 64 to 2048 (patch 0010 refuses the rest): the transform's matrix is
# block x block floats built on the host, 16 GiB at 65536, so a file outside the range fails its
# load in one line instead of the server being killed for memory.
@pytest.mark.parametrize("block", [32, 4096])
def test_a_block_outside_64_to_2048_is_refused(llama_server, folder, block, tmp_path):
    pair = hadamard_fold.write_partial_fold(folder, ("ffn_down",), block=block, ff=3 * 4096, layer_scale=SCALE)
    log = _refusal(llama_server, pair.folded, tmp_path / "outside.log")
    assert f"Hadamard-folded file (prism.hadamard.*): block_size {block} is not a power of two in 64..2048" in log


@pytest.mark.parametrize("nk, rep", [(4, 1), (1, 4), (4, 3), (16, 3)])
def test_grouped_value_heads_for_any_key_heads_and_repeats(llama_server, folder, nk, rep, tmp_path):
    """ssm_out alone folded, its input permuted from tiled [hd, nk, rep] to grouped [hd, rep, nk]
    (the identity when nk or rep is 1); the 27B's heads are nk 16, rep 3."""
    pair = hadamard_fold.write_partial_fold(
        folder, ("ssm_out",), block=64, k_heads=nk, v_heads=nk * rep, layer_scale=SCALE
    )
    plain = _answers(llama_server, pair.plain, tmp_path / "plain.log")
    assert same_answers(plain, _answers(llama_server, pair.folded, tmp_path / "folded.log"))
    assert not same_answers(plain, _answers(llama_server, pair.unfolded, tmp_path / "unfolded.log"))
    if nk > 1 and rep > 1:  # the permutation matters: the file saying tiled answers otherwise
        tiled = pair.variant(tmp_path / "tiled.gguf", grouped=False)
        assert not same_answers(plain, _answers(llama_server, tiled, tmp_path / "tiled.log"))


# -- the Bonsai 2 4B's and 9B's widths, served by `bonsai start --model` --------------------------


@pytest.fixture(scope="session")
def bonsai2_shapes(tmp_path_factory) -> dict[str, hadamard_fold.FoldPair]:
    """~9 s each to write: once per session."""
    root = tmp_path_factory.mktemp("bonsai2-shapes")
    return {
        name: hadamard_fold.write_fold_pair(root / name, shape=shape)
        for name, shape in (("4B", hadamard_fold.SHAPE_4B), ("9B", hadamard_fold.SHAPE_9B))
    }


def _started_answers(llama_server, model: Path) -> tuple[Answers, dict]:
    """Serve `model` as a user does (`bonsai start --model`, detached), ask, stop; (answers, plan)."""
    try:
        started = json_out(
            bonsai(
                ["start", "--model", model, "--ctx", "256", "--detach", "--json", "--", *EXACT_PATH],
                server=llama_server,
                timeout=300,
            )
        )

        def post(path: str, body: dict) -> dict:
            req = urllib.request.Request(
                started["url"] + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                return json.load(resp)

        return ask(post), started["plan"]
    finally:
        stop_all()


@pytest.mark.parametrize(
    "shape, fold",
    [
        ("4B", {"version": 2, "block": 512, "grouped_v_heads": True}),
        ("9B", {"version": 1, "block": 1024, "grouped_v_heads": True}),
    ],
)
def test_bonsai2_4b_and_9b_widths_answer_like_their_twins_through_start(llama_server, bonsai2_shapes, shape, fold):
    pair = bonsai2_shapes[shape]
    inspected = json_out(bonsai(["inspect", pair.folded, "--json"], server=llama_server))
    assert inspected["folded"] == fold and inspected["embedding"] == (2560 if shape == "4B" else 4096)
    if shape == "4B":  # the tied head: no output.weight, 16 key heads with 2 value heads each
        assert "output.weight" not in {n for n, _, _ in pair.folded_tensors}
        assert set(pair.widths) == {1536, 2048, 2560, 4096}
    plain, _ = _started_answers(llama_server, pair.plain)
    folded, plan = _started_answers(llama_server, pair.folded)
    assert not any("gibberish" in w for w in plan["warnings"]), plan["warnings"]
    assert same_answers(plain, folded), (plain, folded)
    unfolded, _ = _started_answers(llama_server, pair.unfolded)
    assert no_answer_alike(plain, unfolded), (plain, unfolded)
