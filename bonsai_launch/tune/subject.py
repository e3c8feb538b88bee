"""What a tuning session measures and what it stores: the request (flags, files, binary), the
subject (model, drafter, build and server settings, whose identity keys the decision), the
candidates it allows, and the Decision made from a bench document."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.data import ConfigSpec
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.decisions.identity import (
    TuneKey,
    build_id,
    file_sha256,
    machine_id,
    prompts_sha256,
    server_conditions,
)
from bonsai_launch.decisions.store import Decision
from bonsai_launch.server.plan.weights import gpu_layers, head_on_cpu
from bonsai_launch.tune import candidates as cands
from bonsai_launch.tune.decide import RULE, decide


@dataclass(frozen=True)
class TuneRequest:
    """What to tune: the launch a user would make (settings flags, files, llama-server)."""

    flags: dict[str, Any]
    model: str | None = None
    drafter: str | None = None
    passthrough: tuple[str, ...] = ()
    binary: Path | None = None


@dataclass(frozen=True)
class Subject:
    """The model, drafter and binary being tuned, with the key their decision is stored under."""

    profile: str | None
    model: Path
    drafter: Path | None
    key: TuneKey
    candidates: tuple[cands.Candidate, ...]
    unusable: dict[str, str]  # candidates that cannot run here, with why


def tuned_model(request: TuneRequest) -> Path:
    """The model file a tuning request is for (the profile's or --model), present or not."""
    from bonsai_launch.server.inputs import model_files, select

    return model_files(select({**request.flags, "speculative": None}), request.model, request.drafter).model


def subject(
    request: TuneRequest,
    prompts: list[suite.Prompt],
    configs: tuple[str, ...] | None = None,
    replayable: bool = False,
) -> Subject:
    """Resolve the files and the candidates; hash what the decision's key needs."""
    from bonsai_launch.llamacpp.binaries import probe
    from bonsai_launch.models import draft_head
    from bonsai_launch.models.gguf import check_pair, inspect_gguf
    from bonsai_launch.models.mtp import has_usable_mtp, mtp_pair_problems
    from bonsai_launch.server.inputs import explicit_model, model_files, option_table, select
    from bonsai_launch.server.passthrough import fold_settings
    from bonsai_launch.server.passthrough import parse as parse_passthrough

    if request.binary is None:
        raise BonsaiError("no llama-server to tune with", "run `bonsai build` or set BONSAI_LLAMA_SERVER")
    selection = select({**request.flags, "speculative": None})
    files = model_files(selection, request.model, request.drafter)
    if not files.model.is_file():
        raise BonsaiError(
            f"model file {files.model} is not present",
            f"run `bonsai pull --profile {selection.profile.name}` or pass --model PATH",
        )
    unusable: dict[str, str] = {}
    drafter_type = block = None
    drafter_path = files.drafter if files.drafter is not None and files.drafter.is_file() else None
    if files.drafter is not None and drafter_path is None:
        unusable["drafter"] = f"{files.drafter.name} is not downloaded"
    elif files.drafter_unavailable:
        unusable["drafter"] = files.drafter_unavailable
    target = inspect_gguf(files.model)
    mtp = "model" if has_usable_mtp(target) else None
    drafter_info = None
    if drafter_path is not None:
        drafter = drafter_info = inspect_gguf(drafter_path)
        problems = check_pair(target, drafter)
        if drafter.drafter is None and drafter.nextn_layers:  # an MTP file: draft-mtp runs it
            mtp_problems = mtp_pair_problems(target, drafter)
            if mtp_problems:
                unusable["draft-mtp"] = "the MTP file does not fit the target: " + "; ".join(mtp_problems)
            else:
                mtp = "file"
        elif problems or drafter.drafter is None:
            unusable["drafter"] = "does not fit the target: " + "; ".join(problems or ["not a drafter"])
        else:
            drafter_type = "draft-dspark" if drafter.drafter.kind == "dspark" else "draft-dflash"
            block = drafter.drafter.block_size
    caps = probe(request.binary)
    own = not explicit_model(selection, request.model) or selection.names_model  # the profile's model, or named by it
    profile_type = selection.profile.draft_free_type if own else None
    on_cpu = head_on_cpu(caps.backend, gpu_layers(selection.settings.get("ngl"), caps.backend), target.layers)
    found = cands.all_candidates(
        caps.spec_types or None,
        drafter_type,
        block,
        profile_type,
        mtp,
        caps.shared_drafting,
        replayable,
        mtp_head_cut=draft_head.mtp_head_is_cut(target, on_cpu),
        drafter_head_cut=drafter_type is not None and draft_head.drafter_head_is_cut(target, drafter_info, on_cpu),
    )
    if configs:
        found = cands.restrict(found, configs)
    args = parse_passthrough(request.passthrough, option_table(caps))
    key = TuneKey(
        machine_id(),
        build_id(request.binary),
        file_sha256(files.model),
        file_sha256(drafter_path) if drafter_path else None,
        prompts_sha256(prompts),
        server_conditions(fold_settings(selection.settings, args), args),
    )
    profile = selection.profile.name if own else None
    return Subject(profile, files.model, drafter_path, key, tuple(found), unusable)


def plan_candidates(
    request: TuneRequest, found: tuple[cands.Candidate, ...]
) -> tuple[list[ConfigSpec], dict[str, str]]:
    """A launch plan per candidate, all with one context size (the largest any asks for), as
    the bench plans its configurations. A candidate the plan refuses is skipped with why."""
    from bonsai_launch.server.inputs import gather_plan

    def build(ctx: int | None) -> tuple[list[ConfigSpec], dict[str, str]]:
        specs, refused = [], {}
        for cand in found:
            flags = {**request.flags, **cand.flags(), "port": 8080}  # the port is replaced per server
            if ctx is not None:
                flags["ctx"] = ctx
            try:
                plan = gather_plan(
                    flags,
                    request.model,
                    request.drafter if cand.drafter_file else None,
                    request.passthrough,
                    request.binary,
                    repack=True,
                )
            except BonsaiError as exc:
                if cand.spec_type is None:
                    raise
                refused[cand.name] = str(exc).split("\n")[0]
                continue
            spec_type = plan.speculative.spec_type if plan.speculative else None
            spec = ConfigSpec(cand.name, cand.spec_type is None, spec_type, flags, plan=plan)
            specs.append(spec)
        return specs, refused

    specs, refused = build(request.flags.get("ctx") or None)
    ctxs = {s.plan.ctx for s in specs}
    if len(ctxs) > 1:
        specs, refused = build(max(ctxs))
    return specs, refused


def decision_from_bench(
    doc: dict[str, Any],
    flags: dict[str, Any],
    model: str | None,
    drafter: str | None,
    binary: Path,
    prompts: list[suite.Prompt],
    prompts_name: str,
    passthrough: tuple[str, ...] = (),
) -> Decision:
    """`bonsai bench --save`: the same rule over a bench run, stored for the same key a tune
    run of that model, drafter and server arguments would use (the prompt set is the bench's)."""
    if doc.get("mode") != "launch":
        raise BonsaiError("--save needs a bench that launched its own servers", "leave out --url")
    if len(doc["options"]["temps"]) and doc["options"]["repeats"] < 3:
        raise BonsaiError(
            f"--save needs at least 3 repeats (this run: {doc['options']['repeats']})", "use --repeats 3 or more"
        )
    request = TuneRequest(flags, model, drafter, passthrough, binary)
    subj = subject(request, prompts)
    choice, table = decide(doc)
    return measured_decision(
        subj,
        doc,
        choice,
        table,
        "bench",
        prompts_name,
        len(prompts),
        {
            "duration_s": doc.get("duration_s"),
            "temperatures": doc["options"]["temps"],
            "repeats": doc["options"]["repeats"],
            "max_tokens": doc["options"]["max_tokens"],
            "notes": list(doc.get("notes") or ()),
        },
    )


def measured_decision(
    subj: Subject,
    doc: dict[str, Any],
    choice,
    table: list[dict[str, Any]],
    source: str,
    prompts_name: str,
    n_prompts: int,
    evidence: dict[str, Any],
) -> Decision:
    """One Decision for tune and `bench --save`: the subject's key and files, the rule and the
    noise rule it was judged by, and what each source adds as evidence."""
    return Decision(
        key=subj.key,
        choice=choice,
        table=tuple(table),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        source=source,
        model=str(subj.model.resolve()),
        profile=subj.profile,
        drafter=str(subj.drafter.resolve()) if subj.drafter else None,
        prompts=prompts_name,
        evidence={
            "prompts": n_prompts,
            "rule": RULE,
            "noise_rule": doc["definitions"]["noise_rule"],
            **evidence,
        },
    )


def with_report(decision: Decision, report_path: str | None) -> Decision:
    return dataclasses.replace(decision, evidence={**decision.evidence, "report": report_path})
