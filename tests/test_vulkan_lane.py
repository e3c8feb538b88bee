"""The `vulkan` lane: the real Vulkan build, fully offloaded (-ngl 999) to Mesa's lavapipe.

lavapipe is a real Vulkan implementation that runs on the CPU, so the offload path (weights and
KV cache in device memory, ggml-vulkan's shaders for our formats, a speculative verify on the
device) runs on machines without a GPU. Each test compares with the CPU build at temperature 0
and shows from the server's -v log that the layers went to the Vulkan device.

Run with `python -m pytest -q -m vulkan` after `bonsai build --backend vulkan` (Debian/Ubuntu:
`apt-get install libvulkan-dev glslc spirv-headers mesa-vulkan-drivers vulkan-tools`). A missing
Vulkan build or a missing lavapipe fails the lane, with the fix: it is never skipped.

Test-rig settings (tests only; bonsai never sets them for users, see test_gpu_backends.py):
- GGML_VK_VISIBLE_DEVICES=0: ggml-vulkan skips CPU-type devices unless told to use one;
- GGML_VK_DISABLE_FUSION=1: Mesa 22.3's lavapipe crashes in its worker thread with op fusion;
- the drafter stays on the CPU (-ngld 0): a drafter on lavapipe crashed in 4 of 12 runs;
- -fa off for the demo (Gemma 3): lavapipe crashed with flash attention (3 of 3).
lavapipe's speed is a software GPU's (~17x slower than the CPU backend): never a GPU figure.
"""

from __future__ import annotations

import math
import random
import re
import subprocess
from pathlib import Path

import pytest

import real_parts
import tiny_gguf
import tiny_hybrid

pytestmark = [pytest.mark.vulkan, pytest.mark.server]

RIG_ENV = {"GGML_VK_VISIBLE_DEVICES": "0", "GGML_VK_DISABLE_FUSION": "1"}
THREADS = ["-t", "1"]
N_PREDICT = 32
N_PROBS = 5
DEMO_TOKENS = 12  # lavapipe runs the demo at a few tokens a second
DEMO_TOL = 0.05  # Q4_K_M: the two builds round activations differently (measured gap in docs)
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


def offloaded(log: str) -> list[tuple[int, int]]:
    """(offloaded, total) of each model the server loaded, in load order (the target first)."""
    return [(int(a), int(b)) for a, b in re.findall(r"offloaded (\d+)/(\d+) layers to GPU", log)]


def assert_on_vulkan(log: str, label: str, *, drafter_on_cpu: bool = False) -> None:
    loads = offloaded(log)
    assert loads, f"{label}: the -v log has no 'offloaded N/N layers to GPU' line:\n{log[-3000:]}"
    done, total = loads[0]
    assert done == total > 0, f"{label}: the target offloaded {done}/{total} layers, not all"
    assert re.search(r"Vulkan0\b.*llvmpipe|llvmpipe.*Vulkan0", log), f"{label}: no Vulkan0 (llvmpipe) device in the log"
    assert "Vulkan0 KV buffer" in log, f"{label}: the KV cache is not on the Vulkan device"
    if drafter_on_cpu:
        assert len(loads) == 2 and loads[1][0] == 0, f"{label}: the drafter was to stay on the CPU: {loads}"


def _prompts(seed: int, n: int = 3, length: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(length)] for _ in range(n)]


def _serve_all(
    binary: Path, args: list, prompts: list, log: Path, env: dict | None = None, n_predict: int = N_PREDICT, **extra
) -> tuple[list[dict], str]:
    with tiny_gguf.serve(binary, [*map(str, args), *THREADS], log, env=env, timeout=180) as s:
        out = [s.completion(p, n_predict=n_predict, cache_prompt=False, return_tokens=True, **extra) for p in prompts]
        return out, s.log()


def _tokens(answers: list[dict]) -> list[list[int]]:
    return [a["tokens"] for a in answers]


def _draft_counts(answers: list[dict]) -> tuple[int, int]:
    t = [a.get("timings") or {} for a in answers]
    return sum(int(x.get("draft_n") or 0) for x in t), sum(int(x.get("draft_n_accepted") or 0) for x in t)


def _probs(step: dict) -> dict[int, float]:
    return {int(t["id"]): math.exp(t["logprob"]) for t in step["top_logprobs"]}


def assert_same_distributions(want: list[dict], got: list[dict], tol: float, label: str) -> float:
    """Each answer's next-token distributions (top N_PROBS, from n_probs) agree within `tol` at
    every step until the two answers part; they may part only at a near tie (the two tokens'
    probabilities within 2 tol), which rounding can flip. Exact tokens are asserted only for the
    wide-margin models (CONTRIBUTING.md, tests that depend on the CPU). Returns the largest gap."""
    worst = 0.0
    for n, (w, g) in enumerate(zip(want, got, strict=True)):
        steps_w, steps_g = w["completion_probabilities"], g["completion_probabilities"]
        assert len(steps_w) == len(steps_g) > 0, f"{label}: answer {n} has no probabilities"
        for i, (sw, sg) in enumerate(zip(steps_w, steps_g, strict=True)):
            pw, pg = _probs(sw), _probs(sg)
            for tok, p in pw.items():
                if p >= tol:
                    assert tok in pg, f"{label}: answer {n} step {i}: token {tok} ({p:.3f}) missing on Vulkan"
                    worst = max(worst, abs(pg[tok] - p))
                    assert abs(pg[tok] - p) < tol, f"{label}: answer {n} step {i}: token {tok} {p:.4f} vs {pg[tok]:.4f}"
            if sw["id"] != sg["id"]:
                tie = abs(pw[sw["id"]] - pw.get(sg["id"], 0.0))
                assert tie < 2 * tol, f"{label}: answer {n} parts at step {i} without a near tie ({tie:.3f})"
                break
    return worst


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
    tol: float = 0.02,
    rejections: bool = False,
) -> None:
    """Plain on both builds, the Vulkan one fully offloaded: the same next-token distributions
    (`exact`: the same tokens, for wide-margin models). With a drafter (kept on the CPU), DSpark
    on the Vulkan build drafts, accepts (and with `rejections`, also rejects) and answers token
    for token what the Vulkan build answers plain."""
    base = ["-m", target, "-c", "2048", "-np", "1", "-v"]
    want, _ = _serve_all(cpu, base, prompts, tmp / "cpu.log", n_probs=N_PROBS)
    assert all(len(t) == N_PREDICT for t in _tokens(want)), f"{label}: short answers on the CPU build"
    got, log = _serve_all(vulkan, [*base, "-ngl", "999"], prompts, tmp / "vulkan.log", env=RIG_ENV, n_probs=N_PROBS)
    assert_on_vulkan(log, f"{label}, plain")
    gap = assert_same_distributions(want, got, tol, label)
    print(f"{label}: largest probability gap to the CPU build {gap:.5f}")
    if exact:
        assert _tokens(got) == _tokens(want), f"{label}: plain on Vulkan differs from the CPU build"
    if drafter is None:
        return
    spec = [*base, "-ngl", "999", "-md", drafter, "-ngld", "0", "--spec-type", "draft-dspark"]
    drafts, log = _serve_all(vulkan, spec, prompts, tmp / "vulkan-spec.log", env=RIG_ENV)
    assert_on_vulkan(log, f"{label}, DSpark", drafter_on_cpu=True)
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


def _quantize(server: Path, src: Path, dst: Path, qtype: str) -> Path:
    quantize = server.resolve().parent / ("llama-quantize" + server.suffix)
    if not quantize.is_file():
        real_parts.missing(f"no llama-quantize beside {server}", BUILD_FIX)
    proc = subprocess.run([str(quantize), str(src), str(dst), qtype], capture_output=True, text=True, timeout=300)
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
    """The demo (Gemma 3 270M, Q4_K_M) for a few tokens, all layers on the device; -fa off on
    both builds (lavapipe crashes with flash attention; the CPU build then runs the same maths).
    A real model's words depend on the floating-point path: its distributions are compared."""
    base = ["-m", demo_gguf, "-c", "1024", "-np", "1", "-fa", "off", "-v"]
    prompts = ["The capital of France is", "def fibonacci(n):"]
    kw = {"n_predict": DEMO_TOKENS, "n_probs": N_PROBS}
    want, _ = _serve_all(llama_server, base, prompts, tmp_path / "cpu.log", **kw)
    vulkan = [*base, "-ngl", "999"]
    got, log = _serve_all(vulkan_server, vulkan, prompts, tmp_path / "vulkan.log", env=RIG_ENV, **kw)
    assert_on_vulkan(log, "demo")
    assert all(len(t) == DEMO_TOKENS for t in _tokens(got))
    gap = assert_same_distributions(want, got, DEMO_TOL, "demo")
    print(f"demo: largest probability gap to the CPU build {gap:.5f}")
