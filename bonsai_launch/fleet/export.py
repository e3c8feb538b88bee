"""`bonsai export`: a profile as a vLLM or SGLang command line (experimental).

vLLM and SGLang cannot load Bonsai's 1- and 2-bit GGUFs; they serve the "fat" checkpoints
PrismML publishes beside them (a lossless AWQ INT4 repack, or unpacked FP16/BF16 safetensors),
with safetensors drafters that PrismML does not ship. This module only writes the command:
nothing here was run on a GPU, the drafter pairings are unverified, and most of the 1-bit
memory win is gone. Facts: shared/reference/scale-out.md, sections 1 and 2.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from bonsai_launch.core.errors import BonsaiError

ENGINES = ("vllm", "sglang")

# The flag names the engines document (vLLM docs/features/speculative_decoding/README.md,
# SGLang docs/advanced_features/speculative_decoding.md); tests hold the output to these.
VLLM_FLAGS = ("--host", "--port", "--max-model-len", "--speculative-config")
VLLM_SPEC_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "max_model_len",
    "parallel_drafting",
    "rejection_sample_method",
)
VLLM_METHODS = ("draft_model", "ngram", "ngram_gpu", "suffix", "mtp", "eagle", "eagle3", "dflash", "dspark")
SGLANG_FLAGS = (
    "--model-path",
    "--host",
    "--port",
    "--context-length",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")


@dataclass(frozen=True)
class Drafter:
    repo: str
    method: str  # vLLM method name: "dspark" or "dflash"
    block_size: int
    note: str


@dataclass(frozen=True)
class Checkpoint:
    """What a stock engine can load for one profile."""

    repo: str
    kind: str  # "AWQ INT4" or "unpacked FP16/BF16"
    weights_gb: float
    weights_source: str  # "reported" (a card says so) or "estimated" (parameters x bytes)
    gguf_gb: float  # the profile's GGUF weights, for the memory comparison
    drafter: Drafter | None


_DSPARK_8B = Drafter(
    "deepseek-ai/dspark_qwen3_8b_block7", "dspark", 7, "DeepSeek's Qwen3-8B DSpark drafter; untested with Bonsai"
)
_DSPARK_4B = Drafter(
    "deepseek-ai/dspark_qwen3_4b_block7", "dspark", 7, "DeepSeek's Qwen3-4B DSpark drafter; untested with Bonsai"
)
_DSPARK_T27 = Drafter(
    "Rahim/Ternary-Bonsai-27B-dspark",
    "dspark",
    4,
    "community safetensors repack of PrismML's GGUF drafter (DeepSpec layout)",
)

# Sizes: unpacked 8B 16.4 GB and 27B 54 GB and the 27B AWQ 14-18 GB are reported on the cards;
# the others are parameters x bytes per weight. GGUF sizes: the Hub file sizes of the 1-bit
# models and the Ternary 27B (shared/reference/hub-file-names.md), estimated for the other ternary ones.
CHECKPOINTS: dict[str, Checkpoint] = {
    "bonsai-8b": Checkpoint("prism-ml/Bonsai-8B-AWQ-4-bit", "AWQ INT4", 6.5, "estimated", 1.16, _DSPARK_8B),
    "bonsai-4b": Checkpoint("prism-ml/Bonsai-4B-unpacked", "unpacked FP16", 8.0, "estimated", 0.57, _DSPARK_4B),
    "bonsai-1.7b": Checkpoint("prism-ml/Bonsai-1.7B-unpacked", "unpacked FP16", 4.0, "estimated", 0.25, None),
    "ternary-8b": Checkpoint("prism-ml/Ternary-Bonsai-8B-unpacked", "unpacked FP16", 16.4, "reported", 2.2, _DSPARK_8B),
    "ternary-4b": Checkpoint("prism-ml/Ternary-Bonsai-4B-unpacked", "unpacked FP16", 8.0, "estimated", 1.1, _DSPARK_4B),
    "ternary-1.7b": Checkpoint("prism-ml/Ternary-Bonsai-1.7B-unpacked", "unpacked FP16", 4.0, "estimated", 0.5, None),
    "bonsai-27b": Checkpoint("prism-ml/Bonsai-27B-AWQ-4bit", "AWQ INT4", 16.0, "reported", 3.8, None),
    "ternary-27b": Checkpoint("prism-ml/Ternary-Bonsai-27B-AWQ-4bit", "AWQ INT4", 16.0, "reported", 7.6, _DSPARK_T27),
}
UNPACKED_27B = {"bonsai-27b": "prism-ml/Bonsai-27B-unpacked", "ternary-27b": "prism-ml/Ternary-Bonsai-27B-unpacked"}
WARNING = (
    "experimental: generated, never run here; needs a datacenter-class GPU; "
    "the drafter pairing is unverified; `bonsai fleet` (llama-server replicas) keeps the GGUF's memory advantage"
)


@dataclass(frozen=True)
class Export:
    engine: str
    profile: str
    checkpoint: Checkpoint
    argv: tuple[str, ...]
    speculative: bool
    notes: tuple[str, ...]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    @property
    def memory(self) -> str:
        c = self.checkpoint
        ratio = c.weights_gb / c.gguf_gb
        return (
            f"weights about {c.weights_gb:g} GB ({c.kind}, {c.weights_source}) against {c.gguf_gb:g} GB "
            f"for the GGUF: {ratio:.0f}x the memory, before KV cache"
        )

    def to_json(self) -> dict:
        c = self.checkpoint
        return {
            "engine": self.engine,
            "profile": self.profile,
            "experimental": True,
            "command": self.command,
            "argv": list(self.argv),
            "checkpoint": c.repo,
            "checkpoint_kind": c.kind,
            "weights_gb": c.weights_gb,
            "weights_source": c.weights_source,
            "gguf_gb": c.gguf_gb,
            "memory": self.memory,
            "speculative": self.speculative,
            "drafter": c.drafter.repo if (self.speculative and c.drafter) else None,
            "warning": WARNING,
            "notes": list(self.notes),
        }


def checkpoint_for(profile: str) -> Checkpoint:
    try:
        return CHECKPOINTS[profile]
    except KeyError:
        known = ", ".join(sorted(CHECKPOINTS))
        why = (
            "Bonsai 2 has no stock-engine checkpoint (see the community vLLM plugins in docs/serving-a-team.md)"
            if profile.startswith("bonsai2")
            else f"profile {profile!r} has no vLLM/SGLang checkpoint"
        )
        raise BonsaiError(f"--profile={profile!r}: {why}", f"export one of: {known}") from None


def build_export(
    engine: str,
    profile: str,
    *,
    speculative: bool,
    unpacked: bool = False,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int | None = None,
) -> Export:
    """The engine's command line for a profile. Pure: reads nothing, runs nothing."""
    if engine not in ENGINES:
        raise BonsaiError(f"--engine={engine!r} is not known", f"allowed: {', '.join(ENGINES)}")
    ckpt = checkpoint_for(profile)
    if unpacked and profile in UNPACKED_27B:
        ckpt = Checkpoint(UNPACKED_27B[profile], "unpacked BF16", 54.0, "reported", ckpt.gguf_gb, ckpt.drafter)
    notes: list[str] = []
    drafter = ckpt.drafter if speculative else None
    if speculative and ckpt.drafter is None:
        raise BonsaiError(
            f"--speculative: no safetensors drafter is known for profile {profile!r}",
            "export without --speculative (PrismML ships its drafters as GGUF only)",
        )
    if drafter is not None:
        notes.append(f"drafter {drafter.repo}: {drafter.note}")
    if engine == "vllm":
        argv = ["vllm", "serve", ckpt.repo, "--host", host, "--port", str(port)]
        if max_model_len:
            argv += ["--max-model-len", str(max_model_len)]
        if drafter is not None:
            # DSpark rejects fewer speculative tokens than the checkpoint's block size (vLLM PR #47419).
            config = {"method": drafter.method, "model": drafter.repo, "num_speculative_tokens": drafter.block_size}
            argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    else:
        argv = ["python", "-m", "sglang.launch_server", "--model-path", ckpt.repo, "--host", host, "--port", str(port)]
        if max_model_len:
            argv += ["--context-length", str(max_model_len)]
        if drafter is not None:
            argv += ["--speculative-algorithm", drafter.method.upper(), "--speculative-draft-model-path", drafter.repo]
            if drafter.method == "dflash":
                argv += ["--speculative-num-draft-tokens", str(drafter.block_size)]  # the block size for DFLASH
    if not is_loopback_host(host):
        notes.append("a non-loopback host: put an API key or a proxy in front")
    return Export(engine, profile, ckpt, tuple(argv), drafter is not None, tuple(notes))


def is_loopback_host(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")
