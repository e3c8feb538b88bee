"""Two sequences in one batch on a hybrid target compute what one does (vendor/llama.cpp/patches/0004-*).

On AMX CPUs (Sapphire Rapids and later), with weights in an AMX type (F16, Q8_0, Q4_0) and
repacking on (llama-server's default), ggml's AMX backend computed qwen35's delta-net output
projection for the second sequence of a batch from memory past the weight: with 2 slots and 2
concurrent requests one answer was garbage. The "pure" counter target makes that visible: its
answer is last+1 whatever the context, so any other token is a wrong computation. The same run
on one slot is the reference. Skipped, with the reason, only where the CPU has no AMX.

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
