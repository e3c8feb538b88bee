"""The self-test's checks (server/selftest.py runs them). Each takes the plan, a scratch folder
and the self-test log, and returns {"status": passed|failed|skipped, "detail": ..., ...}.

The tiny target is models/tiny_hybrid.py's "pure" qwen35 counter with an MTP layer: its answer
is last+1 whatever the context, so any other token is a wrong computation, never a near-tie
(shared/reference/hybrid-targets.md). Its layer matrices are Q4_0, a type both ggml's AMX
backend and the x86 repack take.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from bonsai_launch.llamacpp.builds import kernel_check, selftest_record
from bonsai_launch.models import tiny_dense, tiny_hybrid
from bonsai_launch.server import client
from bonsai_launch.server.lifecycle import Lifecycle
from bonsai_launch.server.process import ServerProcess, free_port

N_PREDICT = 48
VOCAB = 512
PROMPTS = (tiny_hybrid.counter_prompt(10, 16), tiny_hybrid.counter_prompt(300, 24))
GPU_TOLERANCE = 0.02  # tests/test_vulkan_lane.py's TOL: the largest next-token probability gap
N_PROBS = 8


def _target(tmp: Path, weight_type: str = "q4_0", mode: str = "pure") -> Path:
    path = tmp / f"hybrid-{mode}-{weight_type}.gguf"
    if not path.is_file():
        tiny_hybrid.write_hybrid_target(path, mode=mode, weight_type=weight_type, mtp=True, mtp_accept=0.5)
    return path


@contextmanager
def _serve(server: Path, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    port = free_port()
    argv = [str(server), "--host", "127.0.0.1", "--port", str(port), *args]
    with Lifecycle(argv, env=env, log_path=log_path, base_url=f"http://127.0.0.1:{port}") as life:
        life.start(120)
        assert life.server is not None
        yield life.server


def _complete(proc: ServerProcess, prompt: list[int], slot: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False}
    body |= {"return_tokens": True, **({"id_slot": slot} if slot is not None else {}), **extra}
    return client.post_json(proc.base_url, "/completion", body, timeout=120)


def _counter(prompt: list[int], n: int = N_PREDICT) -> list[int]:
    return [(prompt[-1] + 1 + i) % VOCAB for i in range(n)]


def _offload(plan) -> list[str]:
    return ["-ngl", "999"] if plan.backend != "cpu" else []


def kernels(plan, tmp: Path, log: IO[str]) -> dict[str, Any]:
    try:
        result = kernel_check.check_build(plan.key_dir, our_patches=plan.our_patches)
    except kernel_check.KernelCheckUnavailable as exc:
        return {"status": "failed", "detail": f"the kernel check could not be built: {exc}", "types": {}}
    log.write(result.output)
    bad = [t for t, ok in result.types.items() if not ok]
    detail = "every type matches the reference" if result.passed else f"wrong for {', '.join(bad) or 'the build'}"
    if result.failures:
        detail += f": {result.failures[0].removeprefix('FAIL: ')}"
    return {
        "status": "passed" if result.passed else "failed",
        "detail": detail,
        "types": result.types,
        "kernels": result.first_line,
    }


def hybrid_two_slots(plan, tmp: Path, log: IO[str]) -> dict[str, Any]:
    """2 slots, repacking on: one request at a time, then both at once; both must count."""
    target = _target(tmp)
    args = ["-m", str(target), "-c", "1024", "-np", "2", "-t", str(plan.threads), *_offload(plan)]
    with _serve(plan.server, args, tmp / "hybrid.log") as s:
        alone = [_complete(s, p)["tokens"] for p in PROMPTS]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda i: _complete(s, PROMPTS[i], slot=i)["tokens"], range(2)))
    log.write((tmp / "hybrid.log").read_text(errors="replace")[-4000:])
    (tmp / "plain.json").write_text(json.dumps(alone))
    if plan.fault == "hybrid":  # the harness switch: the second column computed wrongly, as on AMX
        together[1] = [(t + 7) % VOCAB for t in together[1]]
    if alone != [_counter(p) for p in PROMPTS]:
        return {"status": "failed", "detail": "one request at a time does not count (the pure target's only answer)"}
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        if a != b:
            at = next(k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
            return {"status": "failed", "detail": f"sequence {i + 1} of 2 concurrent differs from alone at token {at}"}
    return {"status": "passed", "detail": "2 concurrent sequences = 1 at a time"}


def _dense_pair(tmp: Path) -> tuple[Path, Path]:
    """A tiny qwen3 target whose greedy answer depends on the context, and a drafter of the same
    weights scaled 0.9: it agrees often, not always (accepted and rejected drafts)."""
    target = tiny_dense.write_target(tmp / "dense-target.gguf", seed=3, layer_scale=1.0)
    drafter = tiny_dense.write_target(tmp / "dense-drafter.gguf", seed=3, layer_scale=0.9)
    return target, drafter


# Seen 2026-12-03 on the Vulkan build with lavapipe (Mesa 25.0.7): draft-simple's first request
# never answered (drafter offloaded or not), while plain, draft-mtp and DSpark on the same build
# did. bonsai plans no draft-simple, so a GPU build's check leaves the dense pair out rather than
# fail on a mode it never serves; a DSpark dense pair (tests/support/tiny_gguf.py's drafter, not
# shipped yet) is the one to add there.
DENSE_ON_GPU = "not run on GPU builds (draft-simple hung on lavapipe; bonsai never plans it)"


def _dense_run(plan, tmp: Path, common: list[str]) -> tuple[list, list]:
    target, drafter = _dense_pair(tmp)
    with _serve(plan.server, ["-m", str(target), *common], tmp / "dense-plain.log") as s:
        plain = [_complete(s, p)["tokens"] for p in PROMPTS]
    simple = ["-m", str(target), "-md", str(drafter), *common, "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    with _serve(plan.server, simple, tmp / "dense-spec.log") as s:
        return plain, [_complete(s, p) for p in PROMPTS]


def speculative(plan, tmp: Path, log: IO[str]) -> dict[str, Any]:
    """Lossless against plain, both pairs: draft-mtp on the hybrid target (half its drafts wrong:
    rollbacks of the recurrent state mid-block) and, on CPU builds, draft-simple on a dense pair."""
    hybrid = _target(tmp)
    common = ["-c", "1024", "-np", "1", "-t", str(plan.threads), *_offload(plan)]
    plain_file = tmp / "plain.json"
    if plain_file.is_file():
        hybrid_plain = json.loads(plain_file.read_text())
    else:
        with _serve(plan.server, ["-m", str(hybrid), *common], tmp / "plain.log") as s:
            hybrid_plain = [_complete(s, p)["tokens"] for p in PROMPTS]
    mtp = ["-m", str(hybrid), *common, "--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    with _serve(plan.server, mtp, tmp / "spec.log") as s:
        hybrid_spec = [_complete(s, p) for p in PROMPTS]
    pairs: list[tuple[str, list, list]] = [("hybrid draft-mtp", hybrid_plain, hybrid_spec)]
    if plan.backend == "cpu":
        pairs.append(("dense draft-simple", *_dense_run(plan, tmp, common)))
    for name in ("spec.log", "dense-spec.log"):
        if (tmp / name).is_file():
            log.write((tmp / name).read_text(errors="replace")[-3000:])
    out: dict[str, Any] = {} if plan.backend == "cpu" else {"dense draft-simple": DENSE_ON_GPU}
    for label, plain, answers in pairs:
        drafted = sum(int(a.get("timings", {}).get("draft_n") or 0) for a in answers)
        accepted = sum(int(a.get("timings", {}).get("draft_n_accepted") or 0) for a in answers)
        tokens = [a["tokens"] for a in answers]
        if plan.fault == "speculative":  # the harness switch: a speculative answer computed wrongly
            tokens[0] = [(t + 3) % VOCAB for t in tokens[0]]
        out[label] = f"{accepted}/{drafted} accepted"
        if drafted == 0:
            return {**out, "status": "failed", "detail": f"{label} drafted nothing"}
        if tokens != plain:
            return {**out, "status": "failed", "detail": f"{label}: the speculative answer differs from plain"}
    detail = "; ".join(f"{k} = plain ({v})" for k, v in out.items() if v != DENSE_ON_GPU)
    return {**out, "status": "passed", "detail": detail}


def _steps(answer: dict[str, Any]) -> list[tuple[int, dict[int, float]]]:
    """(chosen token, {token: probability}) for each step of an /completion answer with n_probs."""
    return [
        (int(step["id"]), {int(t["id"]): math.exp(t["logprob"]) for t in step["top_logprobs"]})
        for step in answer["completion_probabilities"]
    ]


def gpu_offload(plan, tmp: Path, log: IO[str]) -> dict[str, Any]:
    """Fully offloaded vs the CPU build, as the Vulkan lane compares them: the next-token
    probabilities of the CPU build's top tokens within GPU_TOLERANCE at every step, and the same
    tokens (the counter target's margins are wide: no rounding can flip one)."""
    if plan.cpu_server is None:
        return {"status": "failed", "detail": "no CPU build to compare with (run `bonsai build --backend cpu`)"}
    target = _target(tmp, weight_type="f32", mode="counter")
    base = ["-m", str(target), "-c", "1024", "-np", "1", "-t", str(plan.threads)]
    kw = {"n_probs": N_PROBS, "n_predict": 16}
    with _serve(plan.cpu_server, [*base, "-ngl", "0"], tmp / "gpu-cpu.log") as s:
        want = [_steps(_complete(s, p, **kw)) for p in PROMPTS]
    with _serve(plan.server, [*base, "-ngl", "999", "-v"], tmp / "gpu.log") as s:  # -v: "offloaded N/N layers"
        got = [_steps(_complete(s, p, **kw)) for p in PROMPTS]
    text = (tmp / "gpu.log").read_text(errors="replace")
    log.write(text[-4000:])
    device = next((ln.split("using device", 1)[1].strip() for ln in text.splitlines() if "using device" in ln), "")
    offload = re.findall(r"offloaded (\d+)/(\d+) layers to GPU", text)
    if plan.fault == "gpu":  # the harness switch: the offloaded distribution moved
        got = [[(t, {k: p * 0.5 for k, p in probs.items()}) for t, probs in answer] for answer in got]
    worst = max(
        abs(g[1].get(tok, 0.0) - p)
        for w, gg in zip(want, got, strict=True)
        for r, g in zip(w, gg, strict=False)
        for tok, p in r[1].items()
    )
    same_tokens = [[t for t, _ in a] for a in want] == [[t for t, _ in a] for a in got]
    reference = "this build with -ngl 0" if plan.cpu_server == plan.server else str(plan.cpu_server)
    out: dict[str, Any] = {"device": device or plan.backend, "worst_gap": round(worst, 5), "reference": reference}
    if not offload and not device:  # no device at all: nothing to check, and nothing wrong with the build
        why = "no GPU device visible to this build (llama.cpp skips software devices such as llvmpipe;"
        why += " GGML_VK_VISIBLE_DEVICES=0 exposes one): the build runs on the CPU, the GPU check did not run"
        return {**out, "status": "skipped", "detail": why}
    if not offload or any(done != total for done, total in offload):
        seen = "/".join(offload[-1]) if offload else "none"
        return {**out, "status": "failed", "detail": f"not fully offloaded (layers offloaded: {seen})"}
    if worst > GPU_TOLERANCE:
        return {
            **out,
            "status": "failed",
            "detail": f"next-token probabilities {worst:.3f} from the CPU build's (> {GPU_TOLERANCE})",
        }
    if not same_tokens:
        return {**out, "status": "failed", "detail": "the offloaded answer's tokens differ from the CPU build's"}
    return {
        **out,
        "status": "passed",
        "detail": f"within {worst:.4f} of the CPU build (tolerance {GPU_TOLERANCE}), same tokens",
    }


RUNNERS = {
    selftest_record.KERNELS: kernels,
    selftest_record.HYBRID: hybrid_two_slots,
    "speculative": speculative,
    selftest_record.GPU: gpu_offload,
}
