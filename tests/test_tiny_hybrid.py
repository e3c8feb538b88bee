"""The tiny hybrid (qwen35) target of tests/support/tiny_hybrid.py: what it declares, and that the
real llama-server loads it and computes what its weights say.

The "pure" counter's answer is fixed by construction (last token + 1, with a margin checked when
the file is written), not by the CPU's arithmetic: any other token is a wrong computation."""

from __future__ import annotations

import pytest

import tiny_gguf
from bonsai_launch.models import tiny_hybrid
from bonsai_launch.models.gguf import inspect_gguf
from bonsai_launch.models.mtp import has_usable_mtp, mtp_problems

THREADS = ["-t", "1"]


def counter_answer(prompt: list[int], n: int, vocab: int = 512) -> list[int]:
    return [(prompt[-1] + 1 + i) % vocab for i in range(n)]


def test_header_declares_a_hybrid_with_unequal_key_and_value_heads(tmp_path):
    info = inspect_gguf(tiny_hybrid.write_hybrid_target(tmp_path / "h.gguf"))
    assert info.architecture == "qwen35" and info.layers == 4 and info.nextn_layers == 0
    keys = set(info.keys)
    assert {"qwen35.ssm.group_count", "qwen35.ssm.time_step_rank", "qwen35.full_attention_interval"} <= keys
    assert "qwen35.nextn_predict_layers" not in keys
    assert mtp_problems(info) == ["h.gguf has no MTP layers (qwen35.nextn_predict_layers is absent)"]


def test_mtp_layer_is_the_last_block_and_not_a_trunk_layer(tmp_path):
    info = inspect_gguf(tiny_hybrid.write_hybrid_target(tmp_path / "m.gguf", mtp=True))
    assert (info.layers, info.nextn_layers, info.trunk_layers) == (5, 1, 4)
    assert "blk.4.nextn.eh_proj.weight" in info.mtp_tensors and info.trunk_tensors
    assert has_usable_mtp(info)
    only = inspect_gguf(tiny_hybrid.write_hybrid_target(tmp_path / "o.gguf", mtp_only=True))
    assert only.nextn_layers == 1 and not only.trunk_tensors and has_usable_mtp(only)
    two = inspect_gguf(tiny_hybrid.write_hybrid_target(tmp_path / "two.gguf", mtp=True, nextn=2))
    assert not has_usable_mtp(two) and "draft-mtp runs exactly one" in mtp_problems(two)[0]


def test_inspect_reports_the_mtp_layer_and_trunk_layers(tmp_path):
    from start_helpers import bonsai, json_out

    path = tiny_hybrid.write_hybrid_target(tmp_path / "m.gguf", mtp=True)
    done = bonsai(["inspect", path])
    assert done.returncode == 0, done.stderr
    assert "MTP layers" in done.stdout and "4 (block_count 5 minus 1 MTP)" in done.stdout
    data = json_out(bonsai(["inspect", path, "--json"]))
    assert data["mtp_layers"] == 1 and data["trunk_layers"] == 4 and data["mtp_problems"] == []


@pytest.mark.parametrize("weight_type", ["f16", "q8_0", "q4_0"])
def test_weight_types_are_what_was_asked(tmp_path, weight_type):
    info = inspect_gguf(tiny_hybrid.write_hybrid_target(tmp_path / "h.gguf", weight_type=weight_type))
    assert weight_type.upper() in info.tensor_types


def test_counter_head_refuses_a_seed_without_margin():
    with pytest.raises(ValueError, match="counter"):
        tiny_hybrid.counter_head(embedding=4, vocab=512, seed=0)  # 4 dimensions cannot separate 512 tokens


@pytest.mark.server
@pytest.mark.parametrize("weight_type", ["f32", "q8_0"])
def test_real_server_loads_it_and_the_pure_target_counts(llama_server, tmp_path, weight_type):
    target = tiny_hybrid.write_hybrid_target(tmp_path / "h.gguf", weight_type=weight_type, mtp=True)
    with tiny_gguf.serve(llama_server, ["-m", target, "-c", "512", "-np", "1", *THREADS], tmp_path / "s.log") as s:
        prompt = tiny_hybrid.counter_prompt(100, 12)
        out = s.completion(prompt, n_predict=24, return_tokens=True)
    # a plain server skips the MTP block's tensors and serves the trunk: it counts
    assert out["tokens"] == counter_answer(prompt, 24)


@pytest.mark.server
def test_counter_mode_is_context_dependent_and_constant_mode_is_constant(llama_server, tmp_path):
    noisy = tiny_hybrid.write_hybrid_target(tmp_path / "c.gguf", mode="counter")
    const = tiny_hybrid.write_hybrid_target(tmp_path / "k.gguf", mode="constant", constant_token=7)
    prompt = tiny_hybrid.counter_prompt(50, 12)
    with tiny_gguf.serve(llama_server, ["-m", noisy, "-c", "512", "-np", "1", *THREADS], tmp_path / "c.log") as s:
        got = s.completion(prompt, n_predict=64, return_tokens=True)["tokens"]
    steps = [b - a for a, b in zip([prompt[-1], *got], got, strict=False)]
    # mostly a counter, not always: what makes a last+1 drafter partly accepted
    assert 0 < steps.count(1) < len(steps), got
    with tiny_gguf.serve(llama_server, ["-m", const, "-c", "512", "-np", "1", *THREADS], tmp_path / "k.log") as s:
        assert s.completion(prompt, n_predict=16, return_tokens=True)["tokens"] == [7] * 16
