"""The `vulkan` lane: the real Vulkan build, fully offloaded (-ngl 999) to Mesa's lavapipe.

lavapipe is a real Vulkan implementation that runs on the CPU, so the offload path (weights and
KV cache in device memory, ggml-vulkan's shaders for our formats, a drafter and a speculative
verify on the device) runs on machines without a GPU. Each test shows from the server's -v log
that every layer went to the Vulkan device, and compares with the CPU build at temperature 0:
both approximate the F32 twin's answer (the same weights dequantized), and Vulkan must be at
least about as close to it; wide-margin models must also give the CPU build's tokens.

Run with `python -m pytest -q -m vulkan` after `bonsai build --backend vulkan` (Debian/Ubuntu:
`apt-get install libvulkan-dev glslc spirv-headers vulkan-tools`, and lavapipe from Mesa 25 or
newer: on Debian 12 `apt-get install -t bookworm-backports mesa-vulkan-drivers`). A missing
Vulkan build or lavapipe fails the lane, with the fix: it is never skipped.

The one test-rig setting (tests only; bonsai never sets it for users, see test_gpu_backends.py):
GGML_VK_VISIBLE_DEVICES=0, since ggml-vulkan skips CPU-type devices unless told to use one.
Mesa 22.3's lavapipe (Debian 12's own) also needed op fusion off and a drafter on the CPU, and
still segfaulted in its queue thread under a speculative verify; Mesa 25's needs neither.
lavapipe's speed is a software GPU's (~17x slower than the CPU backend): never a GPU figure.
"""

from __future__ import annotations

import math
import random
import re
import subprocess
from pathlib import Path

import pytest

import hadamard_fold
import real_parts
import tiny_gguf
from bonsai_launch.models import tiny_hybrid
from bonsai_launch.server import client

pytestmark = [pytest.mark.vulkan, pytest.mark.server]

RIG_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}
THREADS = ["-t", "1"]
N_PREDICT = 32
N_PROBS = 5
# lavapipe compiles each of ggml-vulkan's pipelines at its first use (minutes in all with a cold
# ~/.cache/mesa_shader_cache; seconds once cached), in the server's warm-up and first requests
REQUEST_TIMEOUT = 900
DEMO_TOKENS = 12  # lavapipe runs the demo at a few tokens a second
# How much further from the F32 twin's next-token probabilities the Vulkan build may be than the
# CPU build is (measured: Vulkan is the closer of the two, docs/benchmarks.md)
TOL = 0.02
LAVAPIPE_MIN = 25  # Mesa 22.3's lavapipe segfaults in its queue thread under a speculative verify
BUILD_FIX = "run `bonsai build --backend vulkan` (needs libvulkan-dev glslc spirv-headers)"


def _find_vulkan_build() -> tuple[Path | None, str | None]:
    """(llama-server of the Vulkan build, None), or (None, why not); looked up at import time,
    before each test points BONSAI_HOME at its own folder (as conftest does for the CPU build)."""
    from bonsai_launch.llamacpp.builds import find_installed

    try:
        path = find_installed("vulkan")
    except Exception as exc:  # an unreadable pin or manifest is the problem to report
        return None, f"no Vulkan build found ({exc})"
    if path is None:
        return None, "no Vulkan build is installed"
    return path, real_parts.stale_build_problem(path)


VULKAN_SERVER, VULKAN_PROBLEM = _find_vulkan_build()


@pytest.fixture
def vulkan_server() -> Path:
    if VULKAN_SERVER is None or VULKAN_PROBLEM is not None:
        pytest.fail(f"the vulkan lane needs the Vulkan build: {VULKAN_PROBLEM}: {BUILD_FIX}", pytrace=False)
    return VULKAN_SERVER


def lavapipe_mesa_major(devices) -> int:
    """The Mesa release of the lavapipe device among `devices` (from its driverInfo), 0 if none."""
    found = [re.match(r"Mesa (\d+)\.", d.driver) for d in devices if "llvmpipe" in d.name]
    return max((int(m.group(1)) for m in found if m), default=0)


def assert_on_vulkan(log: str, label: str, *, models: int = 1) -> None:
    """The server's -v log shows each of its `models` (the target, then a drafter) with every
    layer on lavapipe, and the KV cache there."""
    loads = tiny_gguf.offloaded_layers(log)
    assert len(loads) == models, (
        f"{label}: {models} model load(s) expected in the -v log, found {loads}:\n{log[-3000:]}"
    )
    for done, total in loads:
        assert done == total > 0, f"{label}: a model offloaded {done}/{total} layers, not all: {loads}"
    assert re.search(r"Vulkan0\b.*llvmpipe|llvmpipe.*Vulkan0", log), f"{label}: no Vulkan0 (llvmpipe) device in the log"
    assert "Vulkan0 KV buffer" in log, f"{label}: the KV cache is not on the Vulkan device"


def _prompts(seed: int, n: int = 3, length: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(length)] for _ in range(n)]


def _serve_all(
    binary: Path, args: list, prompts: list, log: Path, env: dict | None = None, n_predict: int = N_PREDICT, **extra
) -> tuple[list[dict], str]:
    with tiny_gguf.serve(
        binary, [*map(str, args), *THREADS], log, env=env, timeout=REQUEST_TIMEOUT, request_timeout=REQUEST_TIMEOUT
    ) as s:
        out = [s.completion(p, n_predict=n_predict, cache_prompt=False, return_tokens=True, **extra) for p in prompts]
        return out, s.log()


def _tokens(answers: list[dict]) -> list[list[int]]:
    return [a["tokens"] for a in answers]


def _draft_counts(answers: list[dict]) -> tuple[int, int]:
    counts = [client.acceptance(a.get("timings") or {}) for a in answers]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def _probs(step: dict) -> dict[int, float]:
    return {int(t["id"]): math.exp(t["logprob"]) for t in step["top_logprobs"]}


def compare_distributions(ref: list[dict], got: list[dict]) -> tuple[float, list[tuple[int, int, float]]]:
    """The largest gap between the next-token probabilities of `ref`'s top tokens (n_probs) and
    `got`'s, over every step until each pair of answers parts; and where they part: (answer,
    step, how far apart the two tokens were in `ref`: rounding can flip only a near tie)."""
    worst, parts = 0.0, []
    for n, (r, g) in enumerate(zip(ref, got, strict=True)):
        steps_r, steps_g = r["completion_probabilities"], g["completion_probabilities"]
        assert len(steps_r) == len(steps_g) > 0, f"answer {n} has no probabilities"
        for i, (sr, sg) in enumerate(zip(steps_r, steps_g, strict=True)):
            pr, pg = _probs(sr), _probs(sg)
            worst = max([worst, *(abs(pg.get(tok, 0.0) - p) for tok, p in pr.items())])
            if sr["id"] != sg["id"]:
                parts.append((n, i, abs(pr[sr["id"]] - pr.get(sg["id"], 0.0))))
                break
    return worst, parts


def assert_as_close_as_the_cpu_build(truth: list[dict], cpu: list[dict], vulkan: list[dict], label: str) -> None:
    """Both builds approximate the full-precision answer (`truth`: the F32 twin on the CPU build)
    with different arithmetic: the CPU kernels quantize activations to 8 bits, ggml-vulkan's
    shaders mostly do not. So Vulkan is judged by its distance to the truth, which must be at
    most the CPU build's plus TOL; it may part from the truth only at a near tie."""
    cpu_gap, _ = compare_distributions(truth, cpu)
    allowed = cpu_gap + TOL
    vulkan_gap, parts = compare_distributions(truth, vulkan)
    print(f"{label}: largest probability gap to the F32 twin: CPU build {cpu_gap:.4f}, Vulkan {vulkan_gap:.4f}")
    assert vulkan_gap < allowed, (
        f"{label}: Vulkan's next-token probabilities are {vulkan_gap:.4f} from the F32 twin's,"
        f" the CPU build's {cpu_gap:.4f} (allowed: {allowed:.4f})"
    )
    for n, i, tie in parts:
        assert tie < 2 * allowed, (
            f"{label}: answer {n} parts from the F32 twin's at step {i}, not a near tie ({tie:.3f})"
        )


def full_precision_twin(server: Path, target: Path, tmp: Path) -> Path:
    """The target's own weights dequantized to F32 (`llama-quantize --allow-requantize`)."""
    return _quantize(server, target, tmp / f"{target.stem}-f32-twin.gguf", "F32", "--allow-requantize")


def _check_target(
    cpu: Path,
    vulkan: Path,
    tmp: Path,
    target: Path,
    prompts: list,
    label: str,
    *,
    drafter: Path | None = None,
    exact: bool = False,
    rejections: bool = False,
    args: tuple = ("-c", "2048", "-np", "1", "-v"),
    n_predict: int = N_PREDICT,
) -> None:
    """Plain, fully offloaded: as close to the F32 twin's answer as the CPU build is (`exact`:
    also the CPU build's tokens, for wide-margin models). With a drafter, also offloaded,
    DSpark on the Vulkan build drafts, accepts (with `rejections`, also rejects) and answers
    token for token what the Vulkan build answers plain."""
    base = ["-m", target, *args]
    kw = {"n_probs": N_PROBS, "n_predict": n_predict}
    twin = full_precision_twin(cpu, target, tmp)
    truth, _ = _serve_all(cpu, ["-m", twin, *args], prompts, tmp / "cpu-twin.log", **kw)
    want, _ = _serve_all(cpu, base, prompts, tmp / "cpu.log", **kw)
    assert all(len(t) == n_predict for t in _tokens(want)), f"{label}: short answers on the CPU build"
    got, log = _serve_all(vulkan, [*base, "-ngl", "999"], prompts, tmp / "vulkan.log", env=RIG_ENV, **kw)
    assert_on_vulkan(log, f"{label}, plain")
    assert_as_close_as_the_cpu_build(truth, want, got, label)
    if exact:
        assert _tokens(got) == _tokens(want), f"{label}: plain on Vulkan differs from the CPU build"
    if drafter is None:
        return
    spec = [*base, "-ngl", "999", "-md", drafter, "-ngld", "999", "--spec-type", "draft-dspark"]
    drafts, log = _serve_all(vulkan, spec, prompts, tmp / "vulkan-spec.log", env=RIG_ENV, n_predict=n_predict)
    assert_on_vulkan(log, f"{label}, DSpark", models=2)
    drafted, accepted = _draft_counts(drafts)
    assert drafted > 0 and accepted > 0, f"{label}: DSpark not live on Vulkan ({accepted}/{drafted} accepted)"
    if rejections:
        assert accepted < drafted, f"{label}: every draft accepted, the rollback on the device untested"
    assert _tokens(drafts) == _tokens(got), f"{label}: DSpark on Vulkan differs from plain on Vulkan"


# -- the machine ---------------------------------------------------------------------------------


def test_lavapipe_is_here_and_auto_does_not_build_for_it():
    """The lane's device is lavapipe, a CPU implementation: `auto` must not pick Vulkan for it
    (what a user with Debian's Vulkan packages and no GPU gets), while the Vulkan build exists."""
    from bonsai_launch.core import hardware
    from bonsai_launch.llamacpp.builds import backend, toolchain

    seen = hardware.vulkan_devices()
    names = [f"{d.name} ({d.kind})" for d in seen.devices]
    if not any("llvmpipe" in d.name for d in seen.devices):
        pytest.fail(f"no lavapipe device ({seen.how}: {names}): apt-get install mesa-vulkan-drivers vulkan-tools")
    assert not seen.gpus, f"this lane is meant for a machine without a Vulkan GPU: {names}"
    mesa = lavapipe_mesa_major(seen.devices)
    assert mesa >= LAVAPIPE_MIN, (
        f"lavapipe is Mesa {mesa}; the lane needs Mesa {LAVAPIPE_MIN} or newer (22.3 segfaults under a"
        " speculative verify): on Debian 12, apt-get install -t bookworm-backports mesa-vulkan-drivers"
    )
    tools = toolchain.detect(versions=False)
    assert backend.vulkan_sdk_present(tools), f"no Vulkan SDK (glslc, headers): {BUILD_FIX}"
    chosen = backend.choose_backend("auto", hardware.detect(), tools)
    assert chosen.backend != "vulkan", chosen.reason


def test_the_build_compiled_the_layer_settings_guard(vulkan_server):
    """Patch 0007: the build's source compiles ggml-vulkan's VK_EXT_layer_settings block only
    where the headers define it; on headers without it (Debian 12) this build exists only so."""
    from bonsai_launch.llamacpp.builds.install import read_manifest

    manifest = read_manifest(vulkan_server.resolve().parent.parent) or {}
    source = Path((manifest.get("source") or {}).get("path") or "")
    code = source / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp"
    assert code.is_file(), f"the Vulkan build's source {code} is gone: {BUILD_FIX}"
    assert "0007-ggml-vulkan-without-layer-settings-headers.patch" in manifest["source"]["patches"]
    text = code.read_text()
    use = text.index("vk::LayerSettingEXT> settings")
    assert text.rfind("#if defined(VK_EXT_layer_settings)", 0, use) > text.rfind("#endif", 0, use)


def _answer(*steps: tuple[int, dict[int, float]]) -> dict:
    """An /completion answer with n_probs, from (chosen token, {token: probability}) steps."""
    return {
        "completion_probabilities": [
            {"id": tok, "top_logprobs": [{"id": t, "logprob": math.log(p)} for t, p in probs.items()]}
            for tok, probs in steps
        ]
    }


def test_the_comparison_fails_a_build_further_from_the_twin_than_the_cpu_build():
    # the yardstick itself: a Vulkan answer much further from the F32 twin than the CPU build's
    # fails, one about as close passes, and parting is allowed only at a near tie
    truth = [_answer((1, {1: 0.70, 2: 0.30}), (3, {3: 0.9, 4: 0.1}))]
    cpu = [_answer((1, {1: 0.64, 2: 0.36}), (3, {3: 0.9, 4: 0.1}))]
    assert_as_close_as_the_cpu_build(truth, cpu, [_answer((1, {1: 0.69, 2: 0.31}), (3, {3: 0.88, 4: 0.12}))], "close")
    with pytest.raises(AssertionError, match="from the F32 twin"):
        assert_as_close_as_the_cpu_build(truth, cpu, [_answer((1, {1: 0.55, 2: 0.45}), (3, {3: 0.9, 4: 0.1}))], "far")
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_as_close_as_the_cpu_build(truth, cpu, [_answer((1, {1: 0.69, 2: 0.31}), (4, {3: 0.9, 4: 0.1}))], "part")


# -- models --------------------------------------------------------------------------------------


def test_tiny_pair_with_dspark_matches_the_cpu_build(llama_server, vulkan_server, tiny_pair, tmp_path):
    # the suite's tiny pair: its answers win by a wide margin, so the tokens must be the CPU's
    prompts = ["hello world", "one two three four", _prompts(3)[0]]
    _check_target(
        llama_server,
        vulkan_server,
        tmp_path,
        tiny_pair["target"],
        prompts,
        "tiny pair",
        drafter=tiny_pair["drafter"],
        exact=True,
    )


def test_random_pair_with_rejected_drafts(llama_server, vulkan_server, tmp_path):
    # a random target (its answer depends on the prompt) and a random drafter it often rejects:
    # a verify on the device with rollbacks, lossless against plain on the same build
    target = tiny_gguf.write_target(tmp_path / "target.gguf", seed=5, layer_scale=1.0)
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "drafter.gguf", seed=7, block_size=4)
    _check_target(
        llama_server, vulkan_server, tmp_path, target, _prompts(5), "random pair", drafter=drafter, rejections=True
    )


def test_hybrid_target_matches_the_cpu_build(llama_server, vulkan_server, tiny_hybrid_pair, tmp_path):
    # qwen35: delta-net layers with a recurrent state and an attention layer, Q8_0 matrices; the
    # counter target's next token wins by a wide margin
    prompts = [tiny_hybrid.counter_prompt(start) for start in (10, 200, 480)]
    target, drafter = tiny_hybrid_pair["target"], tiny_hybrid_pair["drafter"]
    _check_target(llama_server, vulkan_server, tmp_path, target, prompts, "hybrid", drafter=drafter, exact=True)


def _quantize(server: Path, src: Path, dst: Path, qtype: str, *flags: str) -> Path:
    quantize = server.resolve().parent / ("llama-quantize" + server.suffix)
    if not quantize.is_file():
        real_parts.missing(f"no llama-quantize beside {server}", BUILD_FIX)
    argv = [str(quantize), *flags, str(src), str(dst), qtype]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dst


@pytest.mark.parametrize("qtype", ["Q1_0", "Q2_0"])
def test_bonsai_format_target_on_vulkan(llama_server, vulkan_server, tmp_path, qtype):
    # every matrix row is 128 or 256 long, so every layer takes the format (Q1_0 blocks are 128);
    # ggml-vulkan's own Q1_0/Q2_0 shaders against the CPU kernels (patches 0005/0006)
    dims = {"embedding": 128, "ff": 256, "heads": 4, "heads_kv": 2, "head_dim": 32}
    f32 = tiny_gguf.write_target(tmp_path / "target-f32.gguf", seed=5, layer_scale=1.0, **dims)
    target = _quantize(vulkan_server, f32, tmp_path / f"target-{qtype}.gguf", qtype)
    drafter = tiny_gguf.write_dspark_drafter(
        tmp_path / "drafter.gguf", seed=7, block_size=4, target_embedding=dims["embedding"]
    )
    _check_target(llama_server, vulkan_server, tmp_path, target, _prompts(23), qtype, drafter=drafter, rejections=True)


def test_demo_model_on_vulkan(llama_server, vulkan_server, demo_gguf, tmp_path):
    """The demo (Gemma 3 270M, Q4_K_M) for a few tokens, all 19 layers on the device. A real
    model's words depend on the floating-point path: its distributions are compared."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    args = ("-c", "1024", "-np", "1", "-v")
    _check_target(llama_server, vulkan_server, tmp_path, demo_gguf, prompts, "demo", args=args, n_predict=DEMO_TOKENS)


def test_folded_bonsai2_target_on_vulkan(llama_server, vulkan_server, tmp_path):
    """A Hadamard-folded qwen35 (patch 0010) in PQ2_0, served as bonsai serves it (repacked into
    Q2_0): the fold's transforms run on the device (a 1024-wide Hadamard matmul: ggml-vulkan's
    fast transform stops at 512) against its own F32 twin on the CPU build, which folds too."""
    from bonsai_launch.models import codec_repack
    from bonsai_launch.models import ternary_codecs as codecs

    # one sign width (1024) keeps lavapipe's time down; the value heads (8 over 4) still permute
    small = {"ff": 1024, "v_heads": 8, "heads": 8}
    pair = hadamard_fold.write_fold_pair(tmp_path / "fold", shape=small)
    pq2 = hadamard_fold.write_ternary(pair, tmp_path / "folded-PQ2_0.gguf", codecs.PQ2_0)
    target = codec_repack.rewrite(pq2, tmp_path / "folded-Q2_0.gguf", codec_repack.fork_to_q2_0)
    prompts = list(hadamard_fold.PROMPTS[:2])
    _check_target(llama_server, vulkan_server, tmp_path, target, prompts, "folded", n_predict=12)


@pytest.mark.parametrize("shape", ["SHAPE_4B", "SHAPE_9B"])
def test_bonsai2_4b_and_9b_widths_on_vulkan(llama_server, vulkan_server, tmp_path, shape):
    """The Bonsai 2 4B's widths (block 512: ggml-vulkan's fast transform; a tied LM head folded
    through token_embd; 16 key heads) and the 9B's (a 4096-wide residual, block 1024), each in
    PTQ1_0 as bonsai serves it on a GPU build: repacked into Q2_0 (models/codec_repack.py)."""
    from bonsai_launch.models import codec_repack
    from bonsai_launch.models import ternary_codecs as codecs

    pair = hadamard_fold.write_fold_pair(tmp_path / "fold", shape=getattr(hadamard_fold, shape))
    ptq1 = hadamard_fold.write_ternary(pair, tmp_path / "folded-PTQ1_0.gguf", codecs.PTQ1_0)
    target = codec_repack.rewrite(ptq1, tmp_path / "folded-Q2_0.gguf", codec_repack.fork_to_q2_0)
    prompts = list(hadamard_fold.PROMPTS[:2])
    _check_target(llama_server, vulkan_server, tmp_path, target, prompts, shape, n_predict=12)
