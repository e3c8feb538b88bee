"""The weights' path (as the file is, or repacked to Q2_0) and the memory the plan sizes from it.

Pure for the decision and the plan (models/weight_path.py, server/plan/weights.py); a tiny PTQ1_0
file the suite writes for the header's bytes per type, `bonsai inspect` and the dry run; and the
build capability "serves PTQ1_0 on the CPU", read from the binary (false for every build to date).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import hadamard_fold
from bonsai_launch.config.settings import resolve
from bonsai_launch.core.hardware import GPU, Hardware
from bonsai_launch.llamacpp.binaries import serves_ptq1_0_on_cpu
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.llamacpp.flavours import FORK, MAINLINE, BuildKind
from bonsai_launch.models import ternary_codecs as codecs
from bonsai_launch.models import weight_path
from bonsai_launch.models.gguf import inspect_gguf
from bonsai_launch.server.model_codec import path_on
from bonsai_launch.server.plan import PlanInputs, build_plan
from cli_runner import run_cli
from start_helpers import bonsai, json_out
from test_plan import target

GB = 10**9
GIB = 2**30
MATRICES = 5_500_000_000  # a Bonsai 2 27B's matrices as PTQ1_0 (shared/reference/bonsai2-format.md)
OTHERS = 300_000_000  # norms, the embedding and the head, in other types


def _choose(types: dict[str, int], backend="cpu", fork=False, cap=False) -> weight_path.WeightPath:
    counts = dict.fromkeys(types, 1)
    return weight_path.choose(counts, types, backend, fork_build=fork, ptq1_0_cpu=cap)


@pytest.mark.parametrize(
    "types, backend, fork, cap, path",
    [
        ({"Q4_K": 1000, "F32": 10}, "cpu", False, False, weight_path.NATIVE),  # nothing of PrismML's
        ({"PTQ1_0": 28_000, "F32": 10}, "cpu", False, False, weight_path.REPACK_Q2_0),  # today's builds
        ({"PTQ1_0": 28_000, "F32": 10}, "cpu", False, True, weight_path.NATIVE),  # a build with the kernels
        ({"PTQ1_0": 28_000, "F32": 10}, "vulkan", False, True, weight_path.REPACK_Q2_0),  # no GPU kernels
        ({"PQ2_0": 34_000, "F32": 10}, "cpu", False, True, weight_path.REPACK_Q2_0),  # PQ2_0 always
        ({"PQ2_0": 34_000, "PTQ1_0": 28_000}, "cpu", False, True, weight_path.REPACK_Q2_0),  # one path per file
        ({"PTQ1_0": 28_000, "F32": 10}, "cuda", True, False, weight_path.NATIVE),  # the fork runs its own
    ],
)
def test_the_path_is_a_function_of_codec_backend_and_build(types, backend, fork, cap, path):
    assert _choose(types, backend, fork, cap).path == path


def test_the_bytes_held_are_the_served_codecs():
    # 1000 blocks of 128 weights: PTQ1_0 28 bytes each, Q2_0 2 x 18 = 36; PQ2_0 34 -> 36
    repack = _choose({"PTQ1_0": 28_000, "F32": 10})
    assert (repack.weight_bytes, repack.file_bytes, repack.served) == (36_010, 28_010, "Q2_0")
    assert _choose({"PQ2_0": 34_000}).weight_bytes == 36_000
    native = _choose({"PTQ1_0": 28_000, "F32": 10}, cap=True)
    assert native.weight_bytes == native.file_bytes == 28_010 and native.served == "PTQ1_0"
    assert "repacked to Q2_0 (no PTQ1_0 kernels in this build, lossless)" in repack.describe()


def bonsai2_27b(**kw):
    """A Bonsai 2 27B's header facts: qwen35, 64 layers, one in four with a KV cache."""
    info = target(size=MATRICES + OTHERS, **kw)
    return dataclasses.replace(
        info,
        tensor_types={"PTQ1_0": 400, "F32": 200, "Q8_0": 2},
        type_bytes={"PTQ1_0": MATRICES, "F32": 1_000_000, "Q8_0": OTHERS - 1_000_000},
        full_attention_interval=4,
        data_bytes=MATRICES + OTHERS,
    )


def plan_27b(caps: Capabilities, hw: Hardware, **env: str):
    info = bonsai2_27b()
    settings = resolve({}, env)
    path = path_on(info, BuildKind(MAINLINE), caps, hw)
    return build_plan(PlanInputs(settings, info, hw, "/bin/llama-server", capabilities=caps, weights=path))


EIGHT = Hardware("Linux", "x86_64", 4, 8, 8 * GIB)
NATIVE_CPU = Capabilities("llama-server", backend="cpu", ptq1_0_cpu=True)


def test_an_8_gb_machine_fits_the_27b_as_ptq1_0_and_not_as_the_repack():
    native = plan_27b(NATIVE_CPU, EIGHT)
    mem = native.memory
    assert mem["weights"]["path"] == "native" and mem["held_bytes"] == MATRICES + OTHERS and mem["fits"]
    assert native.ctx == 8192 and not any(w.startswith("memory:") for w in native.warnings)  # the 8 GB tier
    repack = plan_27b(dataclasses.replace(NATIVE_CPU, ptq1_0_cpu=False), EIGHT)
    assert repack.memory["weights"]["path"] == "repack to Q2_0" and not repack.memory["fits"]
    assert repack.memory["held_bytes"] == MATRICES // 28 * 36 + OTHERS  # 29% more
    assert repack.ctx == 2048 and any("leave too little of this machine's 8 GB RAM" in w for w in repack.warnings)
    assert any(w.startswith("memory: PTQ1_0 repacked to Q2_0") and "does NOT fit" in w for w in repack.warnings)


def test_the_context_is_capped_by_the_ram_the_weights_leave():
    # 9.3 GiB: the repack (7.4 GB) and the 2 GiB reserve leave room for about 6000 tokens of a
    # 27B's KV cache (64 KiB a token: 16 of 64 layers, 4 KV heads of 256, F16), below the tier's 8192
    hw = Hardware("Linux", "x86_64", 4, 8, int(9.3 * GIB))
    plan = plan_27b(Capabilities("llama-server", backend="cpu"), hw)
    room = hw.ram_bytes - plan.memory["held_bytes"] - 2 * GIB
    assert plan.ctx == room // (64 * 1024) // 1024 * 1024 == 6144 and plan.memory["fits"]
    why = next(r.why for r in plan.reasons if r.flag == "-c")
    assert why == "auto: limited by 9 GB RAM after the weights (7.4 GB) and a 2 GiB reserve"


def test_a_large_machine_keeps_its_ram_tier_and_the_gpu_limit_counts_the_repack():
    big = plan_27b(NATIVE_CPU, Hardware("Linux", "x86_64", 16, 32, 64 * GIB))
    assert big.ctx == 65536 and big.memory["fits"]
    gpu = Hardware("Linux", "x86_64", 8, 16, 64 * GIB, gpus=(GPU(0, "RTX 4060", 8 * GIB, int(7.9 * GIB)),))
    on_gpu = plan_27b(Capabilities("llama-server", backend="cuda", ptq1_0_cpu=True), gpu)
    assert on_gpu.memory["weights"]["path"] == "repack to Q2_0" and on_gpu.memory["where"] == "gpu"


def test_a_cpu_launch_reads_a_repacked_codec_once_instead_of_mapping_it():
    """The CPU backend copies PTQ1_0/Q1_0/Q2_0 matrices into its repack buffer; mapped, the file
    stayed resident beside the copy (a 27B: 9.5 GiB RSS for 4.7 GiB). --load-mode none reads it once."""
    loads = dataclasses.replace(NATIVE_CPU, flags=frozenset({"--load-mode"}))
    plan = plan_27b(loads, EIGHT)
    assert plan.argv[plan.argv.index("--load-mode") + 1] == "none"
    assert "repack buffer" in next(r.why for r in plan.reasons if r.flag == "--load-mode")
    assert "--load-mode" not in plan_27b(NATIVE_CPU, EIGHT).argv  # a build without the flag
    gpu = Hardware("Linux", "x86_64", 8, 16, 64 * GIB, gpus=(GPU(0, "RTX 4060", 8 * GIB, int(7.9 * GIB)),))
    on_gpu = plan_27b(dataclasses.replace(loads, backend="cuda"), gpu)
    assert "--load-mode" not in on_gpu.argv  # offloaded: the GPU holds the weights, the map is not kept
    plain = build_plan(PlanInputs(resolve({}, {}), target(), EIGHT, "/bin/llama-server", capabilities=loads))
    assert "--load-mode" not in plain.argv  # a file of other types keeps llama-server's default


@pytest.mark.parametrize(
    ("types", "reads_once"),
    [
        ({"Q4_K": 197, "Q6_K": 29, "F32": 113}, True),  # a Q4_K_M file: Q4_K and Q6_K tiles (0022, 0024)
        ({"Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9, "F32": 109}, True),  # the demo (0023)
        ({"Q5_K": 197, "Q6_K": 29, "F32": 113}, True),  # Q5_K_M (0025)
        ({"F16": 197, "F32": 113}, False),  # nothing the CPU backend copies on x86 without AMX
        ({"IQ4_XS": 197, "F32": 113}, False),
    ],
)
def test_users_own_repacked_types_are_read_once_too(types, reads_once):
    """Since patches 0020-0025 a Q4_K_M, Q5_K_M or Q5_0 file is copied into the repack buffer too:
    mapped, a 1.7B Q4_K_M held 2168 MiB of RSS, read once 1374 (docs/benchmarks.md)."""
    loads = dataclasses.replace(NATIVE_CPU, flags=frozenset({"--load-mode"}))
    path = weight_path.choose(types, dict.fromkeys(types, 1000), "cpu", fork_build=False, ptq1_0_cpu=False)
    plan = build_plan(
        PlanInputs(resolve({}, {}), target(), EIGHT, "/bin/llama-server", capabilities=loads, weights=path)
    )
    assert ("--load-mode" in plan.argv) == reads_once, plan.argv
    if reads_once:
        assert plan.argv[plan.argv.index("--load-mode") + 1] == "none"
        assert f"{path.served} weights are copied" in next(r.why for r in plan.reasons if r.flag == "--load-mode")


def test_a_hybrids_kv_cache_counts_its_attention_layers_only():
    plain = target()
    assert bonsai2_27b().kv_bytes_per_token() == plain.kv_bytes_per_token() // 4 == 16 * 4 * 512 * 2


def test_the_capability_is_read_from_the_binary(tmp_path):
    without = tmp_path / "a" / "llama-server"
    without.parent.mkdir()
    without.write_bytes(b"\x7fELF...\0q2_0\0q1_0\0ptq1_0_r8\0")
    assert not serves_ptq1_0_on_cpu(without)
    shared = tmp_path / "b" / "bin" / "llama-server"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"\x7fELF")
    (tmp_path / "b" / "lib").mkdir()
    (tmp_path / "b" / "lib" / "libggml-base.so").write_bytes(b"\0q2_0\0ptq1_0\0pq2_0\0")
    # the type alone (an ARM build, one without AVX2) runs on its scalar reference: repacked
    assert not serves_ptq1_0_on_cpu(shared)
    (tmp_path / "b" / "lib" / "libggml-cpu.so").write_bytes(b"%s: repack tensor %s with %s rows16\n\0")
    assert serves_ptq1_0_on_cpu(shared)  # a shared build: the type and the x86 kernels in libggml beside it


@pytest.fixture(scope="module")
def ptq1_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ptq1")
    pair = hadamard_fold.write_partial_fold(folder, ("ffn_down",), block=64, ff=1024)
    return hadamard_fold.write_ternary(pair, folder / "Tiny-PTQ1_0.gguf", codecs.PTQ1_0)


def test_the_header_gives_the_bytes_of_each_type_and_inspect_the_path(ptq1_file, capsys):
    info = inspect_gguf(ptq1_file)
    ternary = sum(n for t, n in info.tensor_types.items() if t == "PTQ1_0")
    assert ternary > 0 and info.type_bytes["PTQ1_0"] % 28 == 0
    assert sum(info.type_bytes.values()) <= info.data_bytes <= info.file_size
    code, out, _ = run_cli(capsys, "inspect", str(ptq1_file), "--json")
    import json

    weights = json.loads(out)["weights"]
    assert code == 0 and weights["path"] == "repack to Q2_0" and weights["codec"] == "PTQ1_0"
    assert weights["weight_bytes"] - weights["file_bytes"] == info.type_bytes["PTQ1_0"] * 8 // 28


def test_the_dry_run_says_the_path_and_whether_it_fits(ptq1_file, llama_server):
    """Our CPU build serves PTQ1_0 as it is (patch 0013): the plan holds the file's own bytes."""
    plan = json_out(bonsai(["start", "--model", ptq1_file, "--dry-run", "--json"], server=llama_server))
    weights = plan["memory"]["weights"]
    assert weights["path"] == "native" and weights["weight_bytes"] == weights["file_bytes"] and plan["memory"]["fits"]
    done = bonsai(["start", "--model", ptq1_file, "--dry-run"], server=llama_server)
    assert "# memory: PTQ1_0 as it is (this CPU build serves PTQ1_0 itself)" in done.stderr
    assert done.returncode == 0 and "fits in the" in done.stderr
    assert plan["argv"][plan["argv"].index("--load-mode") + 1] == "none"  # the real binary has the flag


def test_the_fork_build_kind_serves_its_own_types_as_they_are():
    info = bonsai2_27b()
    assert path_on(info, BuildKind(FORK, 10828, folds=True), None, EIGHT).path == weight_path.NATIVE
