"""GGUF header reading on the real demo model and on generated drafters."""

from __future__ import annotations

import tiny_gguf
from bonsai_launch.models.gguf import check_pair, inspect_gguf


def test_demo_model_header(demo_gguf):
    info = inspect_gguf(demo_gguf)
    assert (info.architecture, info.layers, info.embedding, info.vocab_size) == ("gemma3", 18, 640, 262144)
    assert info.has_chat_template is False and info.drafter is None
    assert info.tensor_types["Q4_K"] > 0 and info.file_size == 253_113_024
    assert len(info.vocab_fingerprint) == 16


def test_same_tokens_same_fingerprint(tmp_path):
    a = inspect_gguf(tiny_gguf.write_target(tmp_path / "a.gguf", seed=1))
    b = inspect_gguf(tiny_gguf.write_target(tmp_path / "b.gguf", seed=2))
    assert a.vocab_fingerprint == b.vocab_fingerprint


def test_drafter_kinds(tmp_path):
    dspark = inspect_gguf(tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", block_size=7))
    dflash = inspect_gguf(tiny_gguf.write_dflash_drafter(tmp_path / "f.gguf"))
    legacy = inspect_gguf(tiny_gguf.write_dspark_drafter(tmp_path / "l.gguf", legacy=True, block_size=4))
    assert dspark.drafter.kind == "dspark" and dspark.drafter.block_size == 7
    assert dflash.drafter.kind == "dflash"
    assert legacy.drafter.kind == "legacy-dspark" and legacy.drafter.block_size == 4


def test_matching_pair_has_no_problems(tmp_path):
    target = inspect_gguf(tiny_gguf.write_target(tmp_path / "t.gguf"))
    drafter = inspect_gguf(tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf"))
    assert check_pair(target, drafter) == []


def test_kv_bytes_per_token_for_context_sizing(demo_gguf):
    # gemma3 270M: 18 layers x 1 KV head x (256 + 256) x 2 bytes
    assert inspect_gguf(demo_gguf).kv_bytes_per_token() == 18 * 1 * 512 * 2
