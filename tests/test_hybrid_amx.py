"""Two sequences in one batch on a hybrid target compute what one does (vendor/llama.cpp/patches/0004-*).

On AMX CPUs (Sapphire Rapids and later), with weights in an AMX type (F16, Q8_0, Q4_0) and
repacking on (llama-server's default), ggml's AMX backend computed qwen35's delta-net output
projection for the second sequence of a batch from memory past the weight: with 2 slots and 2
concurrent requests one answer was garbage. The "pure" counter target makes that visible: its
answer is last+1 whatever the context, so any other token is a wrong computation. The same run
on one slot is the reference. Skipped, with the reason, only where the CPU has no AMX.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tiny_gguf
import tiny_hybrid

pytestmark = pytest.mark.server

N_PREDICT = 96  # long enough that the two requests share batches
PROMPTS = [tiny_hybrid.counter_prompt(10, 16), tiny_hybrid.counter_prompt(300, 24)]


def cpu_has_amx() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "amx_int8" in flags and "amx_tile" in flags


def concurrent(server: tiny_gguf.TinyServer, prompts: list[list[int]]) -> list[list[int]]:
    def one(i: int) -> list[int]:
        out = server.completion(prompts[i], n_predict=N_PREDICT, cache_prompt=False, return_tokens=True, id_slot=i)
        return out["tokens"]

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, range(len(prompts))))


def counter_answer(prompt: list[int], n: int = N_PREDICT) -> list[int]:
    return [(prompt[-1] + 1 + i) % 512 for i in range(n)]


@pytest.mark.parametrize("weight_type", ["f16", "q8_0", "q4_0"])
def test_two_concurrent_sequences_match_one_slot_with_repacking_on(llama_server, tmp_path, weight_type):
    if not cpu_has_amx():
        pytest.skip("this CPU has no AMX (amx_int8/amx_tile not in /proc/cpuinfo): the AMX backend is not used")
    target = tiny_hybrid.write_hybrid_target(tmp_path / "h.gguf", weight_type=weight_type)
    base = ["-m", target, "-c", "1024", "-t", "2"]  # no --no-repack: the AMX buffer is what is tested
    with tiny_gguf.serve(llama_server, [*base, "-np", "1"], tmp_path / "one.log") as s:
        one = [s.completion(p, n_predict=N_PREDICT, cache_prompt=False, return_tokens=True)["tokens"] for p in PROMPTS]
    assert one == [counter_answer(p) for p in PROMPTS], "one slot must count (the pure target's only answer)"
    # -lv 4: the loader's "<type> model buffer size" lines
    with tiny_gguf.serve(llama_server, [*base, "-np", "2", "-lv", "4"], tmp_path / "two.log") as s:
        log_head = s.log()
        rounds = [concurrent(s, PROMPTS) for _ in range(3)]
    assert "AMX model buffer size" in log_head, "the weights must be in the AMX buffer for this test to mean anything"
    for got in rounds:
        assert got == one, "2 slots x 2 concurrent requests differ from one slot (the AMX batched-matmul bug)"
