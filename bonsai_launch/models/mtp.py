"""Multi-token prediction (MTP) layers: does a GGUF carry ones llama-server's draft-mtp can run?

Facts (llama.cpp b11434, src/models/qwen35.cpp and common/speculative.cpp; checked on our build
with the suite's tiny qwen35 target, tests/support/tiny_hybrid.py):
- A model declares its MTP blocks with `{arch}.nextn_predict_layers`; they are the LAST blocks
  (block_count counts them, the trunk does not run them). Each has nextn.eh_proj, nextn.enorm
  and nextn.hnorm (required); its embedding and head may be borrowed from the model.
- `--spec-type draft-mtp` loads them as the drafter (no drafter file needed). A file without
  MTP layers exits at start ("context type MTP requested but model doesn't contain MTP
  layers"); qwen35/qwen35moe run exactly one MTP block (graph_mtp asserts it: 2 aborts).
- A separate MTP-only file (the MTP block, the embedding and head, no trunk tensors) works as
  `-md FILE --spec-type draft-mtp`.
- The community runs Bonsai 2 with a grafted MTP layer at n-max 1 or 2; n-max above 2 was slower
  in two reports, and n-max 2 slower than 1 on one card (shared/reference/bonsai-news-2026-11.md).
"""

from __future__ import annotations

from bonsai_launch.models.gguf import GGUFInfo

# Architectures with an MTP graph in b11434 (src/models/*.cpp building LLM_GRAPH_TYPE_DECODER_MTP).
MTP_ARCHS = frozenset(
    {
        "bailingmoe3",
        "cohere2moe",
        "deepseek2",
        "deepseek32",
        "deepseek4",
        "glm-dsa",
        "glm4moe",
        "glm5-next",
        "hy_v3",
        "mimo2",
        "nemotron_h_moe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "qwen4exp",
        "step35",
    }
)
# Those whose MTP graph does not assert exactly one block (GGML_ASSERT(n_layer_nextn == 1)).
MULTI_BLOCK_ARCHS = frozenset({"glm5-next", "hy_v3", "mimo2", "step35"})
# The tensors every qwen35/qwen35moe MTP block needs (graph_mtp asserts them); other
# architectures name theirs in their own ways, so only these two are checked tensor by tensor.
CHECKED_TENSOR_ARCHS = frozenset({"qwen35", "qwen35moe"})
REQUIRED_TENSORS = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")
DEFAULT_N_MAX = 1  # the community's measured choice for Bonsai 2 (n-max 2 was slower on one card)
TUNE_N_MAX = (1, 2, 3)  # what `bonsai tune` measures: n-max must be measured, 1-3


def mtp_problems(info: GGUFInfo) -> list[str]:
    """Why llama-server's draft-mtp cannot run this file's MTP layers (empty when it can)."""
    name, arch, n = info.path.name, info.architecture, info.nextn_layers
    if n <= 0:
        return [f"{name} has no MTP layers ({arch}.nextn_predict_layers is absent)"]
    if arch not in MTP_ARCHS:
        return [f"{name} declares {n} MTP layer(s), but llama.cpp has no MTP graph for architecture {arch!r}"]
    problems = []
    if n > 1 and arch not in MULTI_BLOCK_ARCHS:
        problems.append(f"{name} declares {n} MTP layers; llama-server's draft-mtp runs exactly one on {arch}")
    trunk = info.trunk_layers or 0
    if arch in CHECKED_TENSOR_ARCHS:
        blocks = range(trunk, trunk + n)
        missing = [f"blk.{i}.{t}" for i in blocks for t in REQUIRED_TENSORS if f"blk.{i}.{t}" not in info.mtp_tensors]
        if missing:
            problems.append(f"{name} declares {n} MTP layer(s) but lacks {', '.join(missing)}")
    return problems


def has_usable_mtp(info: GGUFInfo) -> bool:
    return info.nextn_layers > 0 and not mtp_problems(info)


def mtp_pair_problems(target: GGUFInfo, mtp_file: GGUFInfo) -> list[str]:
    """Why a separate MTP file cannot draft for this target (`-md FILE --spec-type draft-mtp`)."""
    problems = mtp_problems(mtp_file)
    name, tname = mtp_file.path.name, target.path.name
    if mtp_file.architecture != target.architecture:
        problems.append(f"{name} is a {mtp_file.architecture} model but {tname} is {target.architecture}")
    if mtp_file.embedding != target.embedding:
        problems.append(f"{name} has embedding size {mtp_file.embedding} but {tname} has {target.embedding}")
    if mtp_file.trunk_layers != target.trunk_layers:
        problems.append(
            f"{name} is made for {mtp_file.trunk_layers} trunk layers but {tname} has {target.trunk_layers}"
        )
    if (mtp_file.vocab_size, mtp_file.vocab_fingerprint) != (target.vocab_size, target.vocab_fingerprint):
        problems.append(f"{name} and {tname} do not have the same vocabulary")
    return problems


def describe(info: GGUFInfo) -> str:
    """The `MTP layers` line of `bonsai inspect`."""
    if info.nextn_layers <= 0:
        return "0"
    problems = mtp_problems(info)
    if problems:
        return f"{info.nextn_layers} (not usable by draft-mtp: {problems[0]})"
    if not info.trunk_tensors:
        return f"{info.nextn_layers} (an MTP-only file: pass it as --drafter to the model it was made for)"
    return f"{info.nextn_layers} (usable by draft-mtp: BONSAI_SPECULATIVE=1 runs it when no drafter is given)"
