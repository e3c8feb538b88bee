"""Two sequences in one batch on a hybrid target compute what one does (vendor/llama.cpp/patches/0004-*).

On AMX CPUs (Sapphire Rapids and later), with weights in an AMX type (F16, Q8_0, Q4_0) and
repacking on (llama-server's default), ggml's AMX backend computed qwen35's delta-net output
projection for the second sequence of a batch from memory past the weight: with 2 slots and 2
concurrent requests one answer was computed from the wrong weights. The "pure" counter target
answers last+1 whatever the context, so the tokens alone rarely show it: on the pin of 2026-12-06
the build without patch 0004 still counted right, and only the candidates behind the chosen
token changed (other top-3 tokens, logprobs off by 0.01 to whole units). So each answer is
compared with the one-slot run's top-3 candidates and their logprobs, which the fixed build
reproduces exactly. Skipped, with the reason, only where the CPU has no AMX.

On every other x86 machine the AMX code is compiled out of a native build, so a patch that broke
it would reach only AMX users. The second test compiles the patched AMX sources of the build
under test for Sapphire Rapids, with the build's own flags, on any x86 machine with a compiler
that knows that target.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import real_parts
import tiny_gguf
from bonsai_launch.models import tiny_hybrid

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


TOP = 3  # candidates compared per position
LOGPROB_TOLERANCE = 1e-3  # the fixed build matches exactly here; the bug moves them by 0.01 to units


def answer(server: tiny_gguf.TinyServer, prompt: list[int], slot: int | None = None) -> dict:
    """The tokens and, per position, the top candidates {id: logprob} (the wrong weights show
    there first)."""
    extra = {} if slot is None else {"id_slot": slot}
    out = server.completion(prompt, n_predict=N_PREDICT, cache_prompt=False, return_tokens=True, n_probs=TOP, **extra)
    candidates = [{c["id"]: c["logprob"] for c in p["top_logprobs"]} for p in out["completion_probabilities"]]
    return {"tokens": out["tokens"], "candidates": candidates}


def concurrent(server: tiny_gguf.TinyServer, prompts: list[list[int]]) -> list[dict]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda i: answer(server, prompts[i], slot=i), range(len(prompts))))


def differences(got: dict, want: dict) -> list[str]:
    """Where `got` leaves `want`: other tokens, other candidates, or logprobs past the tolerance."""
    if got["tokens"] != want["tokens"]:
        return [f"tokens {got['tokens'][:8]}... != {want['tokens'][:8]}..."]
    found = []
    for pos, (g, w) in enumerate(zip(got["candidates"], want["candidates"], strict=True)):
        if g.keys() != w.keys():
            found.append(f"position {pos}: candidates {sorted(g)} != {sorted(w)}")
        elif (worst := max(abs(g[k] - w[k]) for k in w)) > LOGPROB_TOLERANCE:
            found.append(f"position {pos}: a logprob moved by {worst:.4f}")
    return found


def counter_answer(prompt: list[int], n: int = N_PREDICT) -> list[int]:
    return [(prompt[-1] + 1 + i) % 512 for i in range(n)]


@pytest.mark.parametrize("weight_type", ["f16", "q8_0", "q4_0"])
def test_two_concurrent_sequences_match_one_slot_with_repacking_on(llama_server, tmp_path, weight_type):
    if not cpu_has_amx():
        pytest.skip("this CPU has no AMX (amx_int8/amx_tile not in /proc/cpuinfo): the AMX backend is not used")
    target = tiny_hybrid.write_hybrid_target(tmp_path / "h.gguf", weight_type=weight_type)
    # No --no-repack: the AMX buffer is what is tested. One thread: the wrong offset is the same
    # whatever the thread count (checked both ways), and two threads meet at a spinning barrier
    # after every op, so a machine busy elsewhere stretched this tiny hybrid's token from ~0.2 ms
    # to ~600 ms (CI timed out at 60 s a request; two CPU hogs reproduce it).
    base = ["-m", target, "-c", "1024", "-t", "1"]
    with tiny_gguf.serve(llama_server, [*base, "-np", "1"], tmp_path / "one.log") as s:
        one = [answer(s, p) for p in PROMPTS]
    assert [a["tokens"] for a in one] == [counter_answer(p) for p in PROMPTS], "one slot must count (the pure target)"
    # -lv 4: the loader's "<type> model buffer size" lines
    with tiny_gguf.serve(llama_server, [*base, "-np", "2", "-lv", "4"], tmp_path / "two.log") as s:
        log_head = s.log()
        rounds = [concurrent(s, PROMPTS) for _ in range(3)]
    assert "AMX model buffer size" in log_head, "the weights must be in the AMX buffer for this test to mean anything"
    for got in rounds:
        for i, (g, w) in enumerate(zip(got, one, strict=True)):
            found = differences(g, w)
            assert not found, (
                f"request {i} of 2 concurrent ones differs from one slot (the AMX batched-matmul bug): {found[:5]}"
            )


# A symbol each source defines only inside its `#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)`
# block: present in the object only if the AMX code was really compiled.
AMX_SYMBOLS = {"amx.cpp": "ggml_backend_amx_buffer_type", "mmq.cpp": "ggml_backend_amx_mul_mat"}


@pytest.mark.parametrize("source", sorted(AMX_SYMBOLS))
@pytest.mark.slow
def test_the_patched_amx_sources_compile_for_an_amx_cpu(llama_server, tmp_path, source):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"ggml's AMX code is x86 only; this machine is {platform.machine()}")
    work = llama_server.resolve().parent.parent / "work"
    commands = work / "compile_commands.json"
    if not commands.is_file():
        real_parts.missing(f"{commands} is missing (the build folder of {llama_server})", "run `bonsai build`")
    entry = next((e for e in json.loads(commands.read_text()) if e["file"].endswith(f"ggml-cpu/amx/{source}")), None)
    assert entry is not None, f"the build compiled no ggml-cpu/amx/{source}: the AMX sources moved?"
    argv = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    obj = tmp_path / (source + ".o")
    # the build's flags with this machine's -march replaced by an AMX CPU's, and -O0: whether the
    # code compiles does not depend on optimisation, and -O3 takes three times as long here
    argv = [a for a in argv if not a.startswith(("-march=", "-mtune=", "-mcpu=", "-O"))]
    out = argv.index("-o")
    argv[out + 1] = str(obj)
    argv[1:1] = ["-march=sapphirerapids", "-O0"]
    proc = subprocess.run(argv, cwd=entry["directory"], capture_output=True, text=True)
    if proc.returncode != 0 and "sapphirerapids" in proc.stderr and "bad value" in proc.stderr:
        pytest.skip(f"{argv[0]} does not know -march=sapphirerapids (GCC 11+, Clang 12+ do)")
    assert proc.returncode == 0, f"the patched {source} does not compile for an AMX CPU:\n{proc.stderr[-4000:]}"
    symbols = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    assert AMX_SYMBOLS[source] in symbols, f"{source} compiled without its AMX code (is the #if still the same?)"
