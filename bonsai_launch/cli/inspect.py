"""`bonsai inspect FILE.gguf`: what a GGUF declares, read from its header only.

Examples:
    bonsai inspect models/demo/gemma-3-270m-q4_k_m.gguf
    bonsai inspect drafter.gguf --target target.gguf     # also check the pair
    bonsai inspect model.gguf --json
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt


def command(
    file: Annotated[str, typer.Argument(help="A .gguf file.")],
    target: Annotated[
        str | None, typer.Option("--target", help="Check FILE as a drafter for this target GGUF.")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Show architecture, sizes, vocabulary fingerprint and drafter details of a GGUF file."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.models.gguf import check_pair, inspect_gguf
    from bonsai_launch.models.mtp import describe as mtp_describe
    from bonsai_launch.models.mtp import mtp_pair_problems, mtp_problems
    from bonsai_launch.server.model_codec import check_for_default_build, default_path, needs_text

    info = inspect_gguf(file)
    # an MTP file (no DSpark/DFlash drafter) is checked as draft-mtp would use it
    pair_check = mtp_pair_problems if info.drafter is None and info.nextn_layers else check_pair
    problems = pair_check(inspect_gguf(target), info) if target else []
    from bonsai_launch.models.drafters.provenance import read_provenance

    conversion = read_provenance(file) if info.architecture == "dflash" else None  # bonsai convert-drafter's record
    weights = default_path(info) if info.tensor_count else None  # on the build `start` would run
    if json_output:
        data = info.to_json()
        data["conversion"] = conversion.to_json() if conversion else None
        data["mtp_problems"] = mtp_problems(info) if info.nextn_layers else []
        data["needs"] = needs_text(info)
        data["weights"] = weights.to_json() if weights else None
        if target:
            data["pair_problems"] = problems
        emit_json(data)
    else:
        from rich.table import Table

        table = Table(show_header=False, box=None)
        rows = [
            ("file", f"{info.path} ({info.file_size:,} bytes)"),
            ("architecture", info.architecture),
            ("name", info.name or "-"),
            ("layers", _layers_row(info)),
            ("MTP layers", mtp_describe(info)),
            ("embedding size", info.embedding),
            ("context length", info.context_length),
            ("vocabulary", f"{info.vocab_size} tokens, fingerprint {info.vocab_fingerprint}"),
            ("tokenizer", info.tokenizer_model or "-"),
            ("chat template", "present" if info.has_chat_template else "absent"),
            ("tensors", f"{info.tensor_count}: " + ", ".join(f"{k} x{v}" for k, v in info.tensor_types.items())),
            ("weight codec", _codec_row(info)),
            ("Hadamard-folded", _fold_row(info)),
        ]
        if needs := needs_text(info):
            rows.append(("needs", needs))
        if weights:
            rows.append(("served as", weights.describe()))
        if info.drafter:
            d = info.drafter
            rows += [
                (
                    "drafter kind",
                    d.kind + (" (needs the PrismML fork or a conversion)" if d.kind == "legacy-dspark" else ""),
                ),
                ("block size", d.block_size if d.block_size is not None else "MISSING"),
                ("target layers", ", ".join(map(str, d.target_layers)) or "-"),
                ("mask token id", d.mask_token_id),
                ("draft layers", d.draft_layers),
                ("confidence head", "yes" if d.has_confidence_head else "no"),
                ("log-SNR conditioning", _log_snr_row(d)),
            ]
        if conversion:
            rows.append(
                (
                    "converted from",
                    (
                        f"{conversion.source_name} (sha256 {conversion.source_sha256[:12]}…), "
                        f"converter {conversion.converter_version}, {conversion.quantization}, "
                        f"shared tensors {conversion.shared_tensors}"
                    ),
                )
            )
        for key, value in rows:
            table.add_row(key, str(value))
        out = console()
        out.print(table)
        if target:
            out.print("pair: " + ("fits" if not problems else "does not fit"))
            for p in problems:
                out.print(f"  - {p}")
    check_for_default_build(info)  # the file would answer gibberish on the build start runs
    if problems:
        raise BonsaiError(
            f"{info.path.name} does not fit {target}: {problems[0]}", "use the drafter made for this target"
        )


def _layers_row(info) -> str:
    if not info.nextn_layers:
        return str(info.layers)
    return f"{info.trunk_layers} (block_count {info.layers} minus {info.nextn_layers} MTP)"


def _log_snr_row(d) -> str:
    from bonsai_launch.models.gguf import LOG_SNR_TENSORS

    tensors = f"{len(d.log_snr_tensors)}/{len(LOG_SNR_TENSORS)} tensors"
    if d.log_snr:
        return f"yes (min {d.log_snr_min}, max {d.log_snr_max}; {tensors}; needs bonsai's patched llama.cpp)"
    return f"no (but {tensors} present)" if d.log_snr_tensors else "no"


def _codec_row(info) -> str:
    from bonsai_launch.models.bonsai2_file import codec_block, main_codec

    codec = main_codec(info.tensor_types) or "-"
    if info.q2_0_group128:
        return "Q2_0 type id with PrismML's old group-128 blocks (34 bytes per 128 weights): refused"
    block = codec_block(codec)
    return f"{codec}, blocks of {block} weights" if block else codec


def _fold_row(info) -> str:
    if not info.fold_version:
        return "no"
    grouped = ", value heads grouped" if info.fold_grouped else ""
    return f"yes (prism.hadamard.version {info.fold_version}, block {info.fold_block}{grouped})"
