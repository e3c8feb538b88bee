"""benchmarks/gpu_smoke.py's pure parts: it runs only where a real GPU is, so what can be checked
without one is checked here (parsing nvidia-smi and llama-bench, the synthetic target's layout
and bytes, the verify-cost arithmetic, the offload lines)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nvidia_smi_and_the_cuda_architectures(smoke):
    text = "NVIDIA H200, 9.0, 143771, 570.124.06\nNVIDIA GeForce RTX 5090, 12.0, 32607, 570.124.06\n\n"
    gpus = smoke.parse_nvidia_smi(text)
    assert gpus[0] == {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "driver": "570.124.06"}
    from bonsai_launch.llamacpp.builds.backend import cuda_archs_from_gpus

    assert cuda_archs_from_gpus([g["compute_capability"] for g in gpus]) == ["90", "120a"]
    assert smoke.parse_nvidia_smi("No devices were found\n") == []


def test_llama_bench_json_becomes_verify_cost(smoke):
    rows = [
        {"n_prompt": 1, "n_gen": 0, "avg_ts": 100.0},
        {"n_prompt": 5, "n_gen": 0, "avg_ts": 400.0},
        {"n_prompt": 8, "n_gen": 0, "avg_ts": 400.0},
        {"n_prompt": 0, "n_gen": 32, "avg_ts": 90.0},  # a generation test is not a batch
    ]
    pp = smoke.parse_llama_bench(json.dumps(rows))
    assert pp == {1: 100.0, 5: 400.0, 8: 400.0}
    cost = smoke.verify_cost(pp)
    assert cost == {
        "pp1_ms": 10.0,
        "pp5_ms": 12.5,
        "pp8_ms": 20.0,
        "pp5_over_pp1": 1.25,
        "pp8_over_pp1": 2.0,
    }


def test_offload_lines(smoke):
    log = (
        "load_tensors: offloaded 3/3 layers to GPU\n"
        "srv  load_model: loading draft model\n"
        "load_tensors: offloaded 1/2 layers to GPU\n"
    )
    lines = smoke.offloaded(log)
    assert lines == ["3/3 layers to GPU", "1/2 layers to GPU"]
    assert not smoke.fully_offloaded(lines) and smoke.fully_offloaded(lines[:1]) and not smoke.fully_offloaded([])


def test_the_synthetic_target_is_27b_shaped_and_readable(smoke, tmp_path):
    plan = smoke.tensor_plan("Q1_0", 64)
    weights = sum(int(np.prod(ne)) for _, ne, t in plan if t != "F32")
    assert 23e9 < weights < 25e9  # 64 layers of 5120/17408 plus two 248320-token matrices
    assert len(plan) == 3 + 64 * 11
    assert smoke.tensor_bytes((5120, 17408), "Q1_0") == 5120 * 17408 // 128 * 18
    assert smoke.tensor_bytes((5120, 17408), "Q2_0") == 5120 * 17408 // 64 * 18
    with pytest.raises(ValueError, match="not a whole number of Q1_0 blocks"):
        smoke.tensor_bytes((100, 4), "Q1_0")
    block = smoke.block_pattern("Q2_0", 3)
    assert len(block) == 54 and np.frombuffer(block[:2], dtype=np.float16)[0] == np.float16(0.01)

    small = dict(smoke.SHAPE_27B, vocab=1024)  # the layout at a size a test can write
    path = smoke.write_synthetic(tmp_path / "t.gguf", "Q1_0", 1, small)
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    expected = smoke.tensor_plan("Q1_0", 1, small)
    assert list(tensors) == [name for name, _, _ in expected]
    ffn = tensors["blk.0.ffn_up.weight"]
    assert ffn.tensor_type.name == "Q1_0" and list(ffn.shape) == [5120, 17408]
    assert int(ffn.n_bytes) == smoke.tensor_bytes((5120, 17408), "Q1_0")
    assert list(tensors["token_embd.weight"].shape) == [5120, 1024]
    assert np.all(np.asarray(tensors["blk.0.attn_norm.weight"].data) == 1.0)  # norms are real ones, not noise
    assert reader.fields["qwen3.block_count"].contents() == 1
