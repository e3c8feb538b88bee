"""Bonsai's weight formats (Q1_0, Q2_0) on the CPU kernels of the build we ship.

Patches 0005 (an x86 Q2_0 kernel), 0006 (Q1_0/Q2_0 two rows by two columns, odd batches paired
column by column), 0011 (Q1_0 and Q2_0 repacked sixteen rows at a time, every batch in one
pass over the weights), 0013 (PrismML's PTQ1_0 as a type, in the same tiles at 1.75 bits per
weight), 0018 (repacked Q1_0 against int8 activations with one scale per 128 weights), 0020
(Q4_0, the drafters' type, and Q8_0 in the same tiles), 0022 (Q4_K), 0023 (Q5_0), 0024 (Q6_K) and
0025 (Q5_K) change arithmetic that every Bonsai model on an x86 CPU runs through.
Two checks, both against the real build of the current pin and patch series:
- a small C program (bonsai_launch/llamacpp/builds/cpu_kernels_check.c, the self-test's) linked against that build's static ggml
  libraries compares the kernels and ggml_mul_mat at every batch size 1..9, 16, 17, 33 with a
  reference written from the block layouts, plain and from the repack buffer, and on x86 with
  AVX2 fails when the SIMD Q2_0 kernel, the 2x2 path or either repack is not wired in (so it
  fails without the patches);
- a greedy speculative run on a tiny target quantized to Q1_0, Q2_0, Q4_0, Q5_0, Q6_K and Q5_K_S (the
  K-quants in its 256-long rows; the 128-long ones fall back to Q8_0 and Q5_1) by the build's own
  llama-quantize stays token-identical to plain: with repacking (verify batches of 5 and 8 tokens
  through gemm and gemv, decode steps through gemv) and with --no-repack (the paired vec_dot
  kernels for the batches, the one-row ones for decoding).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import real_parts
import tiny_gguf
from bonsai_launch.llamacpp.builds import kernel_check

HERE = Path(__file__).parent
THREADS = ["-t", "1"]
N_PREDICT = 48


def _key_dir(server: Path) -> Path:
    return server.resolve().parent.parent  # <key>/bin/llama-server


def _build_check(server: Path, out: Path) -> Path:
    """The self-test's kernel check, compiled against the static ggml of `server`'s build."""
    try:
        return kernel_check.compile_check(kernel_check.link_parts(_key_dir(server)), out)
    except kernel_check.KernelCheckUnavailable as exc:
        real_parts.missing(f"{exc} (the build of {server})", "run `bonsai build` (it keeps work/) with a C++ compiler")
        raise AssertionError("unreachable") from exc


@pytest.mark.server
@pytest.mark.slow
def test_q1_0_q2_0_kernels_match_the_reference(llama_server, tmp_path):
    exe = _build_check(llama_server, tmp_path)
    result = kernel_check.run(exe, timeout=600, quick=False)  # the full run; the self-test's is `quick`
    assert result.passed, result.output[-4000:]
    assert result.types == dict.fromkeys(kernel_check.TYPES, True), result.output[-4000:]
    # the first line says which kernels ran: keep it in the log of a passing run too
    print(result.first_line)


def _quantize(server: Path, src: Path, dst: Path, qtype: str) -> Path:
    quantize = server.resolve().parent / ("llama-quantize" + server.suffix)
    if not quantize.is_file():
        real_parts.missing(f"no llama-quantize beside {server}", "run `bonsai build`")
    proc = subprocess.run([str(quantize), str(src), str(dst), qtype], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dst


def _prompts(seed: int, n: int = 3, length: int = 24) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(length)] for _ in range(n)]


@pytest.mark.server
@pytest.mark.parametrize(
    ("qtype", "repack"),
    [
        ("Q1_0", True),
        ("Q1_0", False),
        ("Q2_0", True),
        ("Q2_0", False),
        ("Q4_0", True),
        ("Q5_0", True),
        ("Q6_K", True),
        ("Q5_K_S", True),
    ],
    ids=["Q1_0", "Q1_0-no-repack", "Q2_0", "Q2_0-no-repack", "Q4_0", "Q5_0", "Q6_K", "Q5_K"],
)
@pytest.mark.slow
def test_speculative_on_a_bonsai_format_target_is_lossless(llama_server, tmp_path, qtype, repack):
    # every matrix row is 128 or 256 long, so every layer takes the format (Q1_0 blocks are 128)
    dims = {"embedding": 128, "ff": 256, "heads": 4, "heads_kv": 2, "head_dim": 32}
    f32 = tiny_gguf.write_target(tmp_path / "target-f32.gguf", seed=5, layer_scale=1.0, **dims)
    target = _quantize(llama_server, f32, tmp_path / f"target-{qtype}.gguf", qtype)
    prompts = _prompts(23)

    def run(args: list[str], log: str) -> list[dict]:
        with tiny_gguf.serve(
            llama_server,
            ["-m", target, "-c", "2048", "-np", "1", *THREADS, *([] if repack else ["--no-repack"]), *args],
            tmp_path / log,
        ) as s:
            return [s.completion(p, n_predict=N_PREDICT, cache_prompt=False, return_tokens=True) for p in prompts]

    plain = run([], "plain.log")
    assert len({tuple(r["tokens"]) for r in plain}) == len(plain), "outputs must depend on the prompt"
    for block in (4, 7):  # verify batches of 5 (odd: pairs and a lone column) and 8 tokens
        drafter = tiny_gguf.write_dspark_drafter(
            tmp_path / f"drafter{block}.gguf", seed=7, block_size=block, target_embedding=dims["embedding"]
        )
        spec = run(
            ["-md", drafter, "--spec-type", "draft-dspark", "--spec-draft-n-max", str(block)], f"spec{block}.log"
        )
        drafted = sum(int(r["timings"].get("draft_n") or 0) for r in spec)
        accepted = sum(int(r["timings"].get("draft_n_accepted") or 0) for r in spec)
        assert drafted > 0, f"{qtype}, block {block}: nothing was drafted"
        assert accepted < drafted, f"{qtype}, block {block}: every draft accepted, rejection path untested"
        for i, (p, s) in enumerate(zip(plain, spec, strict=True)):
            assert s["tokens"] == p["tokens"], f"{qtype}, DSpark block {block}: prompt {i} differs from plain"


def _ceiling_module():
    """benchmarks/speculation_ceiling.py imports its sibling cpu_kernels by name."""
    bench_dir = str(HERE.parent / "benchmarks")
    sys.path.insert(0, bench_dir)
    try:
        import speculation_ceiling
    finally:
        sys.path.remove(bench_dir)
    return speculation_ceiling


def test_the_ceiling_estimate_scales_with_tokens_per_verify_cycle():
    ceiling = _ceiling_module()
    assert ceiling.expected_tokens(1.0, 4) == 5  # every draft accepted, plus the verify's own token
    assert ceiling.expected_tokens(0.0, 4) == 1  # the first draft rejected: the verify's token only
    assert ceiling.expected_tokens(0.5, 4) == pytest.approx(1.9375)
    # DSpark drafts 4: 1.16x with perfect drafts pays only above ~93% acceptance; a ratio <= 1 never pays
    assert ceiling.break_even(1.157, 4) == pytest.approx(0.927, abs=0.002)
    assert ceiling.break_even(1.0, 4) is None
    assert ceiling.break_even(5.0, 4) == pytest.approx(0.0, abs=1e-6)
    # draft-mtp at n-max 2: 1.5x pays where 1 + a + a^2 = 2, at the golden ratio's 0.618
    assert ceiling.break_even(1.5, 2) == pytest.approx(0.618, abs=0.002)
