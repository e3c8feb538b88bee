"""The MTP draft head over the LM head's first rows (vendor/llama.cpp/patches/0015-*).

On a CPU, a qwen35 MTP drafter ran the target's whole LM head once per drafted token (a
248320-token head: 37% of a decode step each). Patch 0015 multiplies by the head's first
LLAMA_DRAFT_HEAD_ROWS rows only (default 65536 where the CPU computes the head), and the other
tokens get -inf logits, so they are never drafted. The target verifies every token as before.

The tiny "pure" qwen35 with an MTP layer counts through its vocabulary (last+1, whatever the
context), and its MTP layer predicts exactly that, so every draft is right: which drafts are
accepted shows which rows the draft head had. Below the cut every draft is accepted; past it
none is (the right token cannot be drafted); and the tokens are plain decoding's either way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiny_gguf
from bonsai_launch.models import tiny_hybrid

pytestmark = pytest.mark.server

N_PREDICT = 64
SPEC = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]


def generate(server: Path, model: Path, prompt: list[int], log: Path, *, spec: bool, rows: str | None) -> dict:
    """tokens and the draft counts of one greedy request."""
    env = {} if rows is None else {"LLAMA_DRAFT_HEAD_ROWS": rows}
    args = ["-m", model, "-c", "1024", "-np", "1", "-t", "1", *(SPEC if spec else [])]
    with tiny_gguf.serve(server, args, log, env=env) as s:
        out = s.completion(prompt, n_predict=N_PREDICT, cache_prompt=False, return_tokens=True)
    timings = out["timings"]
    return {
        "tokens": out["tokens"],
        "drafted": timings.get("draft_n", 0),
        "accepted": timings.get("draft_n_accepted", 0),
    }


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> Path:
    return tiny_hybrid.write_hybrid_target(tmp_path_factory.mktemp("head") / "counter-mtp.gguf", mtp=True)


def test_tokens_past_the_cut_are_never_drafted_and_the_answer_stays_plain(llama_server, counter, tmp_path):
    below = tiny_hybrid.counter_prompt(10, 16)  # answers 26..89: inside the first 256 rows
    past = tiny_hybrid.counter_prompt(300, 16)  # answers 316..379: past them
    for name, prompt in (("below", below), ("past", past)):
        plain = generate(llama_server, counter, prompt, tmp_path / f"{name}-plain.log", spec=False, rows=None)
        assert plain["tokens"] == [(prompt[-1] + 1 + i) % 512 for i in range(N_PREDICT)], "the pure target counts"
        cut = generate(llama_server, counter, prompt, tmp_path / f"{name}-256.log", spec=True, rows="256")
        assert cut["tokens"] == plain["tokens"], f"{name}: speculation changed the answer"
        assert cut["drafted"] > 0, f"{name}: nothing was drafted"
        if name == "below":
            assert cut["accepted"] == cut["drafted"], f"below the cut every draft is right: {cut}"
        else:
            assert cut["accepted"] == 0, f"past the cut no right draft can be made (without patch 0015 all are): {cut}"


@pytest.mark.parametrize("rows", [None, "0", "512", "100000"])
def test_the_whole_head_drafts_when_the_vocabulary_is_within_the_rows(llama_server, counter, tmp_path, rows):
    """Unset (65536 on a CPU, more than this vocabulary of 512), 0 (the whole head) and any count
    at or past the vocabulary leave the head whole: every draft past 255 is accepted too."""
    past = tiny_hybrid.counter_prompt(300, 16)
    got = generate(llama_server, counter, past, tmp_path / "whole.log", spec=True, rows=rows)
    assert got["drafted"] > 0 and got["accepted"] == got["drafted"], got


def test_the_cut_is_rounded_down_to_whole_row_groups(llama_server, counter, tmp_path):
    """300 rows draft like 256 (a repacked weight keeps its rows in groups; multiples of 64 fit
    them all): the answers 256..319 are all past the cut, none would be at 300."""
    prompt = tiny_hybrid.counter_prompt(240, 16)  # answers 256..319
    got = generate(llama_server, counter, prompt, tmp_path / "r.log", spec=True, rows="300")
    assert got["drafted"] > 0 and got["accepted"] == 0, got


def test_on_a_cpu_the_default_cut_is_65536_rows(llama_server, tmp_path):
    """A vocabulary past 65536 on the CPU, its one answer token past 65535 (the "constant"
    target, whose MTP layer drafts that token too): by default it is never drafted, and
    LLAMA_DRAFT_HEAD_ROWS=0 gives the whole head back."""
    vocab, token = 65536 + 512, 65536 + 100
    model = tiny_hybrid.write_hybrid_target(
        tmp_path / "big-vocab-mtp.gguf", mode="constant", constant_token=token, mtp=True, vocab=vocab
    )
    prompt = [1, 2, 3, 4]
    default = generate(llama_server, model, prompt, tmp_path / "default.log", spec=True, rows=None)
    whole = generate(llama_server, model, prompt, tmp_path / "whole.log", spec=True, rows="0")
    assert default["tokens"] == whole["tokens"] == [token] * N_PREDICT
    assert default["drafted"] > 0 and default["accepted"] == 0, default
    assert whole["drafted"] > 0 and whole["accepted"] == whole["drafted"], whole


@pytest.mark.parametrize("rows", ["65k", "-256", "all"])
def test_a_value_that_is_not_a_row_count_is_reported_and_the_default_kept(llama_server, counter, tmp_path, rows):
    """ "65k" read as a number would be 65 rows (64 after rounding): every draft past 63 refused.
    It is reported in the log, naming the variable and the value, and the default (here the
    whole head of 512) drafts every answer."""
    log = tmp_path / "bad.log"
    got = generate(llama_server, counter, tiny_hybrid.counter_prompt(300, 16), log, spec=True, rows=rows)
    assert got["drafted"] > 0 and got["accepted"] == got["drafted"], got
    assert f"LLAMA_DRAFT_HEAD_ROWS={rows} is not a whole number of rows" in log.read_text()


# -- patch 0016: a DSpark drafter's borrowed head --------------------------------------------------

DSPARK = ["--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]


def dspark_generate(server: Path, target: Path, drafter: Path | None, log: Path, rows: str | None) -> dict:
    """tokens and the draft counts of one greedy request, plain when `drafter` is None."""
    env = {} if rows is None else {"LLAMA_DRAFT_HEAD_ROWS": rows}
    spec = ["-md", drafter, *DSPARK] if drafter is not None else []
    args = ["-m", target, *spec, "-c", "1024", "-np", "1", "-t", "1"]
    with tiny_gguf.serve(server, args, log, env=env) as s:
        out = s.completion([1, 2, 3, 4], n_predict=N_PREDICT, cache_prompt=False, return_tokens=True)
    timings = out["timings"]
    return {
        "tokens": out["tokens"],
        "drafted": timings.get("draft_n", 0),
        "accepted": timings.get("draft_n_accepted", 0),
    }


def markov_toward(token: int, vocab: int = 512, rank: int = 8) -> dict:
    """Markov weights whose bias lifts `token` far above every other, whatever came before."""
    w2 = np.zeros((vocab, rank), dtype=np.float32)
    w2[token, :] = 1000.0
    return {"markov_w1.weight": np.ones((vocab, rank), dtype=np.float32), "markov_w2.weight": w2}


@pytest.mark.parametrize("answer", [100, 300])
def test_a_borrowed_dspark_head_drafts_only_below_the_cut(llama_server, tmp_path, answer):
    """A drafter borrowing a constant target's head drafts the target's token: with 256 rows of
    512 it is accepted below the cut and never past it, the answer stays plain decoding's, and
    the default (65536 rows, more than this vocabulary) keeps the whole head."""
    target = tiny_gguf.write_target(tmp_path / "t.gguf", constant_token=answer)
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", constant_token=7, borrow_head=True)
    plain = dspark_generate(llama_server, target, None, tmp_path / "plain.log", None)
    cut = dspark_generate(llama_server, target, drafter, tmp_path / "cut.log", "256")
    whole = dspark_generate(llama_server, target, drafter, tmp_path / "whole.log", None)
    assert cut["tokens"] == whole["tokens"] == plain["tokens"] == [answer] * N_PREDICT
    assert cut["drafted"] > 0 and whole["drafted"] > 0
    assert whole["accepted"] == whole["drafted"], whole
    if answer < 256:
        assert cut["accepted"] == cut["drafted"], cut
    else:
        assert cut["accepted"] == 0, f"past the cut no right draft can be made (without patch 0016 all are): {cut}"


def test_the_markov_bias_is_cut_with_the_head(llama_server, tmp_path):
    """The Markov head's bias covers the cut head's rows only: a bias toward token 300 wins with
    the whole head (a wrong draft: the target says 100) and is gone with 256 rows (the head's
    own, right, draft). A bias toward 200, inside the cut, wins either way."""
    target = tiny_gguf.write_target(tmp_path / "t.gguf", constant_token=100)
    got = {}
    for toward in (300, 200):
        drafter = tiny_gguf.write_dspark_drafter(
            tmp_path / f"d{toward}.gguf", constant_token=7, borrow_head=True, tensor_overrides=markov_toward(toward)
        )
        for rows in ("0", "256"):
            got[toward, rows] = dspark_generate(llama_server, target, drafter, tmp_path / f"{toward}-{rows}.log", rows)
    assert all(g["drafted"] > 0 and g["tokens"] == [100] * N_PREDICT for g in got.values()), got
    assert got[300, "0"]["accepted"] == 0, got  # the bias's token past the cut wins over the head's
    assert got[300, "256"]["accepted"] == got[300, "256"]["drafted"], got  # its row is cut away
    assert got[200, "0"]["accepted"] == got[200, "256"]["accepted"] == 0, got


def test_each_model_of_a_router_drafts_from_its_own_rows(llama_server, counter, tmp_path):
    """A llama-server router hands its children one environment, but each child reads its own
    preset section: bonsai plans one model of the counter with BONSAI_DRAFT_HEAD_ROWS=256 and one
    with 0, and its preset gives each child `spec-draft-head-rows` (patch 0017). Past row 255 the
    first model's drafts are all refused and the second's all accepted. Without 0017 the router
    refuses the unknown key; before it, bonsai dropped the variable for both."""
    import dataclasses

    from bonsai_launch.llamacpp.binaries import probe
    from bonsai_launch.models.gguf import inspect_gguf
    from bonsai_launch.server.plan.router import plan_router
    from test_plan import plan_for

    caps = probe(llama_server)
    info = inspect_gguf(counter)
    plans = {
        name: plan_for(
            env={
                "BONSAI_SPECULATIVE": "1",
                "BONSAI_SPEC_NMAX": "2",
                "BONSAI_DRAFT_HEAD_ROWS": rows,
                "BONSAI_CTX": "1024",
            },
            with_drafter=False,
            model=info,
            caps=caps,
        )
        for name, rows in (("cut", "256"), ("whole", "0"))
    }
    models = [(name, dataclasses.replace(p.served, name=name)) for name, p in plans.items()]
    router = plan_router(
        plans["cut"].server,
        models,
        {},
        caps.options,
        preset_path=str(tmp_path / "p.ini"),
        cache_dir=str(tmp_path),
        name="r",
    )
    (tmp_path / "p.ini").write_text(router.preset)
    args = ["--models-preset", tmp_path / "p.ini", "--models-max", "2", "-t", "1"]
    past = tiny_hybrid.counter_prompt(300, 16)
    got = {}
    with tiny_gguf.serve(llama_server, args, tmp_path / "router.log", env={"LLAMA_CACHE": str(tmp_path)}) as s:
        for name in plans:
            out = s.post(
                "/completion",
                {"model": name, "prompt": past, "n_predict": 32, "cache_prompt": False, "return_tokens": True},
            )
            got[name] = (out["timings"].get("draft_n", 0), out["timings"].get("draft_n_accepted", 0), out["tokens"])
    (cut_drafted, cut_accepted, cut_tokens), (whole_drafted, whole_accepted, whole_tokens) = got["cut"], got["whole"]
    assert cut_tokens == whole_tokens == [(316 + i) % 512 for i in range(32)], got
    assert cut_drafted > 0 and cut_accepted == 0, got
    assert whole_drafted > 0 and whole_accepted == whole_drafted, got
