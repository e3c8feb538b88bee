"""What one perf sample of llama-server's main thread was doing (benchmarks/cycle_split.py).

A sample is its period (nanoseconds of CPU time) and its stack (leaf first) of (symbol, dso).
`classify` sums the periods into the ROWS below: first the phase, from the callers, then, inside
a graph, the op, from the kernel's name. Names are those of llama.cpp b11434 with bonsai's
patches (the repack kernels of patch 0011 are `rows16_*<(ggml_type)41|42>`: Q1_0, Q2_0).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

Frame = tuple[str, str]  # (symbol, dso)
Sample = tuple[int, list[Frame]]

ROWS = (
    "draft: drafter layers (matmuls)",
    "draft: Markov head (Q4_0 gemv per position)",
    "draft: LM head (target's head)",
    "draft: top-k/argmax over the vocabulary",
    "draft: other ops and barrier waits",
    "draft: sampling on the CPU",
    "draft: graph setup and outputs",
    "drafter reads the verified tokens (process)",
    "verify/step: matmuls (layers + LM head)",
    "verify/step: delta-net recurrence (ssm_conv, gated_delta_net)",
    "verify/step: Hadamard transforms of the fold (fwht)",
    "verify/step: attention, norms, other ops",
    "verify/step: state copies (cpy, set_rows)",
    "verify/step: barrier waits",
    "verify/step: graph setup and outputs",
    "target sampling (CPU)",
    "rollback and checkpoints",
    "server bookkeeping",
)


def parse_perf_script(text: str) -> list[Sample]:
    """`perf script -F tid,period,ip,sym,dso` output -> samples."""
    samples: list[Sample] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace() or not line.startswith("\t"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                samples.append((int(parts[1]), []))
            continue
        if samples:
            body = line.strip().split(None, 1)
            rest = body[1] if len(body) > 1 else "[unknown]"
            sym, _, dso = rest.rpartition(" (")
            samples[-1][1].append((sym or rest, dso.rstrip(")")))
    return samples


def _has(frames: Iterable[Frame], *needles: str) -> bool:
    return any(n in sym for sym, _ in frames for n in needles)


def _graph_op(frames: list[Frame]) -> str | None:
    """The op a sample inside ggml_graph_compute ran; None when outside a graph's compute."""
    inside: list[Frame] = []
    for f in frames:
        if "ggml_graph_compute_thread" in f[0] or f[0].startswith("ggml_graph_compute"):
            break
        inside.append(f)
    else:
        return None
    if not inside or all("libgomp" in dso for _, dso in inside) or _has(inside, "ggml_barrier"):
        return "sync"
    low = " ".join(sym.lower() for sym, _ in inside)
    if "(ggml_type)41" in low or "(ggml_type)42" in low or "q1_0" in low or "q2_0" in low:
        return "target-type matmul"
    if "q4_0" in low:
        # upstream's 8x8 layout runs a 1-column batch (the Markov head, per position) as a gemv;
        # patch 0020's tiles have one kernel for any batch, so there it counts with the layers
        return "q4_0 gemv" if "gemv" in low else "drafter matmul"
    if "amx" in low or "q8_0" in low or "mul_mat" in low or "gemm" in low or "gemv" in low or "vec_dot" in low:
        return "drafter matmul"
    if "top_k" in low or "argmax" in low:
        return "top-k"
    if "cpy" in low or "dup" in low or "set_rows" in low:
        return "copy"
    if "gated_delta" in low or "ssm_conv" in low:
        return "delta-net"
    if "fwht" in low or "hadamard" in low:
        return "fwht"
    return "other"


DRAFT_OPS = {
    "target-type matmul": "draft: LM head (target's head)",
    "q4_0 gemv": "draft: Markov head (Q4_0 gemv per position)",
    "drafter matmul": "draft: drafter layers (matmuls)",
    "top-k": "draft: top-k/argmax over the vocabulary",
}
TARGET_OPS = {
    "target-type matmul": "verify/step: matmuls (layers + LM head)",
    "drafter matmul": "verify/step: matmuls (layers + LM head)",
    "q4_0 gemv": "verify/step: matmuls (layers + LM head)",
    "copy": "verify/step: state copies (cpy, set_rows)",
    "sync": "verify/step: barrier waits",
    "delta-net": "verify/step: delta-net recurrence (ssm_conv, gated_delta_net)",
    "fwht": "verify/step: Hadamard transforms of the fold (fwht)",
}


def row(frames: list[Frame]) -> str:
    if _has(frames, "common_speculative_draft"):
        if _has(frames, "common_sampler_", "llama_sampler_"):
            return "draft: sampling on the CPU"
        op = _graph_op(frames)
        if op is None:
            return "draft: graph setup and outputs"
        return DRAFT_OPS.get(op, "draft: other ops and barrier waits")
    if _has(frames, "common_speculative_process", "common_speculative_accept"):
        return "drafter reads the verified tokens (process)"
    if _has(frames, "common_sampler_", "llama_sampler_"):
        return "target sampling (CPU)"
    if _has(frames, "seq_rm", "llama_state_seq", "state_read", "state_write", "checkpoint", "update_tgt", "load_dft"):
        return "rollback and checkpoints"
    if _has(frames, "server_context_impl::decode"):
        op = _graph_op(frames)
        if op is None:
            return "verify/step: graph setup and outputs"
        return TARGET_OPS.get(op, "verify/step: attention, norms, other ops")
    return "server bookkeeping"


def classify(samples: list[Sample]) -> dict[str, int]:
    """{row: nanoseconds of main-thread CPU time}"""
    out: Counter[str] = Counter()
    for period, frames in samples:
        out[row(frames)] += period
    return dict(out)


def leaves(samples: list[Sample], top: int = 5) -> dict[str, list[tuple[str, int]]]:
    """{row: its `top` leaf functions (outside the kernel) with their nanoseconds}: what a row
    holds, for reading the split (and checking the rules on another build)."""
    per: dict[str, Counter[str]] = {}
    for period, frames in samples:
        leaf = next((sym for sym, dso in frames if "kernel" not in dso), frames[0][0] if frames else "?")
        per.setdefault(row(frames), Counter())[leaf[:100]] += period
    return {r: c.most_common(top) for r, c in per.items()}
